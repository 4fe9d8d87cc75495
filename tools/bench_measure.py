"""The measuring side of the decode benchmark: what one child process does with one export (see
tools/bench_decode.py, the parent that plans the jobs, builds the exports and prints the tables).

`measure(job)` times one warm request; `measure_pair(job)` (--slora) interleaves the decode steps
of two exports loaded side by side. The functions here never import mindspore unless the job's
backend is `ms`.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from lite_runtime.contract.errors import ToolchainError
from lite_runtime.tokenizers import export_tokenizer


class TimedPick:
    """The request's sampler with the seconds spent in it accumulated (host sampling time)."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.seconds = 0.0

    def __call__(self, logits, ids, lengths, prompt_lengths=None):
        start = time.perf_counter()
        tokens = self.sampler(logits, ids, lengths, prompt_lengths)
        self.seconds += time.perf_counter() - start
        return tokens


def bench_prompts(batch: int, prompt_len: int, vocab: int, seed: int = 0) -> List[List[int]]:
    """Random prompt ids above the usual special ids (0..2), one row each."""
    rng = np.random.default_rng(seed)
    return rng.integers(3, vocab, size=(batch, prompt_len)).tolist()


def request_state(m, inputs, prompts, new_tokens: int):
    """The decode state of one request of `new_tokens` per row, EOS ignored; the rows of an SLoRA
    export take its adapters in turn."""
    from lite_runtime.decode.generation import prepare_batch

    slots = m.dims.adapter_slots
    return prepare_batch(prompts, m.batch_size, m.seq_length, [new_tokens] * len(prompts), [],
                         int(m.pad_token_id), [1 + i % (slots - 1) for i in range(len(prompts))] if slots else None,
                         inputs)


def request_steps(session, inputs, prompts, new_tokens: int):
    """One greedy request of `new_tokens` per row, EOS ignored, run as the product runs it: on the
    engine for a packed export (pipeline(), run_infer_main and the server), in the static batch loop
    for the two-graph forms. Returns (an iterator of `Step`s, one after each step that gave tokens,
    and a function giving the seconds spent in the samplers so far)."""
    from lite_runtime.decode.generation import Step, generate_steps
    from lite_runtime.decode.sampling import Sampler, SamplingParams

    m = session.manifest
    if m.kv_cache != "packed":
        pick = TimedPick(Sampler(SamplingParams()))
        return generate_steps(session, inputs, request_state(m, inputs, prompts, new_tokens), pick), \
            lambda: pick.seconds
    from lite_runtime.decode.engine import Engine, EngineRequest

    engine, slots, produced = Engine(session, threaded=False, max_waiting=len(prompts)), m.dims.adapter_slots, {}
    # EOS ignored as the peers ignore it (transformers' and OpenVINO's min_new_tokens): never picked
    no_eos = dict(sampling=SamplingParams(min_tokens=new_tokens), stop_ids=frozenset(m.eos_token_id))
    for i, prompt in enumerate(prompts):     # the rows of an SLoRA export take its adapters in turn
        engine.submit(EngineRequest(list(prompt), new_tokens, adapter_slot=1 + i % (slots - 1) if slots else 0,
                                    on_token=lambda token, _, i=i: produced.__setitem__(i, token), **no_eos))

    def steps():
        tokens = np.zeros(len(prompts), np.int32)
        while engine.step():
            if produced:          # a step of prompt chunks only counts with the step that ends them
                active = np.zeros(len(prompts), bool)
                for i, token in produced.items():
                    tokens[i], active[i] = token, True
                produced.clear()
                yield Step(tokens.copy(), active)
    return steps(), lambda: engine.pick_seconds


def step_by_step(session, inputs, prompts, new_tokens: int) -> Callable[[], float]:
    """One greedy request on `session`, prefilled here, then advanced by one decode step per call of
    the function returned (which returns that step's seconds): `run_request`'s `between`."""
    steps, _ = request_steps(session, inputs, prompts, new_tokens)
    next(steps)

    def step() -> float:
        start = time.perf_counter()
        next(steps, None)
        return time.perf_counter() - start
    return step


