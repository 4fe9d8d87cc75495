"""A server stopped while it answers (SIGTERM, as Ctrl-C): it stops accepting, lets running requests
finish within --shutdown_timeout, then ends every answer still open with the finish reason `abort`
(a stream's last chunk, then [DONE]; a whole answer as usual), logs no traceback and exits 0. And the
first line it logs. A real server process on the demo export for `ms` (its steps slower than Lite's).
The demo's context of 128 tokens makes an answer of a second at most: the test of answers cut short
stops with --shutdown_timeout 0, the test of answers that end within the timeout drains them."""
import http.client
import json
import re
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from served_process import served
from support.tiny_models import REPO

PROMPT = "An increasing sequence: one,"
LONG = {"model": "demo", "prompt": PROMPT, "max_tokens": 120, "temperature": 0, "ignore_eos": True}


def _open(url: str, path: str, body: dict) -> http.client.HTTPResponse:
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn.getresponse()


def _events(response: http.client.HTTPResponse):
    """A server-sent event stream's data, as they arrive (OpenAI's `data: `, TGI's `data:`)."""
    while True:
        line = response.readline()
        if not line:
            return
        if line.startswith(b"data:"):
            yield line[5:].strip().decode()


def _in_thread(call):
    """`call()` in a thread; the returned function waits for its result (or raises its exception)."""
    pool = ThreadPoolExecutor(1)
    future = pool.submit(call)
    pool.shutdown(wait=False)
    return lambda: future.result(timeout=60)


def _whole(url: str, body: dict):
    response = _open(url, "/v1/completions", body)
    return response.status, json.loads(response.read())


def _health(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())


def _wait_for(url: str, running: int, waiting: int = 0) -> None:
    deadline = time.time() + 30
    while (_health(url)["running"], _health(url)["waiting"]) != (running, waiting):
        assert time.time() < deadline, _health(url)
        time.sleep(0.01)


def _exited(server, log_path) -> str:
    """The log of the server (sent SIGTERM), once it has exited 0 within 15 s, without a traceback."""
    assert server.proc.wait(timeout=15) == 0
    log = log_path.read_text()
    for sign in ("Traceback", "Exception in ASGI application", "graceful shutdown exceeded"):
        assert sign not in log, log
    return log


def _chunks(events: list) -> list:
    assert events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def test_answers_the_timeout_cuts_end_with_abort_then_done(demo_exports, tmp_path):
    """Four requests hold the 4 cache rows (a stream of two choices, a TGI stream, a whole answer), and a
    chat stream and a TGI stream wait for one, when SIGTERM comes with --shutdown_timeout 0: each gets its
    end (TGI's stream without a token to carry it: TGI's error event)."""
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log, served(demo_exports["ms"], "ms", "demo", cwd=REPO, output=log,
                                            extra=["--shutdown_timeout", "0"]) as server:
        url = server.url
        stream = _events(_open(url, "/v1/completions", dict(LONG, n=2, stream=True)))
        streamed = [next(stream)]
        tgi = _events(_open(url, "/generate_stream", {"inputs": "Z", "parameters": {"max_new_tokens": 100,
                                                                                    "details": True}}))
        tgi_events = [next(tgi)]
        whole = _in_thread(lambda: _whole(url, LONG))
        _wait_for(url, running=4)
        chat = _events(_open(url, "/v1/chat/completions", {
            "model": "demo", "messages": [{"role": "user", "content": "Counting:"}], "max_tokens": 50,
            "stream": True}))
        tgi_waiting = _events(_open(url, "/generate_stream", {"inputs": "Z"}))
        _wait_for(url, running=4, waiting=2)
        server.proc.send_signal(signal.SIGTERM)
        streamed += list(stream)
        tgi_events += list(tgi)
        chat_events = list(chat)
        tgi_waited = list(tgi_waiting)
        status, answer = whole()
        log_text = _exited(server, log_path)
    assert "prefix cache off, speculation off" in log_text.splitlines()[0], log_text

    chunks = _chunks(streamed)
    ends = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"] is not None]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-2]] == [None] * (len(chunks) - 2)
    assert sorted(e["index"] for e in ends) == [0, 1] and {e["finish_reason"] for e in ends} == {"abort"}, ends
    assert 2 <= chunks[-1]["usage"]["completion_tokens"] < 2 * LONG["max_tokens"]

    last = json.loads(tgi_events[-1])
    assert last["details"]["finish_reason"] == "abort" and last["generated_text"], last
    assert len(tgi_events) == last["details"]["generated_tokens"] < 100

    assert status == 200 and answer["choices"][0]["finish_reason"] == "abort", answer
    assert 0 < answer["usage"]["completion_tokens"] < LONG["max_tokens"]

    waited = _chunks(chat_events)       # the role, then its end: it never had a row
    assert [c["choices"][0]["delta"] for c in waited] == [{"role": "assistant", "content": ""}, {}]
    assert waited[-1]["choices"][0]["finish_reason"] == "abort"
    assert [json.loads(e)["error_type"] for e in tgi_waited] == ["incomplete_generation"], tgi_waited


def test_answers_that_end_within_the_timeout_keep_their_finish_reason(demo_exports, tmp_path):
    """With --shutdown_timeout 30, a stream and a whole answer running at SIGTERM get all their tokens,
    and the server exits when they end, not at the timeout."""
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log, served(demo_exports["ms"], "ms", "demo", cwd=REPO, output=log,
                                            extra=["--shutdown_timeout", "30"]) as server:
        url = server.url
        stream = _events(_open(url, "/v1/completions", dict(LONG, n=2, stream=True)))
        streamed = [next(stream)]
        whole = _in_thread(lambda: _whole(url, LONG))
        _wait_for(url, running=3)
        server.proc.send_signal(signal.SIGTERM)
        streamed += list(stream)
        status, answer = whole()
        _exited(server, log_path)
    chunks = _chunks(streamed)
    assert [c["choices"][0]["finish_reason"] for c in chunks[-2:]] == ["length", "length"]
    assert chunks[-1]["usage"]["completion_tokens"] == 2 * 120 and len(chunks) == 2 * 120 + 2
    assert status == 200 and answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 120
    # its last words: the engine's steps (each of the 120 tokens took one)
    steps = re.search(r"lite_runtime.serve: engine: (\d+) steps in [\d.]+ s, of which the graph calls [\d.]+ s: "
                      r"the host's share", log_path.read_text())
    assert steps and int(steps.group(1)) >= 120, log_path.read_text()[-2000:]


def test_the_first_log_line_says_whether_prefix_caching_and_speculation_are_on(demo_exports, tmp_path):
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log, served(demo_exports["ms"], "ms", "demo", cwd=REPO, output=log,
                                            extra=["--prefix_cache_gb", "0.5", "--speculative", "ngram"]) as server:
        server.proc.send_signal(signal.SIGTERM)
        _exited(server, log_path)
    first = log_path.read_text().splitlines()[0]
    assert first.startswith("lite_runtime.serve: serving demo (llama, 4 cache rows, ") and \
        "prefix cache 0.5 GiB, speculation ngram:4) on http://" in first, first
