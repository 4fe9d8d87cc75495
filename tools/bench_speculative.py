"""Speculative decoding (prompt lookup, and a draft model with --draft), measured: chats answered one at a
time (batch 1) by the engine with and without guesses, side by side, the answers checked equal.

    python tools/bench_speculative.py --model_dir output/smollm2 [--k 4] [--max_tokens 128] [--rounds 2]
                                      [--draft DIR]

Two workloads through the export's chat template, greedy, stopping at the model's end of turn: `quote`
(the answer repeats or edits code given in the question: prompt lookup's case) and `free` (questions
whose answers quote nothing: guesses mostly fail, and must not cost much). Rounds alternate the sides:
`plain`, `ngram:K` and, with --draft DIR (an export with the same tokenizer, loaded once), `draft`.
Printed per workload and side: generated tokens, tokens per second, steps; then each guessing side's
ratio to plain and acceptance rate (accepted / proposed guesses).
"""
from __future__ import annotations

import os
import sys
import time

import click

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402
from lite_runtime.contract.errors import ToolchainError  # noqa: E402
from lite_runtime.tokenizers import export_tokenizer  # noqa: E402

CODE = '''def merge_sorted(left, right):
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i])
            i += 1
        else:
            result.append(right[j])
            j += 1
    result.extend(left[i:])
    result.extend(right[j:])
    return result
'''
QUOTE = [f"Repeat this code exactly, in a code block:\n{CODE}",
         f"Rename the function to merge_lists and give the whole code:\n{CODE}",
         f"Add a docstring to this function and give the whole code:\n{CODE}"]
FREE = ["Write a short story about a fox who learns to paint.",
        "Explain why the sky is blue to a ten-year-old.",
        "Give five tips for a first job interview."]


def answer(engine, prompt, max_tokens, stop_ids):
    from lite_runtime.decode.engine import EngineRequest
    got = []
    engine.submit(EngineRequest(prompt, max_tokens, stop_ids=stop_ids, on_token=lambda t, lp: got.append(t)))
    engine.run_until_idle()
    return got


@click.command(context_settings=CONTEXT)
@click.option("--model_dir", required=True)
@click.option("--k", type=click.IntRange(1, 16), default=4, show_default=True)
@click.option("--max_tokens", type=click.IntRange(1, None), default=128, show_default=True)
@click.option("--rounds", type=click.IntRange(1, None), default=2, show_default=True)
@click.option("--num_threads", type=click.IntRange(1, None), default=2, show_default=True)
@click.option("--draft", default=None, metavar="DIR", help="Also a third side: guesses by this draft export.")
def command(model_dir, k, max_tokens, rounds, num_threads, draft):
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.engine import Engine
    from lite_runtime.decode.draft import DraftModel
    from lite_runtime.decode.speculation import Speculation
    from lite_runtime.tokenizers.chat_format import ChatFormat

    manifest = load_manifest(model_dir)
    tokenizer = export_tokenizer(manifest)
    if tokenizer is None:
        raise ToolchainError(f"{model_dir} has no tokenizer; the benchmark's chats need one")
    chat = ChatFormat(manifest.family, model_dir, tokenizer)
    stop_ids = frozenset(manifest.eos_token_id)
    session = load_session("mslite", manifest, num_threads=num_threads)
    sides = {"plain": None, f"ngram:{k}": Speculation(k=k)}
    if draft:
        spec = Speculation.parse(f"draft:{draft}:{k}", "--draft", drafts=True)
        sides["draft"] = DraftModel.load(spec, manifest, "mslite", num_threads)
    print(f"{model_dir}: batch 1, {max_tokens} tokens at most, {rounds} round(s), {session.runtime}")
    for workload, questions in (("quote", QUOTE), ("free", FREE)):
        prompts = [chat.encode([{"role": "user", "content": q}]) for q in questions]
        totals = {side: [0, 0.0, 0] for side in sides}
        texts, guessed = {}, {side: [0, 0] for side, speculation in sides.items() if speculation}
        for _ in range(rounds):
            for side, speculation in sides.items():
                engine = Engine(session, threaded=False, speculation=speculation)
                start = time.perf_counter()
                texts[side] = [answer(engine, p, max_tokens, stop_ids) for p in prompts]
                totals[side][1] += time.perf_counter() - start
                totals[side][0] += sum(map(len, texts[side]))
                totals[side][2] += engine.steps
                if speculation:
                    guessed[side][0] += engine.speculated.proposed
                    guessed[side][1] += engine.speculated.accepted
        for side in guessed:
            if texts[side] != texts["plain"]:
                raise ToolchainError(f"{workload}: the answers of {side} differ from the plain ones")
        rate = {side: tokens / seconds for side, (tokens, seconds, _) in totals.items()}
        for side, (tokens, seconds, steps) in totals.items():
            print(f"  {workload:5s} {side:8s} {tokens:5d} tokens {rate[side]:6.1f} tok/s {steps:5d} steps")
        for side, (proposed, accepted) in guessed.items():
            print(f"  {workload:5s} {side:8s} ratio {rate[side] / rate['plain']:.2f}x, accepted {accepted} of "
                  f"{proposed} guesses ({accepted / max(proposed, 1):.0%}); answers equal")


main = entry_point(command, "tools/bench_speculative.py")

if __name__ == "__main__":
    sys.exit(main())
