"""Real-size models: `make bench-scale` (or `.venv/bin/python tools/bench_scale.py --shape 1b`).

One random Hugging Face Llama of a named real shape (`1b`: TinyLlama-1.1B's, fp32, safetensors in
2 GB shards, a 32000-piece sentencepiece tokenizer; made in the peers venv, one copy of the weights
in memory) is cached under --work_dir and run from that folder by
  - mslite_cpu:    this project's export as `target: cpu` writes it (the packed step on the project's
                   kernels, float32; at this size one rank's segments, each a .ms);
  - mslite:        the export with Lite's own MatMul (MindSpore 2.0, kv_cache packed, lite_ms): .ms + .msw;
  - mslite_mindir: the same export's MindIR + external data (rank_0_variables/) on Lite;
  - mslite_io:     the static io export (prefill + increment MindIR) on Lite;
  - mslite_io_ms:  the static io export converted to .ms (lite_ms) on Lite (not by default);
  - mslite_segments: the step as one rank's segments (`parallel.collectives: host`), one .ms per group
                   of whole layers (each far below Lite's 2 GB limit; what `target: cpu` writes at this
                   size) on Lite (not by default);
  - ms:            a MindSpore 2.10 export (kv_cache packed) on backend ms (not by default);
  - ort, openvino: ONNX Runtime GenAI (its model builder, fp32) and OpenVINO GenAI (stateful f32 IR),
                   built from the same folder (tools/peer_runtimes.py);
  - transformers:  generate() on torch (not by default: slow at this size).
Each build, export and measurement runs alone in a child process of its own, its wall time and peak
RSS (`os.wait4`: the child and the descendants it waited for) recorded, the whole process group
killed when it passes --rss_limit_gb or the machine runs short of memory. A measurement loads the
model and runs one warm greedy request (32-token prompts, --steps new tokens, EOS ignored) at each
batch; every runtime's tokens are compared with the reference runtime's and mismatches reported.
The table also gives the weights' size, peak RSS / weights, and a bandwidth floor for a decode step:
the bytes of weights one step reads (all but the embedding table) over the read bandwidth of a numpy
sum of a 2 GiB array. Our exports are 2x (io, .ms: two graphs or two formats) the weights on disk
each: they are deleted after their measurements unless --keep_exports.

Compare ratios within one run: the machines are shared and noisy.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Dict, List, Optional

import click
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_decode import REPO, VENV_MS20_PYTHON, VENV_PYTHON, _align  # noqa: E402
from bench_export import EXPORTER_SECONDS, _folder_mb, timed_process  # noqa: E402
from bench_measure import bench_prompts  # noqa: E402
from compare_peers import PEER_TOOL, PEERS_PYTHON, wait_until_idle  # noqa: E402
from lite_runtime.contract.command_line import CONTEXT, SpacedList, entry_point  # noqa: E402
from lite_runtime.contract.errors import ToolchainError  # noqa: E402
from lite_runtime.contract.manifest import FORMAT_VERSION  # noqa: E402

COMMON = dict(vocab_size=32000, norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=2, pad_token_id=0)
SHAPES = {
    "tiny": dict(COMMON, hidden_size=256, num_layers=4, n_heads=4, n_kv_heads=2, intermediate_size=1024),  # the tool's check
    "160m": dict(COMMON, hidden_size=768, num_layers=12, n_heads=12, n_kv_heads=12, intermediate_size=3072),  # llama-160m
    "1b": dict(COMMON, hidden_size=2048, num_layers=22, n_heads=32, n_kv_heads=4, intermediate_size=5632),  # TinyLlama-1.1B
    "3b": dict(COMMON, hidden_size=3200, num_layers=26, n_heads=32, n_kv_heads=32, intermediate_size=8640),  # OpenLLaMA-3B
    "7b": dict(COMMON, hidden_size=4096, num_layers=32, n_heads=32, n_kv_heads=32, intermediate_size=11008),  # Llama-2-7B
}
# Peak RSS / fp32 weights measured at 1b (2 cores, Lite 2.0): Lite's load of a MindIR with external data
# (the worst step; the io form's two graphs were killed at 20.1 GB, 4.9x), the export with lite_ms, the .ms
# load (the io form's two: 4.1x), the peers' builds; one rank's segments: their export (1.39x; their load 1.15x).
RSS_MULTIPLE = {"mslite_mindir": 3.9, "mslite_io": 5.0, "mslite_io_ms": 4.1, "mslite": 3.4, "ms": 2.4, "ort": 1.3, "openvino": 2.0,
                "transformers": 1.1, "mslite_segments": 1.4, "mslite_cpu": 1.4}
OURS = ("mslite_cpu", "mslite", "mslite_mindir", "mslite_io", "mslite_io_ms", "mslite_segments", "ms")
PEERS = ("ort", "openvino", "transformers")
# Our forms -> (export kind, backend, lite_format); forms of one kind share its export.
FORMS = {"mslite_cpu": ("lite_cpu", "mslite", "ms"), "mslite": ("lite_packed", "mslite", "ms"), "mslite_mindir": ("lite_packed", "mslite", "mindir"),
         "mslite_io": ("lite_io", "mslite", "mindir"), "mslite_io_ms": ("lite_io_ms", "mslite", "ms"),
         "mslite_segments": ("lite_segments", "mslite", "ms"), "ms": ("ms_packed", "ms", None)}
EXPORTS = {"lite_cpu": (VENV_MS20_PYTHON, dict(target="cpu")),
           "lite_packed": (VENV_MS20_PYTHON, dict(kv_cache="packed", lite_ms=True)),
           "lite_io": (VENV_MS20_PYTHON, dict(kv_cache="io")),
           "lite_io_ms": (VENV_MS20_PYTHON, dict(kv_cache="io", lite_ms=True)),
           "lite_segments": (VENV_MS20_PYTHON, dict(kv_cache="packed", lite_ms=True, parallel=dict(collectives="host"))),
           "ms_packed": (VENV_PYTHON, dict(kv_cache="packed"))}
GB = 2 ** 30


def weight_counts(shape: dict) -> Dict[str, int]:
    """Parameter counts: all, and the embedding table (a decode step reads only its rows)."""
    h, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = shape["n_kv_heads"] * h // shape["n_heads"]
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    return dict(total=2 * v * h + shape["num_layers"] * layer + h, embed=v * h)


def read_bandwidth(threads: int, gib: float = 2.0, repeats: int = 3) -> Dict[str, float]:
    """Bytes per second numpy reads a `gib` GiB float32 array at: a sum (one thread) and, faster (SIMD),
    a max in 1 and in `threads` threads (each over its part; numpy releases the GIL); best of `repeats`."""
    import threading

    a = np.ones(int(gib * GB) // 4, dtype=np.float32)

    def timed(reduce, parts):
        chunks = np.array_split(a, parts)
        workers = [threading.Thread(target=reduce, args=(c,)) for c in chunks]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - start

    out = {"sum, 1 thread": gib * GB / min(timed(np.add.reduce, 1) for _ in range(repeats))}
    for parts in sorted({1, threads}):
        out[f"max, {parts} thread{'s' if parts > 1 else ''}"] = gib * GB / min(
            timed(np.maximum.reduce, parts) for _ in range(repeats))
    del a
    return out


def check_memory(args, shape: dict, runtimes: List[str]) -> Dict[str, str]:
    """The runtimes whose measured memory multiple puts them above --rss_limit_gb at this shape, with
    the reason (they are skipped); a shape where `mslite` itself (or every runtime asked for) is above
    it is refused."""
    weights = 4 * weight_counts(shape)["total"] / GB
    over = {r: weights * RSS_MULTIPLE[r] for r in runtimes if weights * RSS_MULTIPLE[r] > args.rss_limit_gb}
    reasons = {r: f"skipped: needs about {n:.1f} GiB ({RSS_MULTIPLE[r]}x the weights, measured at 1b), above "
                  f"--rss_limit_gb {args.rss_limit_gb:g}" for r, n in over.items()}
    if "mslite" in over or (over and len(over) == len(runtimes)):
        worst = "mslite" if "mslite" in over else max(over, key=over.get)
        raise ToolchainError(
            f"shape {args.shape}: {weights:.1f} GiB of fp32 weights; {worst} would need about {over[worst]:.0f} GiB "
            f"({RSS_MULTIPLE[worst]}x the weights, measured at 1b), above --rss_limit_gb {args.rss_limit_gb:g}: "
            f"refused (run it on a machine with more memory and raise --rss_limit_gb)")
    return reasons


def _cpu_jiffies():
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat", encoding="ascii") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


class Runner:
    """Child processes one at a time, under the memory watchdog, logs kept in the work folder."""

    def __init__(self, args, log):
        self.args, self.log = args, log
        self.logs = os.path.join(args.work_dir, "logs")
        os.makedirs(self.logs, exist_ok=True)

    def run(self, cmd: List[str], name: str, extra_env: Optional[dict] = None) -> dict:
        env = dict(os.environ, PYTHONPATH=REPO, GLOG_v="3", **(extra_env or {}))
        busy = wait_until_idle(self.args.idle, self.args.idle_timeout)
        before = _cpu_jiffies()
        r = timed_process(cmd, os.path.join(self.logs, name + ".log"), self.args.timeout, env,
                          rss_limit_mb=self.args.rss_limit_gb * 1024, min_available_mb=self.args.min_available_gb * 1024)
        after = _cpu_jiffies()
        # The share of the machine's CPU time that others used while the child ran (its own CPU time out).
        ticks = os.sysconf("SC_CLK_TCK")
        r["others_cpu"] = max(0.0, ((after[0] - before[0]) / ticks - r["cpu_s"]) / max((after[1] - before[1]) / ticks, 1e-9))
        r["busy_before"] = busy
        if r["returncode"] != 0 and "error" not in r:
            lines = [ln for ln in r["log"].strip().splitlines() if ln.strip()]
            r["error"] = lines[-1] if lines else f"exit code {r['returncode']}"
        return r

    def built(self, name: str, cmd: List[str], folder: str) -> dict:
        """Build `folder` with `cmd` unless a record of a successful build exists; the build's figures."""
        record = os.path.join(self.args.work_dir, f"{name}.build.json")
        if os.path.isdir(folder) and os.path.isfile(record) and not self.args.rebuild:
            with open(record, encoding="utf-8") as f:
                return dict(json.load(f), cached=True)
        shutil.rmtree(folder, ignore_errors=True)
        self.log(f"building {name}: {' '.join(cmd[:3])} ...")
        r = self.run(cmd, "build_" + name)
        out = dict(wall_s=r["wall_s"], peak_rss_mb=r["peak_rss_mb"])
        if "error" in r:
            shutil.rmtree(folder, ignore_errors=True)
            return dict(out, error=r["error"], log=r["log"][-3000:])
        found = EXPORTER_SECONDS.search(r["log"])
        out.update(inner_s=float(found.group(1)) if found else None, disk_mb=_folder_mb(folder))
        with open(record, "w", encoding="utf-8") as f:
            json.dump(out, f)
        self.log(f"  {name}: {out['wall_s']:.0f} s, peak RSS {out['peak_rss_mb'] / 1024:.1f} GB, "
                 f"{out['disk_mb'] / 1024:.1f} GB on disk")
        return out

    def measure(self, runtime: str, folder: str, prompts, name: str) -> dict:
        a = self.args
        common = dict(model_dir=folder, prompts=prompts, new_tokens=a.steps, warmup=1, threads=a.threads)
        with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
            job_file, out_file = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
            if runtime in PEERS:
                job, cmd = dict(common, runtime=runtime), [PEERS_PYTHON, PEER_TOOL, "measure", job_file, out_file]
            else:
                _, backend, lite_format = FORMS[runtime]
                job = dict(common, backend=backend, batch=len(prompts), prompt_len=len(prompts[0]), no_detok=True,
                           lite_format=lite_format or "auto", world_size=1)
                cmd = [VENV_PYTHON, os.path.join(REPO, "tools", "benchmark.py"), "--child", job_file, out_file]
            with open(job_file, "w", encoding="utf-8") as f:
                json.dump(job, f)
            # the builds' writes flushed first: a 4.4 GB export still being written back slowed the step
            # measured after it 1.4x (mslite_cpu at 1.1B: 85.8-90.9 ms a step, 62.5 once written)
            os.sync()
            self.log(f"measuring {runtime} batch {len(prompts)}")
            r = self.run(cmd, name, dict(kv.split("=", 1) for kv in a.env))
            if "error" in r or not os.path.isfile(out_file):
                self.log(f"  failed: {r.get('error')}")
                return dict(error=r.get("error", "no result"), log=r["log"][-3000:], child_rss_mb=r["peak_rss_mb"],
                            wall_s=r["wall_s"])
            with open(out_file, encoding="utf-8") as f:
                m = json.load(f)
        step = m["step_ms"]["median"]
        out = dict(load_s=m["load_s"], ttft_ms=m["ttft_ms"], step_ms=step, tok_s=len(prompts) * 1e3 / step,
                   steps=m["decode_steps"], tokens=m["tokens"], child_rss_mb=r["peak_rss_mb"], wall_s=r["wall_s"],
                   others_cpu=r["others_cpu"])
        self.log(f"  load {out['load_s']:.1f} s, peak RSS {out['child_rss_mb'] / 1024:.1f} GB, TTFT "
                 f"{out['ttft_ms']:.0f} ms, step {step:.1f} ms")
        return out


