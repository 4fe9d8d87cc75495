"""Decode benchmark: `python tools/benchmark.py --model_dir out/x --backend ms mslite`.

Drives the real decode loop (`generation.generate_steps`, a greedy `Sampler`, per-row incremental
detokenisation with `streamers.RowDetokenizer` when the export ships a tokenizer) and reports,
per backend and batch: time to first token, per-step decode latency (median / p90), host time per
step (step wall time minus the time inside graph calls, `Session.graph_seconds`), tokens/s and
peak RSS. For `mslite` it also times the bare Lite Predict of the increment graph on inputs already
bound (`session.bare_decode_predict()`): one after every decode step, outside that step's time, so
step and bare Predict are measured side by side under the same load; it prints step / bare.

Workload (docs/performance.md): 32-token prompts, 128 greedy new tokens, EOS ignored.
`--make-bench-model` builds the notes' benchmark model (random Llama, hidden 256, 4 layers, 4 heads,
vocab 32000, seq 256, fp32) for batch 1 and 8: MindSpore 2.10 exports for `ms`, MindSpore 2.0
exports for `mslite` (Lite 2.0 reads only MindIR of MindSpore 2.0), cached under --work_dir; it is
the default without --model_dir. `--slora` adds the same Llama exported with two random LoRA
adapters (SLoRA: r 8 on q, k, v, o; tools/bench_export.py writes them; rows take the adapters in
turn) and measures it against the model without adapters: one child process per backend and batch
loads both and runs `--slora_rounds` requests, each export's decode steps interleaved with the
other's; it prints the median decode step of both and the median of the same-round ratios SLoRA /
base.

Every measurement runs in a child process of its own (Lite and mindspore cannot share a process);
this parent process never imports mindspore. Compare ratios measured in one run, not absolute
times from different runs: these machines are shared and noisy.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

import click
import numpy as np

from bench_export import SLORA_ADAPTERS, SLORA_RANK, SLORA_RECIPE, write_slora_adapters
from bench_measure import measure, measure_pair
from bench_ranks import launch_command, launcher_startup_ms
from lite_runtime.contract.command_line import CONTEXT, SpacedList, entry_point
from lite_runtime.contract.errors import ToolchainError
from lite_runtime.contract.manifest import FORMAT_VERSION

TOOLS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TOOLS)
VENV_PYTHON = os.path.join(REPO, ".venv", "bin", "python")
VENV_MS20_PYTHON = os.path.join(REPO, ".venv-ms20", "bin", "python")
DEFAULT_WORK_DIR = os.path.join(REPO, "build", "bench_model")
BACKENDS = ("ms", "mslite")

# The notes' benchmark model: ≈ 20.6 M parameters (intermediate 1024 gives that count), and the same
# sizes in the other families' shapes (Bloom: ALiBi, LayerNorm, GELU, tied head; GPT-2: learned positions).
BENCH_SIZES = dict(vocab_size=32000, hidden_size=256, num_layers=4, n_heads=4, intermediate_size=1024,
                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
BENCH_MODELS = {
    "llama": dict(BENCH_SIZES, family="llama", n_kv_heads=4, norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False),
    "bloom": dict(BENCH_SIZES, family="bloom"),
    "gpt2": dict(BENCH_SIZES, family="gpt2", max_position_embeddings=256),
}
BENCH_SEQ_LENGTH = 256

# Run in a subprocess with the MindSpore 2.10 environment: random weights under MindFormers names.
WRITE_CKPT = """
import sys, json, numpy as np, mindspore as ms
from exporter.families import family_by_name
from exporter.models.attention import BuildContext
from exporter.models.decoder import CausalLM
sizes = {k: v for k, v in json.loads(sys.argv[2]).items()
         if k not in ("family", "bos_token_id", "eos_token_id", "pad_token_id")}
family = family_by_name(json.loads(sys.argv[2])["family"], "bench")
net = CausalLM(family.config(sizes, "bench"), BuildContext(1, 0, "io", 1, 8, ms.float32))
rng = np.random.default_rng(0)
params = []
for name, p in net.parameters_and_names():
    if name.endswith(("key_cache", "value_cache")):
        continue
    source, transposed = family.mindformers_weights.source_of(name)   # saved under MindFormers names
    shape = getattr(p, "full_shape", tuple(p.shape))     # weights are one-element placeholders until loaded
    shape = tuple(reversed(shape)) if transposed else tuple(shape)
    if "norm" in name and name.endswith("weight"):
        data = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    else:
        data = 0.02 * rng.standard_normal(shape, dtype=np.float32)
    params.append({"name": source, "data": ms.Tensor(data.astype(np.float32))})
