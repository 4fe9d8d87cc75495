"""Raw HTTP for the server tests where the official clients would hide what is sent or answered (not named
http.py: the scripts run from this folder would import it in place of the standard library's)."""
import json
import urllib.error
import urllib.request


def post_json(url, body=None, method="POST", timeout=60):
    """(status, JSON answer) of a request to `url`: `body` as JSON, or as it is when bytes (a malformed body)."""
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