def make_hf(runner: Runner, args, shape: dict) -> dict:
    hf = os.path.join(args.work_dir, "hf")
    sizes = dict(shape, seq_length=args.seq_length, tokenizer="sentencepiece", max_shard_size="2GB")
    recipe = os.path.join(args.work_dir, "recipe.json")
    wanted = dict(sizes=sizes, weights="normal(0, 0.02) seed 0, layer matrices x4", export_format=FORMAT_VERSION)
    if not (os.path.isfile(recipe) and json.load(open(recipe, encoding="utf-8")) == wanted):
        for name in os.listdir(args.work_dir):     # another recipe: everything built from it goes
            if name not in ("logs",):
                path = os.path.join(args.work_dir, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    build = runner.built("hf", [PEERS_PYTHON, PEER_TOOL, "model", hf, json.dumps(sizes)], hf)
    if "error" not in build:
        with open(recipe, "w", encoding="utf-8") as f:
            json.dump(wanted, f)
    return build


def export_command(args, kind: str, batch: int, hf: str, folder: str) -> List[str]:
    import yaml

    python, options = EXPORTS[kind]
    config = dict(model=dict(hf_dir=hf), seq_length=args.seq_length, batch_size=batch, output_dir=folder, **options)
    path = folder + ".yaml"
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f)
    return [python, "-m", "exporter", "--config", path]


