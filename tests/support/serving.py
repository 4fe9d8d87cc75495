"""The OpenAI-compatible server as the serving tests reach it: the demo prompts, an export served in a
process of its own, the `openai` client, pipeline()'s greedy answers (a fixture) and a client that
leaves mid-stream."""
import contextlib
import json

import pytest

from support.tiny_models import REPO

PROMPTS = ["An increasing sequence: one,", "Counting: seven, eight,", "The alphabet: a, b,"]


@contextlib.contextmanager
def served(export: str, backend: str, name: str = "demo"):
    """`export` served in a process of its own; yields (base url, pid); stopped by SIGTERM (exit 0)."""
    if backend == "mslite":
        from support.lite_process import ensure_lite_installed
        ensure_lite_installed()
    from served_process import served as serve_process
    with serve_process(export, backend, name, cwd=REPO) as server:
        yield server.url, server.pid


def client(url):
    from openai import OpenAI
    return OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def pipeline_texts(demo_exports):
    """The greedy continuations of PROMPTS by pipeline() on `ms` (prompt removed)."""
    from lite_runtime import pipeline
    pipe = pipeline("text_generation", model=demo_exports["ms"], backend="ms")
    answers = pipe(PROMPTS, max_new_tokens=10, add_special_tokens=True)
    return [a["text_generation_text"][0][len(p):] for a, p in zip(answers, PROMPTS)]


def disconnect_mid_stream(url):
    import http.client
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": "demo", "prompt": PROMPTS[0], "max_tokens": 60,
                                                        "stream": True}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    response.readline()           # the first event
    conn.close()
    return "gone", None
