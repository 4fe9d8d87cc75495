"""Soak and fault figures on the demo model (docs/reliability.md).

    python tools/soak.py [--requests 1000] [--work_dir build/soak]      (make soak ARGS="...")

1. Memory over many requests: --requests sequential completions through the server (`mslite`) and
   as many pipeline() calls in one process, resident size read at fixed request counts.
2. A killed rank: a two-rank segment export under the launcher; rank 1 is killed while the ranks wait
   for a prompt; the time until the launcher exits and the processes left (none expected).
3. An interrupted export: SIGTERM after the export's first stage (time to exit, what is left beside output_dir), and
   SIGKILL (its temporary folder stays until the next export into that location removes it).
Exports are made with MindSpore 2.0 (`.venv-ms20`), as `make demo` does.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import click
import psutil
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tools"))
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402
from served_process import served        # noqa: E402

EXPORTER = os.path.join(REPO, ".venv-ms20", "bin", "python")
PROMPTS = ["An increasing sequence: one,", "Counting: seven, eight,", "The alphabet: a, b,"]
MARKS = (10, 100, 300, 1000, 3000, 10000)
PIPELINE_SOAK = """
import json, sys
from lite_runtime import pipeline
model_dir, requests, prompts, marks = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
pipe = pipeline("text_generation", model=model_dir, backend="mslite")
for i in range(1, requests + 1):
    pipe(prompts[i % len(prompts)], max_new_tokens=8 + i % 9, add_special_tokens=True)
    if i in marks:
        rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
        print(json.dumps([i, rss * 1024]), flush=True)
"""


def demo_yaml(work: str, name: str, **changes) -> str:
    """The demo model's yaml with `changes`, output_dir work/name, written to work/name.yaml."""
    with open(os.path.join(REPO, "tools", "demo_model", "demo.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg["model"]["tokenizer"] = os.path.join(REPO, "tools", "demo_model", cfg["model"]["tokenizer"])
    cfg["load_checkpoint"] = os.path.join(REPO, "tools", "demo_model", cfg["load_checkpoint"])
    cfg.update(changes, output_dir=os.path.join(work, name))
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def exporting(config: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([EXPORTER, "-m", "exporter", "--config", config], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=REPO, GLOG_v="3"), **popen)


def export(work: str, name: str, **changes) -> str:
    """The demo model exported to work/name (kept between runs); returns the folder."""
    out = os.path.join(work, name)
    if not os.path.exists(out):
        proc = exporting(demo_yaml(work, name, **changes), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.wait():
            raise SystemExit(f"error: the export of {out} failed: {proc.stderr.read().strip().splitlines()[-1]}")
    return out


def growth(points) -> str:
    first, last = points[0][1], points[-1][1]
    marks = ", ".join(f"{n}: {rss / 2**20:.0f} MB" for n, rss in points)
    return f"{marks}; from request {points[0][0]} to {points[-1][0]}: {100 * (last - first) / first:+.1f} %"


def server_memory(model_dir: str, requests: int, work: str) -> str:
    from openai import OpenAI
    points = []
    with open(os.path.join(work, "server.log"), "w") as log, served(model_dir, "mslite", "demo", output=log) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        for i in range(1, requests + 1):
            stream = i % 2 == 0
            answer = client.completions.create(model="demo", prompt=PROMPTS[i % 3], max_tokens=8 + i % 9,
                                               temperature=0 if i % 3 else 0.8, seed=i, stream=stream)
            if stream:
                for _ in answer:
                    pass
            if i in MARKS or i == requests:
                points.append((i, server.rss_bytes()))
    return "server, " + growth(points)


def pipeline_memory(model_dir: str, requests: int) -> str:
    marks = sorted({m for m in MARKS if m <= requests} | {requests})
    out = subprocess.run([sys.executable, "-c", PIPELINE_SOAK, model_dir, str(requests), json.dumps(PROMPTS),
                          json.dumps(marks)], cwd=REPO, check=True, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=REPO, GLOG_v="3")).stdout
    return "pipeline(), " + growth([json.loads(line) for line in out.splitlines() if line.startswith("[")])


def rank_table(path: str, n: int) -> str:
    """A one-server table of `n` devices on this host."""
    from lite_runtime.ascend.rank_table import RankEntry, ServerEntry, table_json
    ranks = tuple(RankEntry(r, "127.0.0.1", r, f"192.98.92.{100 + r}") for r in range(n))
    with open(path, "w") as f:
        json.dump(table_json([ServerEntry("127.0.0.1", ranks)]), f)
    return path


def killed_rank(work: str) -> str:
    tp2 = export(work, "tp2", parallel={"model_parallel": 2, "collectives": "host"})
    launcher = subprocess.Popen(
        [sys.executable, "-m", "lite_runtime.cli.launch", "--rank_table", rank_table(os.path.join(work, "t2.json"), 2),
         "--log_dir", os.path.join(work, "launch-logs"), "--", "run_infer_main.py", "--model_dir", tp2, "--backend",
         "mslite", "--interactive"], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victim, deadline = None, time.monotonic() + 120
    while victim is None and time.monotonic() < deadline:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if child.environ().get("RANK_ID") == "1" and child.cmdline()[1].endswith("run_infer_main.py"):
                    victim = child
            except (psutil.Error, IndexError):
                pass
        time.sleep(0.2)
    if victim is None:
        launcher.kill()
        raise SystemExit("error: rank 1 never started")
    time.sleep(10)                                       # loaded, waiting for a prompt
    family = [victim] + psutil.Process(launcher.pid).children(recursive=True)
    killed = time.monotonic()
    victim.send_signal(signal.SIGKILL)
    stderr = launcher.communicate(timeout=120)[1]
    stopped = time.monotonic() - killed
    time.sleep(1)
    alive = [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    said = next((l for l in stderr.splitlines() if l.startswith("error:")), "(no error line)")
    return (f"killed rank 1 of 2 (Lite segments + MPI): the launcher exited {launcher.returncode} after "
            f"{stopped:.1f} s, {len(alive)} of {len(family)} processes left; it said: {said}")


def interrupted_export(work: str) -> list:
    lines = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        out = os.path.join(work, f"interrupted-{sig.name}")
        shutil.rmtree(out, ignore_errors=True)
        cfg = demo_yaml(work, f"interrupted-{sig.name}")
        proc = exporting(cfg, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        proc.stdout.readline()                           # its first stage is done
        sent = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=60)
        took = time.monotonic() - sent
        left = [n for n in os.listdir(work) if n.startswith(".export-")] + ([out] if os.path.exists(out) else [])
        line = f"export {sig.name} after its first stage: exit {proc.returncode} after {took:.2f} s, left: {left or 'nothing'}"
        if sig == signal.SIGKILL:
            again = exporting(cfg, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).wait()
            after = [n for n in os.listdir(work) if n.startswith(".export-")]
            line += f"; the next export (exit {again}) left: {after or 'nothing'}"
        lines.append(line)
    return lines


@click.command(context_settings=CONTEXT, help=__doc__.split("\n")[0])
@click.option("--requests", type=int, default=1000, show_default=True)
@click.option("--work_dir", default=os.path.join(REPO, "build", "soak"), show_default=True)
def command(requests, work_dir):
    os.makedirs(work_dir, exist_ok=True)
    demo = export(work_dir, "demo")
    print(server_memory(demo, requests, work_dir), flush=True)
    print(pipeline_memory(demo, requests), flush=True)
    print(killed_rank(work_dir), flush=True)
    for line in interrupted_export(work_dir):
        print(line, flush=True)


main = entry_point(command, "python tools/soak.py")


if __name__ == "__main__":
    sys.exit(main())