def compare_tokens(tokens, reference) -> str:
    """'same', or where the first row that differs leaves the reference's tokens."""
    for row, (mine, ref) in enumerate(zip(tokens, reference)):
        n = min(len(mine), len(ref))
        if mine[:n] != ref[:n]:
            step = next(i for i in range(n) if mine[i] != ref[i])
            rows = sum(m[:n] != r[:n] for m, r in zip(tokens, reference))
            return f"DIFFER: {rows}/{len(tokens)} rows, row {row} from token {step}"
    return "same"


def run(args, log) -> List[dict]:
    shape = SHAPES[args.shape]
    skipped = check_memory(args, shape, args.runtime)
    runtimes = [r for r in args.runtime if r not in skipped]
    for r in runtimes:
        if r in PEERS and not os.path.isfile(PEERS_PYTHON):
            raise ToolchainError(f"{PEERS_PYTHON} is missing: `make bench-scale` installs the peer runtimes")
    if args.prompt_len + args.steps > args.seq_length:
        raise ToolchainError(f"--prompt_len {args.prompt_len} + --steps {args.steps} exceeds --seq_length {args.seq_length}")
    os.makedirs(args.work_dir, exist_ok=True)
    runner = Runner(args, log)
    hf_build = make_hf(runner, args, shape)
    if "error" in hf_build:
        raise ToolchainError(f"making the Hugging Face model failed: {hf_build['error']}\n{hf_build['log']}")
    hf = os.path.join(args.work_dir, "hf")
    rows, peer_builds, out_of_memory = [], {}, {}
    for runtime in [r for r in runtimes if r in ("ort", "openvino")]:
        folder = os.path.join(args.work_dir, runtime)
        extra = [str(args.threads)] if runtime == "ort" else []
        peer_builds[runtime] = runner.built(runtime, [PEERS_PYTHON, PEER_TOOL, runtime, hf, folder] + extra, folder)
    for batch in args.batch:
        prompts = bench_prompts(batch, args.prompt_len, shape["vocab_size"])
        for runtime in [r for r in runtimes if r in PEERS]:
            build = peer_builds.get(runtime, dict(wall_s=None, peak_rss_mb=None))
            row = dict(runtime=runtime, batch=batch, build=build)
            if "error" in build:
                row["error"] = f"build failed: {build['error']}"
            else:
                folder = hf if runtime == "transformers" else os.path.join(args.work_dir, runtime)
                row.update(runner.measure(runtime, folder, prompts, f"measure_{runtime}_b{batch}"))
            rows.append(row)
        for kind in dict.fromkeys(FORMS[r][0] for r in runtimes if r in OURS):
            forms = [r for r in runtimes if r in OURS and FORMS[r][0] == kind]
            for runtime in [r for r in forms if r in out_of_memory]:   # a larger batch needs no less memory
                rows.append(dict(runtime=runtime, batch=batch, build={},
                                 error=f"skipped: killed for memory at batch {out_of_memory[runtime]}"))
            forms = [r for r in forms if r not in out_of_memory]
            if not forms:
                continue
            folder = os.path.join(args.work_dir, f"{kind}_b{batch}")
            build = runner.built(f"{kind}_b{batch}", export_command(args, kind, batch, hf, folder), folder)
            for runtime in forms:
                row = dict(runtime=runtime, batch=batch, build=build)
                if "error" in build:
                    row["error"] = f"export failed: {build['error']}"
                else:
                    row.update(runner.measure(runtime, folder, prompts, f"measure_{runtime}_b{batch}"))
                    if row.get("error", "").startswith("killed at"):
                        out_of_memory[runtime] = batch
                rows.append(row)
            if not args.keep_exports:
                shutil.rmtree(folder, ignore_errors=True)
                if os.path.isfile(folder + ".build.json"):     # the build record goes with the export
                    os.unlink(folder + ".build.json")
    rows += [dict(runtime=r, batch=b, build={}, error=reason) for r, reason in skipped.items() for b in args.batch]
    for row in rows:
        row["hf_build"] = hf_build
    return rows


