"""Side-by-side benchmark against the peers: `make peers` (or `.venv/bin/python tools/compare_peers.py`).

One random Llama (the benchmark sizes: hidden 256, 4 layers, 4 heads, ffn 1024, vocab 32000, fp32,
untied) is made as a Hugging Face folder and run by every runtime from that folder:
  - mslite: this project's export for `target: cpu` (MindSpore 2.0, the packed step graph, Lite's .ms, the
    project's kernels) on real Lite 2.0 (mslite_matmul: the same with Lite's MatMul, `weights: none`);
  - ort: ONNX Runtime GenAI (its model builder, fp32, CPU);
  - openvino: OpenVINO GenAI (a stateful f32 IR, f32 KV cache);
  - transformers: Hugging Face `generate` on torch (the tokens reference).
Workload: 32-token prompts, 128 greedy new tokens (EOS ignored), batch 1 and 8, 2 threads. Rounds
are interleaved (each round runs every runtime once per batch, in a rotated order), and each timed
child process starts when the machine is idle. Every runtime's tokens must equal the transformers
tokens; a runtime that differs is reported and left out of the ratios. The figures that count are
the same-round ratios mslite / peer (median over rounds): absolute times differ between machines.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Dict, List, Optional

import click
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_decode import BENCH_MODELS, BENCH_SEQ_LENGTH, REPO, VENV_MS20_PYTHON, VENV_PYTHON  # noqa: E402
from bench_measure import bench_prompts  # noqa: E402
from lite_runtime.contract.command_line import CONTEXT, SpacedList, entry_point  # noqa: E402
from lite_runtime.contract.errors import ToolchainError  # noqa: E402
from lite_runtime.contract.manifest import FORMAT_VERSION  # noqa: E402

PEERS_PYTHON = os.path.join(REPO, ".venv-peers", "bin", "python")
PEER_TOOL = os.path.join(REPO, "tools", "peer_runtimes.py")
DEFAULT_WORK_DIR = os.path.join(REPO, "build", "peers")
OURS = ("mslite", "mslite_matmul", "mslite_io")   # the project's forms (see above) and the static io pair
# each form's export keys; mslite is what `target: cpu` writes (the packed step, as segments above 2 GiB of
# weights; float32 weights on the project's kernels), what tools/bench_serve.py serves
EXPORTS = {"mslite": dict(target="cpu"),
           "mslite_matmul": dict(target="cpu", quantization={"weights": "none"}),   # Lite's own MatMul
           "mslite_io": dict(kv_cache="io", lite_ms=False)}
PEERS = ("ort", "openvino", "transformers")
REFERENCE = "transformers"
METRICS = (("step", "step med ms"), ("ttft", "TTFT ms"), ("rss", "peak RSS MB"))


def _run(cmd: List[str], what: str, timeout: int = 1800) -> None:
    env = dict(os.environ, PYTHONPATH=REPO, GLOG_v="3")
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise ToolchainError(f"{what} failed ({' '.join(cmd[:4])} ...):\n{result.stderr[-3000:]}")


def prepare(work_dir: str, batches: List[int], runtimes: List[str], threads: int, rebuild: bool, log,
            shape: Optional[dict] = None, hf_dir: Optional[str] = None) -> Dict[tuple, str]:
    """Build (or reuse) the HF folder of the Llama of `shape` (default: the benchmark model), or take
    `hf_dir` (a real model's), and each runtime's model; returns {(runtime, batch): model dir}."""
    sizes = dict(shape or BENCH_MODELS["llama"], seq_length=BENCH_SEQ_LENGTH)
    hf = os.path.abspath(hf_dir) if hf_dir else os.path.join(work_dir, "hf")
    stamp = os.path.join(work_dir, "recipe.json")
    recipe = dict(sizes=sizes, threads=threads, weights="normal(0, 0.02) seed 0, layer matrices x4",
                  export_format=FORMAT_VERSION)
    if hf_dir:
        recipe = dict(hf_dir=hf, threads=threads, export_format=FORMAT_VERSION)
    same = os.path.isfile(stamp) and json.load(open(stamp, encoding="utf-8")) == recipe
    if rebuild or not same:
        import shutil
        shutil.rmtree(work_dir, ignore_errors=True)
        os.makedirs(work_dir)
        if not hf_dir:
            log(f"making the random Llama in {hf}")
            _run([PEERS_PYTHON, PEER_TOOL, "model", hf, json.dumps(sizes)], "making the model")
        with open(stamp, "w", encoding="utf-8") as f:
            json.dump(recipe, f)
    out = {}
    for runtime in runtimes:
        for batch in batches:
            if runtime in PEERS:   # one model serves every batch size
                folder = hf if runtime == "transformers" else os.path.join(work_dir, runtime)
            else:
                folder = os.path.join(work_dir, f"{runtime}_b{batch}")
            out[(runtime, batch)] = folder
            if os.path.isdir(folder):
                continue
            log(f"building {runtime} model {folder}")
            if runtime in ("ort", "openvino"):
                extra = [str(threads)] if runtime == "ort" else []
                _run([PEERS_PYTHON, PEER_TOOL, runtime, hf, folder] + extra, f"building the {runtime} model")
            else:
                _export_ours(hf, folder, batch, EXPORTS[runtime])
    return out


def _export_ours(hf: str, folder: str, batch: int, keys: dict) -> None:
    import yaml

    config = {"model": {"hf_dir": hf}, "seq_length": BENCH_SEQ_LENGTH, "batch_size": batch, "output_dir": folder,
              **keys}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(config, f)
    try:
        _run([VENV_MS20_PYTHON, "-m", "exporter", "--config", f.name], f"exporting {folder}")
    finally:
        os.unlink(f.name)


def busy_fraction(seconds: float = 0.5) -> float:
    def sample():
        with open("/proc/stat", encoding="ascii") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return sum(values), values[3] + values[4]     # total, idle + iowait
    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_until_idle(limit: float, timeout: float) -> float:
    """Wait (up to `timeout` s) until the CPUs are less than `limit` busy; returns the last reading."""
    deadline = time.monotonic() + timeout
    busy = busy_fraction()
    while busy > limit and time.monotonic() < deadline:
        busy = busy_fraction()
    return busy


def measure(runtime: str, folder: str, prompts, args) -> dict:
    common = dict(model_dir=folder, prompts=prompts, new_tokens=args.steps, warmup=1, threads=args.threads)
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        job_file, out_file = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        if runtime in PEERS:
            job = dict(common, runtime=runtime)
            cmd = [PEERS_PYTHON, PEER_TOOL, "measure", job_file, out_file]
        else:
            job = dict(common, backend="mslite", batch=len(prompts), prompt_len=len(prompts[0]), no_detok=True,
                       lite_format="auto", world_size=1)
            cmd = [VENV_PYTHON, os.path.join(REPO, "tools", "benchmark.py"), "--child", job_file, out_file]
        with open(job_file, "w", encoding="utf-8") as f:
            json.dump(job, f)
        _run(cmd, f"measuring {runtime} on {folder}", timeout=args.timeout)
        with open(out_file, encoding="utf-8") as f:
            r = json.load(f)
    return dict(runtime=runtime, batch=len(prompts), step=r["step_ms"]["median"], ttft=r["ttft_ms"],
                rss=r["peak_rss_mb"], load_s=r["load_s"], steps=r["decode_steps"], tokens=r["tokens"])


def summarise(results: List[dict], ours: str = "mslite") -> dict:
    """Medians per (runtime, batch), the tokens check, and the same-round ratios ours / peer."""
    by_key: Dict[tuple, List[dict]] = {}
    for r in results:
        by_key.setdefault((r["runtime"], r["batch"]), []).append(r)
    reference = {b: rs[0]["tokens"] for (rt, b), rs in by_key.items() if rt == REFERENCE}
    rows = {}
    for (rt, b), rs in sorted(by_key.items()):
        ref = reference.get(b)
        same = ref is None or all(r["tokens"] == ref for r in rs)
        rows[(rt, b)] = dict({m: float(np.median([r[m] for r in rs])) for m, _ in METRICS},
                             load_s=float(np.median([r["load_s"] for r in rs])), rounds=len(rs), same_tokens=same)
    ratios = {}
    for (rt, b), row in rows.items():
        if rt == ours or (ours, b) not in rows or not row["same_tokens"] or not rows[(ours, b)]["same_tokens"]:
            continue
        mine = {r["round"]: r for r in by_key[(ours, b)]}
        per_round = [{m: mine[r["round"]][m] / r[m] for m, _ in METRICS} for r in by_key[(rt, b)]
                     if r["round"] in mine]
        ratios[(rt, b)] = {m: float(np.median([x[m] for x in per_round])) for m, _ in METRICS}
    return dict(rows=rows, ratios=ratios)


def format_report(summary: dict, ours: str = "mslite") -> str:
    lines = ["runtime       batch  " + "  ".join(f"{h:>12}" for _, h in METRICS) + "    load s  tokens"]
    for (rt, b), row in summary["rows"].items():
        lines.append(f"{rt:<13} {b:>5}  " + "  ".join(f"{row[m]:>12.2f}" for m, _ in METRICS)
                     + f"  {row['load_s']:>8.2f}  " + ("same" if row["same_tokens"] else f"DIFFER from {REFERENCE}"))
    lines += ["", f"same-round ratios, {ours} / peer (median over rounds; < 1 means {ours} is faster or smaller):",
              "peer          batch  " + "  ".join(f"{h:>12}" for _, h in METRICS)]
    for (rt, b), ratio in summary["ratios"].items():
        lines.append(f"{rt:<13} {b:>5}  " + "  ".join(f"{ratio[m]:>11.2f}x" for m, _ in METRICS))
    return "\n".join(lines)


@click.command(context_settings=CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--runtime", cls=SpacedList, type=click.Choice(OURS + PEERS),
              default=["mslite", "ort", "openvino", "transformers"], show_default=True,
              help="runtimes to run (mslite_io: the static prefill + increment export, for comparison)")
@click.option("--batch", cls=SpacedList, type=int, default=[1, 8], show_default=True)
@click.option("--rounds", type=int, default=5, show_default=True)
@click.option("--steps", type=int, default=128, show_default=True, help="new tokens per row")
@click.option("--prompt_len", type=int, default=32, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--idle", type=float, default=0.15, show_default=True,
              help="start a timed run when the CPUs are less busy than this")
@click.option("--idle_timeout", type=float, default=60.0, show_default=True,
              help="seconds to wait for an idle machine before a run")
@click.option("--hf_dir", default=None, help="a real model's Hugging Face folder instead of the random Llama (e.g. "
              "SmolLM2-135M-Instruct's float32 folder that tools/bench_serve.py --gguf makes); prompts stay random ids")
@click.option("--work_dir", default=None, help=f"[default: {DEFAULT_WORK_DIR}, or beside it _<the --hf_dir's name>]")
@click.option("--rebuild", is_flag=True, help="remake the model and every runtime's files")
@click.option("--timeout", type=int, default=900, show_default=True, help="seconds per measuring child process")
@click.option("--json", "json_path", default=None, help="also write every round's results to this file")
def command(**options):
    args = SimpleNamespace(**options)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)   # noqa: E731
    if not os.path.isfile(PEERS_PYTHON):
        raise ToolchainError(f"{PEERS_PYTHON} is missing: run `make peers` (it installs the peer runtimes)")
    if args.prompt_len + args.steps > BENCH_SEQ_LENGTH:
        raise ToolchainError(f"--prompt_len {args.prompt_len} + --steps {args.steps} exceeds the "
                             f"export's seq_length {BENCH_SEQ_LENGTH}")
    vocab = BENCH_MODELS["llama"]["vocab_size"]
    if args.hf_dir:
        with open(os.path.join(args.hf_dir, "config.json"), encoding="utf-8") as f:
            vocab = json.load(f)["vocab_size"]
    work_dir = args.work_dir or DEFAULT_WORK_DIR
    if args.hf_dir and not args.work_dir:
        name = os.path.basename(os.path.normpath(args.hf_dir))
        if name == "hf":
            name = os.path.basename(os.path.dirname(os.path.abspath(args.hf_dir)))
        work_dir += "_" + name.replace("peers_", "")
    models = prepare(work_dir, args.batch, args.runtime, args.threads, args.rebuild, log, hf_dir=args.hf_dir)
    results = []
    for round_ in range(args.rounds):
        order = args.runtime[round_ % len(args.runtime):] + args.runtime[:round_ % len(args.runtime)]
        for batch in args.batch:
            prompts = bench_prompts(batch, args.prompt_len, vocab)
            for runtime in order:
                busy = wait_until_idle(args.idle, args.idle_timeout)
                r = measure(runtime, models[(runtime, batch)], prompts, args)
                results.append(dict(r, round=round_, busy_before=busy))
                log(f"round {round_ + 1}/{args.rounds} batch {batch} {runtime}: step {r['step']:.2f} ms, "
                    f"TTFT {r['ttft']:.1f} ms, RSS {r['rss']:.0f} MB (CPUs {busy:.0%} busy before)")
    summary = summarise(results)
    print(format_report(summary))
    print(f"workload: {args.prompt_len}-token prompts, {args.steps} greedy new tokens (EOS ignored), "
          f"{args.threads} threads, {args.rounds} interleaved rounds; medians over rounds")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(results, f)
    return 0 if all(row["same_tokens"] for row in summary["rows"].values()) else 1


main = entry_point(command, "python tools/compare_peers.py")


if __name__ == "__main__":
    sys.exit(main())