def run_request(session, inputs, prompts, new_tokens: int, tokenizer=None,
                between: Optional[Callable[[], float]] = None) -> Dict[str, np.ndarray]:
    """One greedy request of `new_tokens` per row, EOS ignored (`request_steps`); per-step timings in seconds.

    Entry 0 of every array is the first token (prefill + sampling + detokenisation), the others are
    decode steps. `graph` is the time inside graph calls, `sample` inside the sampler, `detok` in
    the detokenisers; `wall - graph` is the host time of the step; `tokens` (steps, prompts) the ids. `between()` (e.g. one bare
    Predict, returning its seconds) runs after each decode step, outside the step's time, so both
    are measured side by side under the same machine load; its results are under `between`.
    """
    from lite_runtime.decode.streamers import RowDetokenizer

    steps, sampled = request_steps(session, inputs, prompts, new_tokens)
    detoks = [RowDetokenizer(tokenizer) for _ in prompts] if tokenizer is not None else []
    wall, graph, sample, detok, extra, tokens = [], [], [], [], [], []
    clock = time.perf_counter
    start, g0, s0 = clock(), session.graph_seconds, sampled()
    for step in steps:
        d0 = clock()
        tokens.append(step.tokens[:len(prompts)].copy())
        for row, decoder in enumerate(detoks):
            if step.active[row]:
                decoder.push([int(step.tokens[row])])
        end = clock()
        wall.append(end - start)
        graph.append(session.graph_seconds - g0)
        sample.append(sampled() - s0)
        detok.append(end - d0)
        if between is not None and len(wall) > 1:
            extra.append(between())
            end = clock()
        start, g0, s0 = end, session.graph_seconds, sampled()
    for decoder in detoks:
        decoder.flush()
    return {k: np.asarray(v) for k, v in (("wall", wall), ("graph", graph), ("sample", sample), ("detok", detok),
                                          ("between", extra), ("tokens", tokens))}


def _ms(values) -> Dict[str, float]:
    values = np.asarray(values) * 1e3
    return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90)),
            "mean": float(values.mean()), "min": float(values.min())}


def measure(job: dict) -> dict:
    """Load one export with one backend and time one warm request (the child's whole job)."""
    from lite_runtime.decode.inputs import InputOfInfer
    from lite_runtime.contract.manifest import load_manifest

    manifest = load_manifest(job["model_dir"])
    batch = job.get("batch") or manifest.batch_size
    prompt_len, new_tokens = job["prompt_len"], fit_new_tokens(job, manifest)
    rank, join_s = 0, 0.0
    if job.get("world_size", 1) > 1 and job["backend"] == "ms":
        from bench_ranks import join_cluster
        start = time.perf_counter()
        rank = join_cluster()
        join_s = time.perf_counter() - start
    elif job.get("world_size", 1) > 1:       # Lite segments: the ranks join over MPI as the session loads
        rank = int(os.environ["RANK_ID"])
    start = time.perf_counter()
    session = open_session(job, manifest, rank)
    load_s = time.perf_counter() - start
    tokenizer = None
    if manifest.tokenizer_path() and not job.get("no_detok"):
        tokenizer = export_tokenizer(manifest)
    vocab = manifest.dims.vocab_size if tokenizer is None else min(manifest.dims.vocab_size, tokenizer.vocab_size)
    prompts = job.get("prompts") or bench_prompts(batch, prompt_len, vocab)
    inputs = InputOfInfer.get_inputs(manifest.family, manifest)
    bare = getattr(session, "bare_decode_predict", None)   # mslite: one Predict on inputs already bound
    for _ in range(job["warmup"]):
        run_request(session, inputs, prompts, min(new_tokens, 8), tokenizer, bare)
    collective_s = getattr(session, "collective_seconds", 0.0)
    t = run_request(session, inputs, prompts, new_tokens, tokenizer, bare)
    collective_s = getattr(session, "collective_seconds", 0.0) - collective_s
    steps = {k: v[1:] for k, v in t.items() if k not in ("between", "tokens")}
    decode_total = float(steps["wall"].sum())
    result = dict(
        family=manifest.family, backend=job["backend"], model_dir=job["model_dir"], rank=rank, world_size=manifest.world_size,
        cluster_join_s=join_s, batch=batch, graph_batch=manifest.batch_size,
        seq_length=manifest.seq_length, kv_cache=manifest.kv_cache, mindspore_version=manifest.mindspore_version,
        prompt_len=prompt_len, new_tokens=new_tokens, decode_steps=int(len(steps["wall"])),
        threads=job["threads"], detokenize=tokenizer is not None, load_s=load_s,
        ttft_ms=float(t["wall"][0] * 1e3), ttft_graph_ms=float(t["graph"][0] * 1e3),
        step_ms=_ms(steps["wall"]), graph_ms=_ms(steps["graph"]),
        host_ms=_ms(steps["wall"] - steps["graph"]),
        sample_ms=_ms(steps["sample"]), detok_ms=_ms(steps["detok"]),
        tok_s=batch * len(steps["wall"]) / decode_total if decode_total > 0 else None,
        e2e_tok_s=batch * new_tokens / float(t["wall"].sum()),
        bare_predict_ms=None, step_over_bare=None, tokens=t["tokens"].T.tolist(),
        collective_share=collective_s / float(t["wall"].sum()),   # host collectives (Lite segments) / request
    )
    if bare is not None:
        result["bare_predict_ms"] = _ms(t["between"])
        result["step_over_bare"] = result["step_ms"]["median"] / result["bare_predict_ms"]["median"]
    session.close()
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    result["mindspore_in_process"] = "mindspore" in sys.modules
    return result