def format_report(rows: List[dict], shape: dict, args, bandwidths: Dict[str, float]) -> str:
    counts = weight_counts(shape)
    kernel = max(bandwidths, key=bandwidths.get)
    bandwidth = bandwidths[kernel]
    weights_gb = 4 * counts["total"] / GB
    step_bytes = 4 * (counts["total"] - counts["embed"])
    floor_ms = step_bytes / bandwidth * 1e3
    by_batch = {}
    for r in rows:
        by_batch.setdefault(r["batch"], []).append(r)
    for batch, rs in by_batch.items():
        ok = [r for r in rs if "tokens" in r]
        ref = next((r for name in [args.reference] + list(args.runtime) for r in ok if r["runtime"] == name), None)
        for r in ok:
            r["check"] = "reference" if r is ref else compare_tokens(r["tokens"], ref["tokens"])
    head = ["runtime", "batch", "build s", "build RSS GB", "load s", "peak RSS GB", "RSS/weights", "TTFT ms",
            "step med ms", "tok/s", "step/floor", "others CPU", "tokens"]
    table = []
    for r in rows:
        b = r["build"]
        build = [f"{b['wall_s']:.0f}" if b.get("wall_s") else "-",
                 f"{b['peak_rss_mb'] / 1024:.1f}" if b.get("peak_rss_mb") else "-"]
        if "error" in r:
            table.append([r["runtime"], str(r["batch"])] + build + [f"error: {r['error']}"])
            continue
        rss = r["child_rss_mb"] / 1024
        table.append([r["runtime"], str(r["batch"])] + build + [
            f"{r['load_s']:.1f}", f"{rss:.2f}", f"{rss / weights_gb:.2f}x", f"{r['ttft_ms']:.0f}",
            f"{r['step_ms']:.1f}", f"{r['tok_s']:.1f}", f"{r['step_ms'] / floor_ms:.2f}x",
            f"{100 * r['others_cpu']:.0f}%" if "others_cpu" in r else "-", r["check"]])
    hf = rows[0]["hf_build"] if rows else {}
    lines = [f"shape {args.shape}: hidden {shape['hidden_size']}, {shape['num_layers']} layers, {shape['n_heads']} heads "
             f"({shape['n_kv_heads']} KV), ffn {shape['intermediate_size']}, vocab {shape['vocab_size']}: "
             f"{counts['total'] / 1e9:.2f} B parameters, {weights_gb:.2f} GiB fp32"
             + (f"; HF folder made in {hf['wall_s']:.0f} s, peak RSS {hf['peak_rss_mb'] / 1024:.1f} GB" if hf else ""),
             _align(head, table),
             f"build: the runtime's own conversion from the HF folder (ours: the export, which the forms of one export "
             f"share; .ms conversion included), in a child process; peak RSS GB: the measuring child (load + request); "
             f"tok/s: batch / step median; others CPU: the share of the machine's CPU time other processes used while "
             f"the measuring child ran (above 0: its times are inflated)",
             f"bandwidth floor of a decode step: {step_bytes / GB:.2f} GiB of weights read (all but the embedding) at "
             f"{bandwidth / GB:.1f} GiB/s (numpy {kernel} over 2 GiB, the fastest of "
             + ", ".join(f"{k} {v / GB:.1f}" for k, v in bandwidths.items())
             + f" GiB/s) = {floor_ms:.0f} ms; step/floor below 1: numpy reads slower than the runtime does",
             f"workload: {args.prompt_len}-token random prompts, {args.steps} greedy new tokens (EOS ignored), "
             f"{args.threads} threads, seq_length {args.seq_length}; tokens compared with {args.reference}"]
    ours = [r for r in rows if r["runtime"] in ("mslite_cpu", "mslite") and "error" not in r]
    ratio_lines = []
    for mine in ours:
        for r in rows:
            if r["runtime"] in ("ort", "openvino") and r["batch"] == mine["batch"] and "error" not in r:
                ratio_lines.append(
                    f"{mine['runtime']} / {r['runtime']} batch {r['batch']}: step {mine['step_ms'] / r['step_ms']:.2f}x, "
                    f"TTFT {mine['ttft_ms'] / r['ttft_ms']:.2f}x, peak RSS {mine['child_rss_mb'] / r['child_rss_mb']:.2f}x, "
                    f"load {mine['load_s'] / r['load_s']:.2f}x"
                    + (f", build {mine['build']['wall_s'] / r['build']['wall_s']:.2f}x time "
                       f"{mine['build']['peak_rss_mb'] / r['build']['peak_rss_mb']:.2f}x RSS"
                       if mine["build"].get("wall_s") and r["build"].get("wall_s") else "")
                    + ("" if {mine.get("check"), r.get("check")} <= {"same", "reference"} else "  (TOKENS DIFFER)"))
    if ratio_lines:
        lines += ["same-run ratios (< 1: mslite faster or smaller):"] + ["  " + x for x in ratio_lines]
    return "\n".join(lines)


