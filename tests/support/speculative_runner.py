"""python tests/support/speculative_runner.py BACKEND EXPORT PROMPTS_JSON STEPS: the same prompts (token ids, one
batch) through the engine without and with speculative decoding; prints a JSON object of the new tokens
and the guesses proposed / accepted of each run.

Runs: `plain` and `ngram` (greedy), `oracle` (greedy; guesses taken from the plain run's answer with
every third guess wrong, so that accepted and rejected guesses both occur whatever the model), and
`sampled_plain` / `sampled_ngram` (temperature 0.8, top_p 0.9, a seed per prompt). On Lite this
runs in a process without mindspore.

With a fifth argument DRAFT (an export), the guesses come from that draft model instead (decode/draft.py):
runs `plain`, `draft` (with `draft_stats`), `fresh_stats` (the same draft computing every guess from the
whole text, forgetting its cache: what the draft must guess), `sampled_plain` and `sampled_draft`."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from lite_runtime.backends import load_session  # noqa: E402
from lite_runtime.contract.manifest import load_manifest  # noqa: E402
from lite_runtime.decode.draft import DraftModel  # noqa: E402
from lite_runtime.decode.engine import Engine, EngineRequest  # noqa: E402
from lite_runtime.decode.sampling import SamplingParams  # noqa: E402
from lite_runtime.decode.speculation import DraftSpec, Speculation  # noqa: E402


class Oracle(Speculation):
    """Guesses the known answer's next tokens, every third one wrong (a stand-in for a good proposer)."""

    def __init__(self, prompts, answers):
        super().__init__(k=4)
        object.__setattr__(self, "texts", [list(p) + list(a) for p, a in zip(prompts, answers)])

    def propose(self, tokens, limit):
        limit = min(self.k, limit)
        for text in self.texts:
            if text[:len(tokens)] == list(tokens):
                guess = text[len(tokens):len(tokens) + limit]
                return [t if (len(tokens) + j) % 3 else t + 1 for j, t in enumerate(guess)]
        return []


class Fresh(DraftModel):
    """A draft model that forgets its cache before each guess, so that it feeds every row's whole text."""

    def guess(self, rows):
        self.held = [[] for _ in self.held]
        return super().guess(rows)


def run(session, prompts, steps, speculation=None, sampling=None):
    engine = Engine(session, threaded=False, speculation=speculation)
    out = [[] for _ in prompts]
    for i, prompt in enumerate(prompts):
        params = SamplingParams(do_sample=True, temperature=0.8, top_p=0.9, seed=7 + i) if sampling else SamplingParams()
        engine.submit(EngineRequest(list(prompt), steps, params, on_token=lambda t, lp, i=i: out[i].append(t)))
    engine.run_until_idle()
    return out, [engine.speculated.proposed, engine.speculated.accepted]


if __name__ == "__main__":
    backend, export, prompts_json, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with open(prompts_json) as f:
        prompts = json.load(f)
    manifest = load_manifest(export)
    session = load_session(backend, manifest)
    result = {"plain": run(session, prompts, steps)[0]}
    if len(sys.argv) > 5:
        draft = DraftModel.load(DraftSpec(sys.argv[5], k=4), manifest, backend, num_threads=2)
        result["draft"], result["draft_stats"] = run(session, prompts, steps, draft)
        _, result["fresh_stats"] = run(session, prompts, steps, Fresh(draft.session, k=4))
        result["sampled_plain"], _ = run(session, prompts, steps, sampling=True)
        result["sampled_draft"], result["sampled_stats"] = run(session, prompts, steps, draft, sampling=True)
    else:
        result["ngram"], result["ngram_stats"] = run(session, prompts, steps, Speculation(k=4))
        result["oracle"], result["oracle_stats"] = run(session, prompts, steps, Oracle(prompts, result["plain"]))
        result["sampled_plain"], _ = run(session, prompts, steps, sampling=True)
        result["sampled_ngram"], result["sampled_stats"] = run(session, prompts, steps, Speculation(k=4),
                                                               sampling=True)
    assert backend != "mslite" or "mindspore" not in sys.modules
    print(json.dumps(result))