ms.save_checkpoint(params, sys.argv[1])
"""


# --- the benchmark model (built with the exporter in subprocesses) ------------------------------

def export_python(backend: str) -> str:
    """The interpreter whose MindSpore writes graphs `backend` can read."""
    return VENV_MS20_PYTHON if backend == "mslite" else VENV_PYTHON


def _run(cmd: List[str], what: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("GLOG_v", "3")
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise ToolchainError(f"{what} failed ({' '.join(cmd[:4])} ...):\n{result.stderr[-3000:]}")
    return result


def make_bench_model(work_dir: str, backends, batches, kv_cache: str = "io", rebuild: bool = False,
                     log=print, world_sizes=(1,), families=("llama",), slora: bool = False) -> Dict[tuple, str]:
    """Export the benchmark models; returns {(family, backend, batch, ranks, adapters): dir}.

    Multi-rank (tensor-parallel) exports: for ms with the collectives in the graphs (kv modes io and
    in_graph); for mslite as step segments reduced on the host (kv_cache packed: Lite on CPU has no
    collectives).
    `slora` adds the Llama's SLoRA exports (one rank; adapters = len(SLORA_ADAPTERS), 0 elsewhere).
    Exports whose recorded recipe matches are reused; `rebuild` redoes them.
    """
    out = {}
    for family in families:
        model = BENCH_MODELS[family]
        folder_of = os.path.join(work_dir, family)
        os.makedirs(folder_of, exist_ok=True)
        ckpt = os.path.join(folder_of, f"bench_{family}.ckpt")
        recipe = dict(model=model, seq_length=BENCH_SEQ_LENGTH, weights="normal(0, 0.02), seed 0", mslite="lite_ms",
                      export_format=FORMAT_VERSION)
        stamp = os.path.join(folder_of, "recipe.json")
        fresh = rebuild or not _same_recipe(stamp, recipe) or not os.path.isfile(ckpt)
        if fresh:
            log(f"writing random weights to {ckpt}")
            _run([VENV_PYTHON, "-c", WRITE_CKPT, ckpt, json.dumps(model)], "writing the benchmark checkpoint")
            _write_recipe(stamp, recipe)
        adapter_dir, with_slora = os.path.join(folder_of, "slora"), slora and family == "llama"
        adapter_stamp = os.path.join(adapter_dir, "recipe.json")
        slora_fresh = with_slora and (fresh or not _same_recipe(adapter_stamp, SLORA_RECIPE))
        if slora_fresh:
            log(f"writing random LoRA adapters to {adapter_dir}")
            write_slora_adapters(adapter_dir, model)
            _write_recipe(adapter_stamp, SLORA_RECIPE)
        config = dict(model=model, load_checkpoint=ckpt, seq_length=BENCH_SEQ_LENGTH)
        slora_model = dict(model, pet_config={"pet_type": "slora",
                                              "adapter_path": os.path.join(adapter_dir, "lora_adapter.json")})
        for backend in backends:
            mode = "io" if backend == "mslite" and kv_cache == "in_graph" else kv_cache
            for batch, ranks in [(b, r) for b in batches for r in world_sizes
                                 if r == 1 or (backend == "ms") == (mode != "packed")]:
                name = f"{'ms20' if backend == 'mslite' else 'ms'}_{mode}_b{batch}" + (f"_tp{ranks}" if ranks > 1 else "")
                parallel = {"model_parallel": ranks, **({"collectives": "host"} if backend == "mslite" and ranks > 1
                                                        else {})}
                graph = dict(config, batch_size=batch, kv_cache=mode, parallel=parallel)
                out[(family, backend, batch, ranks, 0)] = _export_bench(folder_of, name, graph, backend, fresh, log)
                if with_slora and ranks == 1:
                    out[(family, backend, batch, ranks, len(SLORA_ADAPTERS))] = _export_bench(
                        folder_of, name + "_slora", dict(graph, model=slora_model), backend, slora_fresh, log)
    return out


def _same_recipe(stamp: str, recipe: dict) -> bool:
    if not os.path.isfile(stamp):
        return False
    with open(stamp, encoding="utf-8") as f:
        return json.load(f) == recipe


def _write_recipe(stamp: str, recipe: dict) -> None:
    with open(stamp, "w", encoding="utf-8") as f:
        json.dump(recipe, f)


def _export_bench(folder_of: str, name: str, config: dict, backend: str, fresh: bool, log) -> str:
    """Export `config` to folder_of/name with the MindSpore `backend` reads, unless `fresh` is false and
    an export is there; returns the folder."""
    import yaml

    folder = os.path.join(folder_of, name)
    if not fresh and os.path.isfile(os.path.join(folder, "manifest.json")):
        return folder
    config = dict(config, output_dir=folder)
    if backend == "mslite":     # also Lite's .ms models (the runtime's --lite_format picks)
        config["lite_ms"] = True
    path = os.path.join(folder_of, name + ".yaml")
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    python, what = export_python(backend), f"{os.path.basename(folder_of)} {name}"
    log(f"exporting {what} with {os.path.relpath(python, REPO)}")
    _run([python, "-m", "exporter", "--config", path], f"exporting {what}")
    return folder


# --- the parent: jobs, child processes, the table -----------------------------------------------

def child_python(backend: str, override: Optional[str]) -> str:
    if override:
        return override
    return VENV_PYTHON if os.path.isfile(VENV_PYTHON) else sys.executable


def run_child(job: dict, python: str, timeout: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        job_file, out_file = os.path.join(tmp, "job.json"), os.path.join(tmp, "result.json")
        with open(job_file, "w", encoding="utf-8") as f:
            json.dump(job, f)
        cmd = [python, os.path.join(TOOLS, "benchmark.py"), "--child", job_file, out_file]
        if job.get("world_size", 1) > 1:
            cmd = launch_command(python, job_file, out_file, job, tmp)
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.setdefault("GLOG_v", "3")
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return dict(job, error=f"timed out after {timeout} s")
        if proc.returncode != 0 or not os.path.isfile(out_file):
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            return dict(job, error=(lines[-1] if lines else f"exit code {proc.returncode}"),
                        stderr=proc.stderr[-4000:])
        for line in proc.stderr.splitlines():
            if line.startswith("note:"):
                print("  " + line, file=sys.stderr)
        with open(out_file, encoding="utf-8") as f:
            result = json.load(f)
        result["launcher_startup_ms"] = launcher_startup_ms(proc.stderr)
        return result


def one_rank_agreement(result: dict, results: List[dict]) -> str:
    """Whether a multi-rank run chose the tokens of the one-rank run of the same model and batch."""
    same = [r for r in results if "error" not in r and r["world_size"] == 1 and
            (r["family"], r["backend"], r["batch"]) == (result["family"], result["backend"], result["batch"])]
    if not same:
        return "no one-rank run to compare tokens with"
    return "tokens identical to 1 rank" if same[0]["tokens"] == result["tokens"] else "TOKENS DIFFER FROM 1 RANK"


def format_table(results: List[dict]) -> str:
    head = ["model", "backend", "ranks", "batch", "steps", "TTFT ms", "step med ms", "step p90 ms", "host ms/step", "tok/s",
            "peak RSS MB", "bare predict ms", "step/bare"]
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r.get("family", "?"), r["backend"], str(r.get("world_size", 1)), str(r.get("batch") or "?"), f"error: {r['error']}"])
            continue
        bare = r.get("bare_predict_ms")
        batch = str(r["batch"]) if r["batch"] == r["graph_batch"] else f"{r['batch']}/{r['graph_batch']}"
        rows.append([r.get("family", "?"), r["backend"], str(r["world_size"]), batch, str(r["decode_steps"]), f"{r['ttft_ms']:.2f}", f"{r['step_ms']['median']:.3f}",
                     f"{r['step_ms']['p90']:.3f}", f"{r['host_ms']['median']:.3f}", f"{r['tok_s']:.1f}",
                     f"{r['peak_rss_mb']:.0f}", f"{bare['median']:.3f}" if bare else "-",
                     f"{r['step_over_bare']:.3f}x" if bare else "-"])
    return _align(head, rows)


def _align(head: List[str], rows: List[List[str]]) -> str:
    """Right-aligned columns; a row of another length (an error) is printed as it is."""
    widths = [max([len(head[i])] + [len(row[i]) for row in rows if len(row) == len(head)])
              for i in range(len(head))]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    for row in rows:
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths)) if len(row) == len(head)
                     else "  ".join(row))
    return "\n".join(lines)


# --- SLoRA against the same model without adapters ----------------------------------------------

def slora_pairs(jobs: List[dict]) -> List[Tuple[dict, dict]]:
    """(base job, SLoRA job) per backend and batch: the one-rank Llama export without and with adapters."""
    with_adapters = {(j["backend"], j["batch"]): j for j in jobs if j.get("adapters")}
    return [(j, with_adapters[(j["backend"], j["batch"])]) for j in jobs
            if not j.get("adapters") and j["family"] == "llama" and j["world_size"] == 1
            and (j["backend"], j["batch"]) in with_adapters]


def slora_job(base: dict, slora: dict, rounds: int) -> dict:
    """The child job of one pair (measure_pair)."""
    return dict(base, model_dirs=[base["model_dir"], slora["model_dir"]], model_dir=slora["model_dir"], rounds=rounds)


def slora_summary(results: List[dict]) -> Dict[Tuple[str, int], dict]:
    """Per (backend, batch): the median over rounds of each export's median decode step, and the
    median of the same-round ratios SLoRA / base."""
    summary = {}
    for r in results:
        if "error" in r or not r["rounds"]:
            continue
        base, slora = (np.array([x[key] for x in r["rounds"]]) for key in ("base_ms", "slora_ms"))
        summary[(r["backend"], r["batch"])] = dict(base_ms=float(np.median(base)), slora_ms=float(np.median(slora)),
                                                   ratio=float(np.median(slora / base)), rounds=len(base))
    return summary


def format_slora(summary: Dict[Tuple[str, int], dict]) -> str:
    head = ["backend", "batch", "rounds", "base step med ms", "SLoRA step med ms", "SLoRA/base"]
    rows = [[backend, str(batch), str(s["rounds"]), f"{s['base_ms']:.3f}", f"{s['slora_ms']:.3f}", f"{s['ratio']:.3f}x"]
            for (backend, batch), s in summary.items()]
    title = (f"SLoRA decode step: the Llama with {len(SLORA_ADAPTERS)} LoRA adapters (r {SLORA_RANK} on q, k, v, o; "
             "rows take them in turn) against the same model without, both loaded in one process, their decode "
             "steps interleaved; steps: medians over rounds, SLoRA/base: median of the same-round ratios")
    return title + "\n" + _align(head, rows)


@click.command(context_settings=CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--model_dir", cls=SpacedList, default=[], help="export folder(s); batch = the graph's batch size")
@click.option("--make-bench-model", "--make_bench_model", "make_bench_model", is_flag=True,
              help="build (or reuse) the notes' benchmark model exports under --work_dir and bench them "
                   "(the default without --model_dir)")
@click.option("--work_dir", default=DEFAULT_WORK_DIR, show_default=True,
              help="where --make-bench-model keeps its checkpoint and exports")
@click.option("--rebuild", is_flag=True, help="re-export the benchmark model even if cached")
@click.option("--family", cls=SpacedList, type=click.Choice(list(BENCH_MODELS)), default=list(BENCH_MODELS),
              help="families of the benchmark model (same sizes in each family's shape; default: all)")
@click.option("--kv_cache", type=click.Choice(["io", "in_graph", "packed"]), default="io", show_default=True,
              help="kv mode of the benchmark model's exports (mslite runs io or packed: in_graph gives io there)")
@click.option("--backend", cls=SpacedList, type=click.Choice(list(BACKENDS)), default=[],
              help="default: ms and mslite")
@click.option("--batch", cls=SpacedList, type=int, default=[],
              help="batch sizes of the benchmark model (default 1 8); with --model_dir, prompts per request "
                   "(at most the graph's batch size, which is the default; the other rows are padding)")
@click.option("--slora", is_flag=True,
              help=f"also measure the Llama's SLoRA export ({len(SLORA_ADAPTERS)} adapters, r {SLORA_RANK} on q, k, "
                   "v, o) against the same model without adapters, in interleaved rounds, and print SLoRA/base of "
                   "the decode step")
@click.option("--slora_rounds", type=int, default=5, help="requests per export in the --slora comparison (default 5)")
@click.option("--tp", cls=SpacedList, type=int, default=[1],
              help="rank counts of the benchmark model (tensor parallel; e.g. --tp 1 2; mslite with --kv_cache "
                   "packed: step segments with host all-reduces); the ranks share --threads")
@click.option("--steps", type=int, default=128,
              help="new tokens per row (decode steps = steps - 1; default 128; capped to fit seq_length)")
@click.option("--prompt_len", type=int, default=32, show_default=True)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--lite_format", type=click.Choice(["auto", "ms", "mindir"]), default="auto", show_default=True,
              help="mslite: the export's .ms models when it has them (auto), or insist on one format")
@click.option("--warmup", type=int, default=1, show_default=True,
              help="short warm-up requests before the measured one")
@click.option("--no-detok", "--no_detok", "no_detok", is_flag=True, help="skip detokenisation")
@click.option("--python", default=None, help="interpreter of the measuring child processes (default .venv/bin/python)")
@click.option("--timeout", type=int, default=1800, show_default=True, help="seconds per child process")
@click.option("--json", "json_path", default=None, help="also write the results to this file")
@click.option("--child", nargs=2, default=None, hidden=True)
def command(**options):
    args = SimpleNamespace(**options)
    if args.child:
        with open(args.child[0], encoding="utf-8") as f:
            job = json.load(f)
        result = (measure_pair if "model_dirs" in job else measure)(job)
        if result["rank"] == 0:   # in a multi-rank job rank 0 reports
            with open(args.child[1], "w", encoding="utf-8") as f:
                json.dump(result, f)
        return 0
    jobs = plan_jobs(args)
    results = [run_logged(job, args.python, args.timeout) for job in jobs if not job.get("adapters")]
    pairs = slora_pairs(jobs) if args.slora else []
    if args.slora and not pairs:
        print("note: --slora measures the one-rank llama benchmark model, which --family or --tp leave out",
              file=sys.stderr)
    slora = [run_logged(slora_job(base, with_adapters, args.slora_rounds), args.python, args.timeout, "SLoRA: ")
             for base, with_adapters in pairs]
    print(format_table(results))
    for r in results:
        if r.get("launcher_startup_ms") is not None:
            joined = f"joining MindSpore's cluster {r['cluster_join_s']:.1f} s, " if r["backend"] == "ms" else ""
            shared = f", host collectives {100 * r['collective_share']:.0f}% of the request" \
                if r.get("collective_share") else ""
            print(f"{r['backend']} x{r['world_size']} batch {r['batch']}: launcher start-up "
                  f"{r['launcher_startup_ms']:.0f} ms, {joined}model load {r['load_s']:.2f} s (rank 0){shared}; "
                  f"{one_rank_agreement(r, results)}")
    notes = sorted({"detokenisation on" if r.get("detokenize") else "no tokenizer: detokenisation off"
                    for r in results if "error" not in r})
    print(f"workload: {args.prompt_len}-token prompts, {args.steps} greedy new tokens (EOS ignored; fewer where "
          f"seq_length is shorter: steps = decode steps timed), {args.threads} threads; host = step - graph call; "
          f"batch a/b = a prompts in a graph of batch b; {', '.join(notes)}")
    if pairs:
        print(format_slora(slora_summary(slora)))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(results + slora, f, indent=2)
    return 1 if any("error" in r for r in results + slora) else 0


main = entry_point(command, "python tools/benchmark.py")


def run_logged(job: dict, python: Optional[str], timeout: int, prefix: str = "") -> dict:
    print(f"{prefix}measuring {job['backend']} batch {job.get('batch') or '(graph)'}: {job['model_dir']}",
          file=sys.stderr, flush=True)
    result = run_child(job, child_python(job["backend"], python), timeout)
    if "error" in result:
        print(f"  failed: {result['error']}", file=sys.stderr)
    return result


def plan_jobs(args) -> List[dict]:
    if args.model_dir and (args.make_bench_model or args.slora):
        raise ToolchainError("--model_dir benches those exports: not with --make-bench-model or --slora "
                             "(they bench the benchmark model)")
    if args.steps < 2 or args.prompt_len < 1:
        raise ToolchainError(f"--steps must be >= 2 and --prompt_len >= 1, got {args.steps} and {args.prompt_len}")
    if args.slora_rounds < 1:
        raise ToolchainError(f"--slora_rounds must be >= 1, got {args.slora_rounds}")
    backends = args.backend or list(BACKENDS)
    common = dict(prompt_len=args.prompt_len, new_tokens=args.steps, threads=args.threads,
                  warmup=args.warmup, no_detok=args.no_detok, lite_format=args.lite_format)
    if not args.model_dir:
        batches = args.batch or [1, 8]
        exports = make_bench_model(args.work_dir, backends, batches, args.kv_cache, args.rebuild,
                                   log=lambda msg: print(msg, file=sys.stderr, flush=True), world_sizes=args.tp,
                                   families=args.family, slora=args.slora)
        return [dict(common, family=f, backend=b, batch=n, world_size=r, adapters=a, model_dir=folder)
                for (f, b, n, r, a), folder in exports.items()]
    from lite_runtime.contract.manifest import load_manifest

    jobs = []
    for folder in args.model_dir:
        manifest = load_manifest(folder)
        graph_batch = manifest.batch_size
        for n in args.batch or [graph_batch]:
            if not 1 <= n <= graph_batch:
                raise ToolchainError(f"--batch {n}: the graphs of {folder} have batch size {graph_batch}; "
                                     f"allowed: 1..{graph_batch} prompts (rows beyond them are padding)")
            jobs += [dict(common, backend=b, batch=n, world_size=manifest.world_size,
                          model_dir=os.path.abspath(folder)) for b in backends]
    return jobs


if __name__ == "__main__":
    sys.exit(main())