@click.command(context_settings=CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--shape", type=click.Choice(list(SHAPES)), default="1b",
              help="1b: TinyLlama-1.1B's shape (default); tiny: checks the tool")
@click.option("--work_dir", default=None,
              help="cache of the HF folder and the runtimes' models (default build/scale/<shape>)")
@click.option("--runtime", cls=SpacedList, type=click.Choice(OURS + PEERS),
              default=["mslite_cpu", "mslite", "mslite_io", "ort", "openvino"], show_default=True,
              help="forms and peers to run (ms, transformers: not by default)")
@click.option("--reference", type=click.Choice(OURS + PEERS), default="ort", show_default=True,
              help="the runtime whose tokens the others are compared with")
@click.option("--batch", cls=SpacedList, type=int, default=[1, 8], show_default=True)
@click.option("--steps", type=int, default=64, show_default=True, help="new tokens per row")
@click.option("--prompt_len", type=int, default=32, show_default=True)
@click.option("--seq_length", type=int, default=256, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--rss_limit_gb", type=float, default=20.0, show_default=True,
              help="kill a child whose process tree passes this resident size")
@click.option("--min_available_gb", type=float, default=1.5, show_default=True,
              help="kill a child when the machine has less memory available")
@click.option("--keep_exports", is_flag=True, help="keep our exports (2x the weights each on disk)")
@click.option("--rebuild", is_flag=True, help="rebuild the peers' models and our exports even when cached")
@click.option("--env", cls=SpacedList, empty_ok=True, default=[], metavar="KEY=VALUE",
              help="environment of the measuring children (e.g. MALLOC_ARENA_MAX=2)")
