"""python tests/support/prefix_cache_runner.py EXPORT: test_prefix_cache's comparison on real Lite, in a process
without mindspore; prints (plain, cached). The comparison itself (`compare`) is shared with test_prefix_cache."""
import sys

from lite_runtime.tokenizers import export_tokenizer

SHARED = "An increasing sequence: one, two, three, four, five, six, seven, eight, nine, ten, one, two, three,"
PROMPTS = [SHARED + " four, five,", SHARED + " Counting: seven, eight,", SHARED + " four, five,"]


def run_each_alone(engine, prompts, tokens=8):
    """Each prompt alone, one after the other: (new tokens, cached prompt tokens) per prompt."""
    from lite_runtime.decode.engine import EngineRequest
    out = []
    for prompt in prompts:
        got, ended = [], []
        request = EngineRequest(prompt, tokens, on_token=lambda t, lp: got.append(t), on_finish=ended.append)
        engine.submit(request)
        engine.run_until_idle()
        assert ended == ["length"], ended
        out.append((got, request.cached_tokens))
    return out


def run_together(engine, prompts, tokens=8):
    """The prompts submitted at once: (new tokens, cached prompt tokens) per prompt."""
    from lite_runtime.decode.engine import EngineRequest
    got, requests = [[] for _ in prompts], []
    for i, prompt in enumerate(prompts):
        requests.append(EngineRequest(prompt, tokens, on_token=lambda t, lp, i=i: got[i].append(t)))
        engine.submit(requests[-1])
    engine.run_until_idle()
    return [(g, r.cached_tokens) for g, r in zip(got, requests)]


def prompt_ids(export):
    from lite_runtime.contract.manifest import load_manifest
    tokenizer = export_tokenizer(load_manifest(export))
    return [tokenizer.encode(p, add_special_tokens=True) for p in PROMPTS]


def compare(export, backend="ms"):
    """(tokens, cached) of PROMPTS without and with the prefix cache, and with it, submitted together."""
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.engine import Engine
    ids = prompt_ids(export)
    session = load_session(backend, load_manifest(export))
    plain = run_each_alone(Engine(session, threaded=False), ids)
    cached = run_each_alone(Engine(session, threaded=False, prefix_cache_bytes=64 << 20), ids)
    together = run_together(Engine(session, threaded=False, prefix_cache_bytes=64 << 20), ids)
    session.close()
    return plain, cached, together


if __name__ == "__main__":
    result = compare(sys.argv[1], "mslite")
    assert "mindspore" not in sys.modules
    print(repr(result))
