"""python tests/support/long_prompt_runner.py BACKEND EXPORT PROMPTS_JSON STEPS [KEY=VALUE ...] (session options,
e.g. kv_cache_dtype=float16): each prompt (token ids) greedy
through the engine as a user's request meets it, printing one JSON object of the new tokens per prompt:
`alone` (the engine's only request: its prompt is fed whole, in one step), `beside` (admitted while another
request decodes: its prompt goes in chunks of the engine's prefill_chunk beside that row) and `neighbour` (the
tokens of that other request, a short prompt of its own, which must not change). EOS does not stop a
request. On Lite this runs in a process without mindspore."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from lite_runtime.backends import load_session  # noqa: E402
from lite_runtime.contract.manifest import load_manifest  # noqa: E402
from lite_runtime.decode.engine import Engine, EngineRequest  # noqa: E402


def request(prompt, steps, out):
    return EngineRequest(list(prompt), steps, on_token=lambda token, logprobs: out.append(token))


def alone(engine, prompt, steps):
    out = []
    engine.submit(request(prompt, steps, out))
    engine.run_until_idle()
    return out


def beside(engine, prompt, neighbour_prompt, steps):
    """The long prompt submitted after the neighbour's first steps, the neighbour running until it has ended."""
    mine, theirs = [], []
    chunks = -(-len(prompt) // engine.scheduler.prefill_chunk)
    engine.submit(request(neighbour_prompt, chunks + steps + 4, theirs))
    for _ in range(2):
        engine.step()
    engine.submit(request(prompt, steps, mine))
    engine.run_until_idle()
    return mine, theirs


if __name__ == "__main__":
    backend, export, prompts_file, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    options = dict(arg.split("=", 1) for arg in sys.argv[5:])
    with open(prompts_file) as f:
        prompts = json.load(f)
    session = load_session(backend, load_manifest(export), num_threads=2, **options)
    engine = Engine(session, threaded=False)
    neighbour_prompt = prompts[0][:24]
    result = {"alone": [alone(engine, p, steps) for p in prompts], "beside": [], "neighbour": []}
    for p in prompts:
        mine, theirs = beside(engine, p, neighbour_prompt, steps)
        result["beside"].append(mine)
        result["neighbour"].append(theirs)
    session.close()
    assert backend != "mslite" or "mindspore" not in sys.modules
    print(json.dumps(result))