@click.option("--idle", type=float, default=0.6, show_default=True,
              help="start a child when the CPUs are less busy than this")
@click.option("--idle_timeout", type=float, default=30.0, show_default=True)
@click.option("--timeout", type=int, default=2400, show_default=True, help="seconds per child process")
@click.option("--json", "json_path", default=None, help="also write the rows to this file")
def command(**options):
    args = SimpleNamespace(**options)
    args.work_dir = os.path.abspath(args.work_dir or os.path.join(REPO, "build", "scale", args.shape))
    log = lambda msg: print(msg, file=sys.stderr, flush=True)   # noqa: E731
    bad_env = [kv for kv in args.env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", kv)]
    if bad_env:
        raise click.BadParameter(f"takes KEY=VALUE, got {bad_env[0]!r}", param_hint="'--env'")
    rows = run(args, log)
    bandwidth = read_bandwidth(args.threads)
    print(format_report(rows, SHAPES[args.shape], args, bandwidth))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(dict(shape=args.shape, sizes=SHAPES[args.shape], bandwidth=bandwidth, env=args.env,
                           rows=[{k: v for k, v in r.items() if k != "log"} for r in rows]), f, indent=1)
    failed = any("error" in r for r in rows) or any(r.get("check", "same") not in ("same", "reference") for r in rows)
    return 1 if failed else 0


main = entry_point(command, "python tools/bench_scale.py")

if __name__ == "__main__":
    sys.exit(main())
