"""Two exports of one model, A against B, loaded in one process and called in alternation on Lite: a prompt
call and greedy decode steps after it, medians, and whether both gave the same greedy tokens. Alternating
within one process keeps the machine's drift (other tenants, memory bandwidth) out of the ratio, which
separate runs a minute apart do not. The kernels' thread setting is the process's: before each side's calls it is
set as that export's own process would have it (mslite_backend.kernel_threads).

    .venv/bin/python tools/ab_exports.py A_DIR B_DIR --rows 1 --prompts 12 --steps 16
"""
import os
import statistics
import sys
import time

import click
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_prompt(session, rows: int, active: int, ids: np.ndarray, steps: int):
    """One prompt of ids on `active` rows, then `steps` greedy steps: (prompt ms, step ms list, row 0's tokens)."""
    counts = np.array([ids.shape[1]] * active + [0] * (rows - active), np.int32)
    start = time.perf_counter()
    logits = session.step(ids, counts, np.zeros(rows, np.int32))
    prompt_ms = (time.perf_counter() - start) * 1e3
    ones, past = (counts > 0).astype(np.int32), counts.copy()
    step_ms, tokens = [], []
    for _ in range(steps):
        nxt = logits.argmax(-1).astype(np.int32).reshape(-1, 1)
        tokens.append(int(nxt[0, 0]))
        start = time.perf_counter()
        logits = session.step(nxt, ones, past)
        step_ms.append((time.perf_counter() - start) * 1e3)
        past = past + ones
    return prompt_ms, step_ms, tokens


@click.command(help=__doc__.split("\n\n")[0])
@click.argument("a_dir")
@click.argument("b_dir")
@click.option("--rows", default=1, show_default=True, help="rows taking each prompt (at most the exports' batch)")
@click.option("--prompts", default=12, show_default=True)
@click.option("--steps", default=16, show_default=True, help="greedy steps after each prompt")
@click.option("--threads", default=2, show_default=True)
def main(a_dir, b_dir, rows, prompts, steps, threads):
    from lite_runtime.backends import lite_kernels, load_session
    from lite_runtime.contract.manifest import load_manifest
    manifests = [load_manifest(d) for d in (a_dir, b_dir)]
    batch = manifests[0].batch_size
    if manifests[1].batch_size != batch or not 1 <= rows <= batch:
        raise click.UsageError(f"--rows {rows}: both exports need the same batch_size, and rows 1..{batch}")
    sessions = [load_session("mslite", m, num_threads=threads) for m in manifests]
    vocab = int(manifests[0].model_config.get("vocab_size", 1000))
    rng = np.random.default_rng(0)
    prompt_ms, step_ms, tokens = ([[], []] for _ in range(3))
    for i in range(prompts):
        ids = rng.integers(0, vocab, (batch, 26 + i % 6)).astype(np.int32)
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            if lite_kernels.loaded():
                lite_kernels.set_threads(threads if manifests[side].quantization.get("head_on_kernel") else 0)
            p, s, t = run_prompt(sessions[side], batch, rows, ids, steps)
            prompt_ms[side].append(p)
            step_ms[side] += s
            tokens[side].append(t)
    same = sum(a == b for a, b in zip(*tokens))
    click.echo(f"{rows} row(s), {prompts} prompts of 26-31 ids, {steps} steps each; greedy tokens equal on "
               f"{same}/{prompts} prompts")
    for side, folder in enumerate((a_dir, b_dir)):
        click.echo(f"{'AB'[side]} {folder}: prompt call {statistics.median(prompt_ms[side]):.1f} ms, decode step "
                   f"{statistics.median(step_ms[side]):.2f} ms")
    click.echo(f"A / B: prompt call {statistics.median(prompt_ms[0]) / statistics.median(prompt_ms[1]):.3f}x, "
               f"decode step {statistics.median(step_ms[0]) / statistics.median(step_ms[1]):.3f}x")


if __name__ == "__main__":
    main()