def fit_new_tokens(job: dict, manifest) -> int:
    """The job's new tokens, fewer when the export's seq_length has no room for them (with a note)."""
    prompt_len, new_tokens = job["prompt_len"], job["new_tokens"]
    if prompt_len >= manifest.seq_length:
        raise ToolchainError(f"--prompt_len {prompt_len} leaves no room in seq_length {manifest.seq_length} "
                             f"of {manifest.root}")
    if prompt_len + new_tokens - 1 > manifest.seq_length:   # the last token needs no cache slot
        new_tokens = manifest.seq_length - prompt_len + 1
        print(f"note: {manifest.root} has seq_length {manifest.seq_length}: {new_tokens} new tokens after "
              f"a {prompt_len}-token prompt (not {job['new_tokens']})", file=sys.stderr)
    return new_tokens


def open_session(job: dict, manifest, rank: int = 0):
    """The export on the job's backend; the ranks of a multi-rank export share the CPU threads."""
    from lite_runtime.backends import load_session

    options = {"lite_format": job["lite_format"]} if job["backend"] == "mslite" else {}
    threads = max(1, job["threads"] // manifest.world_size)
    return load_session(job["backend"], manifest, rank, num_threads=threads, **options)


def measure_pair(job: dict) -> dict:
    """--slora's child job: the export without and with adapters (`model_dirs`) loaded side by side.
    Each round is one request on one of them with, after each of its decode steps, the same step of
    the same request on the other (the one that leads alternates), so that both are timed under the
    same machine load; per round, each export's median decode step."""
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.inputs import InputOfInfer

    manifests = [load_manifest(folder) for folder in job["model_dirs"]]
    new_tokens = fit_new_tokens(job, manifests[0])
    sessions = [open_session(job, m) for m in manifests]
    prompts = bench_prompts(job["batch"], job["prompt_len"], manifests[0].dims.vocab_size)
    inputs = InputOfInfer.get_inputs(manifests[0].family, manifests[0])
    for session in sessions:
        for _ in range(job["warmup"]):
            run_request(session, inputs, prompts, min(new_tokens, 8))
    rounds = []
    for round_ in range(job["rounds"]):
        lead = round_ % 2
        follow = step_by_step(sessions[1 - lead], inputs, prompts, new_tokens)
        t = run_request(sessions[lead], inputs, prompts, new_tokens, between=follow)
        steps = {lead: t["wall"][1:], 1 - lead: t["between"]}
        rounds.append(dict(base_ms=float(np.median(steps[0]) * 1e3), slora_ms=float(np.median(steps[1]) * 1e3)))
    for session in sessions:
        session.close()
    return dict(backend=job["backend"], batch=job["batch"], model_dirs=job["model_dirs"], rank=0,
                adapter_slots=manifests[1].dims.adapter_slots, new_tokens=new_tokens, rounds=rounds)
