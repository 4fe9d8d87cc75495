"""Export wall time and peak memory: `python -m exporter` run N times, each in a fresh process.

    .venv/bin/python tools/bench_export.py                                   # tools/demo_model/demo.yaml, 3 runs
    .venv/bin/python tools/bench_export.py --python .venv-ms20/bin/python    # the MindSpore 2.0 environment
    .venv/bin/python tools/bench_export.py --config my.yaml -n 5 --json export_bench.json

Wall time is measured around the whole child process (interpreter start, `import mindspore`,
tracing, writing); `export_s` is the exporter's own figure from its log line, when present. Peak RSS
is the child's `ru_maxrss` as returned by `os.wait4` for that child alone. Every run writes into a
fresh temporary folder, removed afterwards.

`write_slora_adapters` writes the LoRA adapters of the decode benchmark's SLoRA export
(tools/bench_decode.py --slora).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Dict, Optional, Sequence, Tuple

import click
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402
from lite_runtime.contract.errors import ConfigError  # noqa: E402
DEFAULT_CONFIG = os.path.join("tools", "demo_model", "demo.yaml")
EXPORTER_SECONDS = re.compile(r"exported .* in ([0-9.]+) s")


def export_once(python: str, config: str, workdir: str, timeout: float) -> dict:
    """One export in a fresh process; wall seconds, peak RSS (MB) and the exporter's own seconds."""
    out_dir = os.path.join(workdir, "export")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("GLOG_v", "3")
    run = timed_process([python, "-m", "exporter", "--config", config, "--output_dir", out_dir],
                        os.path.join(workdir, "export.log"), timeout, env)
    text = run.pop("log")
    found = EXPORTER_SECONDS.search(text)
    result = dict(run, export_s=float(found.group(1)) if found else None,
                  export_mb=_folder_mb(out_dir) if run["returncode"] == 0 else None)
    if run["returncode"] != 0:
        result["error"] = run.get("error") or (text.strip().splitlines()[-1] if text.strip()
                                               else f"exit code {run['returncode']}")
        result["log"] = text[-3000:]
    return result


def _tree_rss_mb(pid: int) -> float:
    """Resident MB of a process and its descendants (from /proc; 0 once it is gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm", encoding="ascii") as f:
                total += int(f.read().split()[1])
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", encoding="ascii") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def _available_mb() -> float:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    return float("inf")


def timed_process(cmd, log_path: str, timeout: float, env=None, cwd: str = REPO,
                  rss_limit_mb: Optional[float] = None, min_available_mb: float = 0.0) -> dict:
    """Run `cmd` in a process group of its own, its output to `log_path`; wall seconds, peak RSS (MB:
    `ru_maxrss` from `os.wait4`, which covers the child and the descendants it waited for), return
    code, CPU seconds (user + system) and the log's text. With `rss_limit_mb` the group is killed when its resident memory passes
    the limit, or when the machine's available memory falls below `min_available_mb`
    (`error` then says which)."""
    error = None
    with open(log_path, "w+", encoding="utf-8") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline, next_check = start + timeout, start
        while True:   # os.wait4 gives this child's own rusage (RUSAGE_CHILDREN would be a running max)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            now = time.perf_counter()
            if now > deadline:
                error = f"timed out after {timeout:.0f} s"
            elif rss_limit_mb is not None and now >= next_check:
                next_check = now + 0.2
                rss, free = _tree_rss_mb(proc.pid), _available_mb()
                if rss > rss_limit_mb:
                    error = f"killed at {rss / 1024:.1f} GB resident (limit {rss_limit_mb / 1024:.1f} GB)"
                elif free < min_available_mb:
                    error = (f"killed at {rss / 1024:.1f} GB resident: the machine had {free / 1024:.1f} GB "
                             f"available (floor {min_available_mb / 1024:.1f} GB)")
            if error:
                os.killpg(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.01)
        wall = time.perf_counter() - start
        log.seek(0)
        text = log.read()
    result = dict(wall_s=wall, peak_rss_mb=usage.ru_maxrss / 1024.0, cpu_s=usage.ru_utime + usage.ru_stime,
                  returncode=os.waitstatus_to_exitcode(status), log=text)
    if error:
        result["error"] = error
    return result


def _folder_mb(folder: str) -> float:
    total = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(folder) for n in names)
    return total / 2 ** 20


def summarise(runs) -> dict:
    ok = [r for r in runs if r["returncode"] == 0]
    if not ok:
        return {}
    wall = np.array([r["wall_s"] for r in ok])
    rss = np.array([r["peak_rss_mb"] for r in ok])
    inner = [r["export_s"] for r in ok if r["export_s"] is not None]
    return dict(wall_s_median=float(np.median(wall)), wall_s_p90=float(np.percentile(wall, 90)),
                wall_s_min=float(wall.min()), peak_rss_mb_median=float(np.median(rss)),
                peak_rss_mb_max=float(rss.max()),
                export_s_median=float(np.median(inner)) if inner else None,
                export_mb=ok[0]["export_mb"])


# --- the decode benchmark's SLoRA adapters -------------------------------------------------------

SLORA_ADAPTERS = ("a1", "a2")
SLORA_RANK, SLORA_ALPHA = 8, 16.0
SLORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")    # MindFormers wq, wk, wv, wo
SLORA_RECIPE = dict(adapters=list(SLORA_ADAPTERS), r=SLORA_RANK, alpha=SLORA_ALPHA, targets=list(SLORA_TARGETS),
                    weights="normal(0, 0.02), seed 1", format="peft")


def lora_shapes(model: dict, r: int, targets: Sequence[str] = SLORA_TARGETS) -> Dict[str, Tuple[int, int]]:
    """PEFT names and shapes of the LoRA A (r, in) and B (out, r) of `targets` in every block of a
    Llama of `model`'s sizes."""
    hidden, heads = model["hidden_size"], model["n_heads"]
    head_dim = hidden // heads
    q, kv = heads * head_dim, model.get("n_kv_heads", heads) * head_dim
    out_in = {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, q)}
    shapes = {}
    for layer in range(model["num_layers"]):
        for target in targets:
            rows, cols = out_in[target]
            stem = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            shapes[f"{stem}.lora_A.weight"] = (r, cols)
            shapes[f"{stem}.lora_B.weight"] = (rows, r)
    return shapes


