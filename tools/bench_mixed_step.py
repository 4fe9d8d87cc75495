"""A prompt joining rows that decode: one packed step in one graph call against two.

    .venv/bin/python tools/bench_mixed_step.py --model_dir DIR [--past 200] [--prompt 8 32 128 200]

The export's first B-1 rows hold `--past` cached positions and feed one token each; the last row feeds a
prompt of `--prompt` tokens from position 0 (continuous batching: a request admitted while others
decode). The step runs as one call (every token gathers its row's cache over all the call's positions)
and as two (the prompt row given the cache cut to its own past: `PackedKVCache._split`), in interleaved
rounds on `mslite`; it checks both give the same logits and prints their median times and which one
the runtime picks by itself.
"""
from __future__ import annotations

import os
import sys
import time

import click
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402
from lite_runtime.contract.errors import ToolchainError  # noqa: E402

ONE_CALL, SPLIT = 1 << 62, 1


@click.command(context_settings=CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--model_dir", required=True, help="a packed export folder")
@click.option("--past", type=int, default=200, show_default=True, help="cached positions of the decoding rows")
@click.option("--prompt", "prompts", type=int, multiple=True, default=(8, 32, 128, 200), show_default=True,
              help="the joining prompt's lengths (repeat the option)")
@click.option("--rounds", type=int, default=5, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
def command(model_dir, past, prompts, rounds, threads):
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    manifest = load_manifest(model_dir)
    if max(past + 1, max(prompts)) > manifest.seq_length:
        raise ToolchainError(f"--past {past} or --prompt {max(prompts)}: past the export's seq_length "
                             f"{manifest.seq_length}")
    session = load_session("mslite", manifest, num_threads=threads)
    cache, batch = session.cache, manifest.batch_size
    ids = np.random.default_rng(0).integers(3, manifest.vocab_size, size=(batch, max(past + 1, max(prompts))),
                                            dtype=np.int64).astype(np.int32)
    filled = np.array([past] * (batch - 1) + [0], np.int32)

    def timed(prompt: int, bound: int):
        cache.reset()
        for start in range(0, past, 64):
            session.step(ids[:, start:start + 64], np.clip(filled - start, 0, 64).astype(np.int32),
                         np.minimum(filled, start).astype(np.int32))
        counts = np.array([1] * (batch - 1) + [prompt], np.int32)
        picks = "two" if cache._split(counts.astype(np.int64), filled) is not None else "one"
        keep, cache.split_positions = cache.split_positions, bound
        start = time.perf_counter()
        logits = np.array(session.step(ids[:, :prompt], counts, filled))
        seconds = time.perf_counter() - start
        cache.split_positions = keep
        return seconds, logits, picks

    print(f"{batch - 1} rows decoding at position {past}, a prompt joining them; split from "
          f"{cache.split_positions} token x positions not read")
    print(f"{'prompt':>6} {'one call ms':>12} {'two calls ms':>13} {'ratio':>6} {'max |diff|':>11} runtime picks")
    for prompt in prompts:
        times = {ONE_CALL: [], SPLIT: []}
        for _ in range(rounds):
            for bound in (ONE_CALL, SPLIT):
                seconds, logits, picks = timed(prompt, bound)
                times[bound].append(seconds)
                if bound == ONE_CALL:
                    reference = logits
                else:
                    diff = float(np.abs(logits - reference).max())
        one, two = (float(np.median(times[b])) * 1000 for b in (ONE_CALL, SPLIT))
        print(f"{prompt:>6} {one:>12.1f} {two:>13.1f} {two / one:>6.2f} {diff:>11.1e} {picks}", flush=True)
        if diff > 1e-3 * max(1.0, float(np.abs(reference).max())):
            raise ToolchainError(f"prompt {prompt}: the two calls' logits differ from one call's by {diff}")
    session.close()


main = entry_point(command, "python tools/bench_mixed_step.py")


if __name__ == "__main__":
    sys.exit(main())
