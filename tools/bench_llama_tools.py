"""Our decode beside llama.cpp's own benchmarks, llama-bench and llama-batched-bench, which `make llama-server`
builds for this machine's instruction sets:

    .venv/bin/python tools/bench_llama_tools.py [--gguf build/models/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--type Q8_0] [--depths 32 2048 8192] [--rows 1 8 32] [--rounds 2]

One sequence (llama-bench `-n N -d D`, its "tg N @ dD"): decode ms/token after a context of D tokens. Ours:
tools/bench_quant.py's measuring child, one D-token prompt cut from docs/*.md, then N greedy tokens, the
median step. Many sequences (llama-batched-bench `-npp P -ntg N -npl B`): B sequences of P-token prompts
decoding N tokens each, its S_TG (decode tokens/s of all sequences together) against ours at B rows.

The same GGUF on both sides: llama.cpp at --type (the file itself, or a copy requantized by llama.cpp's own
quantizer), ours exported from it with the matching `quantization` (Q8_0: weights, head and embedding int8;
F32: float32) on the paged store of `target: cpu` (float16 K/V, as llama.cpp's default F16 cache), the
exports kept in --work_dir (tools/bench_quant.py's names: its exports are reused). Both sides on --threads
threads, run in turn, round after round; the table gives each side's median over the rounds and the ratio.
llama.cpp's tools feed random tokens (a step costs the same whatever the tokens): this tool checks no
tokens; tools/bench_quant.py checks ours against transformers and llama.cpp's Python binding on the same
prompts.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import click

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import DEFAULT_SEQ, REPO, export, llama_file, measure, prompts  # noqa: E402

BIN = os.path.join(REPO, "build", "llama-server", "bin")
SCHEMES = {"Q8_0": "int8+head+embedding+paged", "F32": "float32+paged", "Q4_0": "int4+head+embedding+paged"}


def run_json_lines(command: list) -> list:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise click.ClickException(f"{os.path.basename(command[0])} failed: {result.stderr.strip()[-800:]}")
    text = result.stdout.strip()
    return json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines()
                                                          if line.startswith("{")]


def llama_bench_ms(gguf: str, depth: int, new_tokens: int, threads: int) -> float:
    """llama-bench's decode ms/token of `new_tokens` after `depth` tokens (its mean over its own 5 repetitions)."""
    [row] = run_json_lines([os.path.join(BIN, "llama-bench"), "-m", gguf, "-t", str(threads), "-p", "0",
                            "-n", str(new_tokens), "-d", str(depth), "-o", "json"])
    return 1e3 / row["avg_ts"]


def llama_batched_tok_s(gguf: str, rows: int, prompt: int, new_tokens: int, threads: int) -> float:
    """llama-batched-bench's S_TG: decode tokens/s of `rows` sequences together."""
    [row] = run_json_lines([os.path.join(BIN, "llama-batched-bench"), "-m", gguf, "-t", str(threads),
                            "-tb", str(threads), "-c", str(rows * (prompt + new_tokens)), "-npp", str(prompt),
                            "-ntg", str(new_tokens), "-npl", str(rows), "--output-format", "jsonl"])
    return row["speed_tg"]


def ratio_table(head: list, rows: list) -> str:
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in [head] + rows)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--gguf", default=os.path.join(REPO, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
              show_default=True)
@click.option("--type", "ftype", type=click.Choice(sorted(SCHEMES)), default="Q8_0", show_default=True,
              help="llama.cpp's weight type; ours the matching quantization")
@click.option("--work_dir", default=os.path.join(REPO, "build", "bench_llama_tools"), show_default=True)
@click.option("--depths", type=int, multiple=True, default=(32, 2048), show_default=True,
              help="one sequence's context before decoding (repeat the option)")
@click.option("--rows", type=int, multiple=True, default=(1, 8, 32), show_default=True,
              help="sequences decoding together (repeat the option)")
@click.option("--prompt", type=click.IntRange(1), default=128, show_default=True,
              help="each sequence's prompt with --rows")
@click.option("--new_tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=2, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True)
def main(gguf, ftype, work_dir, depths, rows, prompt, new_tokens, rounds, threads):
    for tool in ("llama-bench", "llama-batched-bench"):
        if not os.access(os.path.join(BIN, tool), os.X_OK):
            raise click.ClickException(f"{os.path.join(BIN, tool)} is missing: build it with `make llama-server`")
    if not os.path.isfile(gguf):
        raise click.BadParameter(f"{gguf!r} is not a file", param_hint="--gguf")
    os.makedirs(work_dir, exist_ok=True)
    needed = max(max(depths, default=0), prompt) + new_tokens
    seq = max(DEFAULT_SEQ, -(-needed // 256) * 256)
    ours = export(gguf, work_dir, SCHEMES[ftype], 32, max(rows, default=1), seq)
    theirs = llama_file(gguf, work_dir, ftype)
    files = prompts(ours, sorted(set(depths) | {prompt}), work_dir)
    times = {}      # (kind, size, side) -> [per round]
    for round_ in range(rounds):
        for depth in depths:
            times.setdefault(("depth", depth, "ours"), []).append(
                measure(ours, files[depth], 1, new_tokens, threads)["step_ms"])
            times.setdefault(("depth", depth, "llama"), []).append(llama_bench_ms(theirs, depth, new_tokens,
                                                                                   threads))
        for batch in rows:
            step = measure(ours, files[prompt], batch, new_tokens, threads)["step_ms"]
            times.setdefault(("rows", batch, "ours"), []).append(batch * 1e3 / step)
            times.setdefault(("rows", batch, "llama"), []).append(llama_batched_tok_s(theirs, batch, prompt,
                                                                                        new_tokens, threads))
        print(f"round {round_ + 1} of {rounds} done", file=sys.stderr)
    median = {key: statistics.median(values) for key, values in times.items()}
    one = [[depth, f"{median['depth', depth, 'ours']:.2f}", f"{median['depth', depth, 'llama']:.2f}",
            f"{median['depth', depth, 'ours'] / median['depth', depth, 'llama']:.2f}x"] for depth in depths]
    many = [[batch, f"{median['rows', batch, 'ours']:.1f}", f"{median['rows', batch, 'llama']:.1f}",
             f"{median['rows', batch, 'ours'] / median['rows', batch, 'llama']:.2f}x"] for batch in rows]
    print(f"{os.path.basename(gguf)}: ours {SCHEMES[ftype]} against llama.cpp {ftype}, {threads} threads, "
          f"{new_tokens} new tokens, median of {rounds} rounds")
    print(ratio_table(["depth", "ours ms/token", "llama-bench ms/token", "ours / theirs"], one))
    print(ratio_table(["rows", "ours decode tok/s", "llama-batched-bench S_TG", "ours / theirs"], many))


if __name__ == "__main__":
    main()
