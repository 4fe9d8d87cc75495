"""Serving benchmark: the same workload through the server (continuous batching) and through the static
batches of pipeline(), side by side, with the texts checked equal.

    python tools/bench_serve.py --model_dir output/demo [--backend mslite] [--requests 64] [--clients 16]
                                [--rate 8] [--seed 0]          (make bench-serve ARGS="...")

Requests arrive as a Poisson process (`--rate` per second; 0: all at once) with prompt and output
lengths drawn per request; greedy. The server is driven by `--clients` concurrent streaming clients
(the official `openai` client); pipeline() takes, whenever it is idle, up to the graph's batch of the
requests that have arrived and runs them to the end. Printed: throughput (generated tokens per second
of the whole run), time to first token and inter-token latency p50 / p99 from each request's arrival,
and same-run ratios. Each side runs in a process of its own, one after the other.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import click
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from lite_runtime.cli.cli_common import CONTEXT, entry_point  # noqa: E402


def workload(model_dir: str, requests: int, rate: float, seed: int) -> list:
    """[{arrival s, prompt text, max_tokens}], prompts made of the tokenizer's own pieces."""
    from lite_runtime.contract.manifest import load_manifest
    manifest = load_manifest(model_dir)
    tokenizer = manifest.load_tokenizer()
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids)
    pieces = [i for i in range(tokenizer.vocab_size) if i not in special]
    room = manifest.seq_length
    arrivals = np.cumsum(rng.exponential(1.0 / rate, requests)) if rate > 0 else np.zeros(requests)
    jobs = []
    for arrival in arrivals:
        prompt_len = int(rng.integers(4, max(5, room // 4)))
        ids = [int(i) for i in rng.choice(pieces, prompt_len)]
        jobs.append({"arrival": float(arrival), "prompt": tokenizer.decode(ids),
                     "max_tokens": int(rng.integers(8, max(9, room // 2)))})
    return jobs


def serve_side(model_dir: str, backend: str, jobs: list, clients: int) -> list:
    from openai import OpenAI
    from lite_runtime.serve.process import served
    with served(model_dir, backend, "bench", cwd=REPO, output=None) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        client.completions.create(model="bench", prompt=jobs[0]["prompt"], max_tokens=2, temperature=0)   # warm
        start = time.perf_counter()

        def run(job):
            time.sleep(max(0.0, start + job["arrival"] - time.perf_counter()))
            stamps, text, tokens = [], [], 0
            for chunk in client.completions.create(model="bench", prompt=job["prompt"], max_tokens=job["max_tokens"],
                                                   temperature=0, stream=True):
                if chunk.choices and chunk.choices[0].text:
                    stamps.append(time.perf_counter())
                    text.append(chunk.choices[0].text)
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            return {"arrived": job["arrival"], "stamps": [s - start for s in stamps], "text": "".join(text),
                    "tokens": tokens}
        with ThreadPoolExecutor(clients) as pool:
            return list(pool.map(run, jobs))


STATIC = """
import json, sys, time
from lite_runtime import pipeline
model_dir, backend, jobs = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
pipe = pipeline("text_generation", model=model_dir, backend=backend)
pipe(jobs[0]["prompt"], max_new_tokens=2, add_special_tokens=True)          # warm
batch = pipe.manifest.batch_size if hasattr(pipe, "manifest") else 1
results, pending, start = [None] * len(jobs), list(range(len(jobs))), time.perf_counter()
while pending:
    now = time.perf_counter() - start
    ready = [i for i in pending if jobs[i]["arrival"] <= now][:batch]
    if not ready:
        time.sleep(jobs[pending[0]]["arrival"] - now)
        continue
    begun = time.perf_counter() - start
    answers = pipe([jobs[i]["prompt"] for i in ready], add_special_tokens=True,
                   max_new_tokens=max(jobs[i]["max_tokens"] for i in ready))
    ended = time.perf_counter() - start
    first = pipe.last_timing.first - start
    for i, answer in zip(ready, answers):
        text = answer["text_generation_text"][0][len(jobs[i]["prompt"]):]
        results[i] = {"arrived": jobs[i]["arrival"], "first": first, "end": ended, "begun": begun, "text": text}
        pending.remove(i)
print(json.dumps(results))
"""


def static_side(model_dir: str, backend: str, jobs: list, work: str) -> list:
    path = os.path.join(work, "jobs.json")
    with open(path, "w") as f:
        json.dump(jobs, f)
    result = subprocess.run([sys.executable, "-c", STATIC, model_dir, backend, path], cwd=REPO, text=True,
                            capture_output=True, env=dict(os.environ, PYTHONPATH=REPO, GLOG_v="3"))
    if result.returncode:
        raise SystemExit(f"error: the static pipeline run failed: {result.stderr.strip().splitlines()[-1]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def summary(name: str, rows: list, tokens: list) -> dict:
    ttft = [r["first"] - r["arrived"] for r in rows]
    itl = [b - a for r in rows for a, b in zip(r["stamps"], r["stamps"][1:])] if "stamps" in rows[0] else \
        [(r["end"] - r["first"]) / max(1, n - 1) for r, n in zip(rows, tokens)]
    makespan = max(r["end"] for r in rows)
    return {"name": name, "tok_s": sum(tokens) / makespan, "ttft50": np.percentile(ttft, 50),
            "ttft99": np.percentile(ttft, 99), "itl50": np.percentile(itl, 50), "itl99": np.percentile(itl, 99)}


@click.command(context_settings=CONTEXT, help=__doc__.split("\n")[0])
@click.option("--model_dir", required=True, help="an export with kv_cache: dynamic")
@click.option("--backend", type=click.Choice(["mslite", "ms"]), default="mslite", show_default=True)
@click.option("--requests", type=int, default=64, show_default=True)
@click.option("--clients", type=int, default=16, show_default=True)
@click.option("--rate", type=float, default=8.0, show_default=True, help="arrivals per second (0: all at once)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--work_dir", default=os.path.join(REPO, "build", "bench_serve"), show_default=True)
def command(**options):
    args = SimpleNamespace(**options)
    os.makedirs(args.work_dir, exist_ok=True)
    jobs = workload(args.model_dir, args.requests, args.rate, args.seed)
    served_rows = serve_side(args.model_dir, args.backend, jobs, args.clients)
    for r in served_rows:
        r["first"], r["end"] = (r["stamps"][0], r["stamps"][-1]) if r["stamps"] else (r["arrived"], r["arrived"])
    static_rows = static_side(args.model_dir, args.backend, jobs, args.work_dir)
    # A static batch runs to its longest request's max_tokens: each server text is a prefix of its row's
    same = sum(b["text"].startswith(a["text"]) for a, b in zip(served_rows, static_rows))
    tokens = [r["tokens"] for r in served_rows]       # both sides are credited with the requested tokens
    rows = [summary("server (continuous batching)", served_rows, tokens),
            summary("pipeline() (static batches)", static_rows, tokens)]
    print(f"{args.requests} requests, {args.clients} clients, {args.rate} req/s, backend {args.backend}, "
          f"greedy texts agree: {same}/{len(jobs)}")
    print(f"{'':32} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}")
    for r in rows:
        print(f"{r['name']:32} {r['tok_s']:8.1f} {r['ttft50'] * 1e3:7.0f}ms {r['ttft99'] * 1e3:7.0f}ms "
              f"{r['itl50'] * 1e3:6.1f}ms {r['itl99'] * 1e3:6.1f}ms")
    s, p = rows
    print(f"ratios server / pipeline: throughput {s['tok_s'] / p['tok_s']:.2f}x, TTFT p50 "
          f"{s['ttft50'] / p['ttft50']:.2f}x")
    return 0 if same == len(jobs) else 1


main = entry_point(command, "python tools/bench_serve.py")


if __name__ == "__main__":
    sys.exit(main())