def write_slora_adapters(folder: str, model: dict, seed: int = 1) -> str:
    """SLORA_ADAPTERS as PEFT LoRA folders under `folder` (rank SLORA_RANK on SLORA_TARGETS, random
    non-zero A and B: normal(0, 0.02), seeded) and the lora_adapter.json naming them; returns its path."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    config = dict(peft_type="LORA", r=SLORA_RANK, lora_alpha=SLORA_ALPHA, lora_dropout=0.0,
                  target_modules=list(SLORA_TARGETS))
    for name in SLORA_ADAPTERS:
        os.makedirs(os.path.join(folder, name), exist_ok=True)
        with open(os.path.join(folder, name, "adapter_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
        tensors = {n: 0.02 * rng.standard_normal(shape, dtype=np.float32)
                   for n, shape in lora_shapes(model, SLORA_RANK).items()}
        save_file(tensors, os.path.join(folder, name, "adapter_model.safetensors"))
    path = os.path.join(folder, "lora_adapter.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({name: name for name in SLORA_ADAPTERS}, f)
    return path


@click.command(context_settings=CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--config", default=DEFAULT_CONFIG, help=f"export yaml (default {DEFAULT_CONFIG})")
@click.option("-n", "--runs", type=int, default=3, help="number of exports (default 3)")
@click.option("--python", default=sys.executable,
              help="interpreter running the exporter, e.g. .venv-ms20/bin/python (default: this one)")
@click.option("--timeout", type=float, default=1800, show_default=True, help="seconds per export")
@click.option("--json", "json_path", default=None, help="also write the results to this file")
def command(**options):
    args = SimpleNamespace(**options)
    config = os.path.abspath(args.config)
    if not os.path.isfile(config):
        raise ConfigError(f"config {args.config} does not exist (give --config)")
    if args.runs < 1:
        raise ConfigError(f"--runs must be at least 1, got {args.runs}")
    python = args.python if os.sep not in args.python else os.path.abspath(args.python)
    runs = []
    for i in range(args.runs):
        workdir = tempfile.mkdtemp(prefix="bench-export-")
        try:
            run = export_once(python, config, workdir, args.timeout)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        runs.append(run)
        status = "ok" if run["returncode"] == 0 else f"FAILED: {run['error']}"
        inner = f", exporter {run['export_s']:.2f} s" if run["export_s"] is not None else ""
        print(f"run {i + 1}/{args.runs}: {run['wall_s']:.2f} s wall{inner}, "
              f"peak RSS {run['peak_rss_mb']:.0f} MB  {status}", file=sys.stderr, flush=True)
    summary = summarise(runs)
    if summary:
        inner = (f", exporter's own time median {summary['export_s_median']:.2f} s"
                 if summary["export_s_median"] is not None else "")
        print(f"{args.config} with {args.python}: {len(runs)} run(s); wall median "
              f"{summary['wall_s_median']:.2f} s, p90 {summary['wall_s_p90']:.2f} s{inner}; peak RSS median "
              f"{summary['peak_rss_mb_median']:.0f} MB, max {summary['peak_rss_mb_max']:.0f} MB; "
              f"export {summary['export_mb']:.1f} MB")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(dict(config=config, python=args.python, runs=runs, summary=summary), f, indent=2)
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


main = entry_point(command, "python tools/bench_export.py")


if __name__ == "__main__":
    sys.exit(main())
