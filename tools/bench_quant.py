"""Decode with quantized weights on Lite: one model exported per weight scheme, measured side by side.

    .venv/bin/python tools/bench_quant.py [--gguf build/models/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--work_dir build/bench_quant] [--schemes none int8 int4] [--batch 1 8] [--rounds 3]

Exports the model (`model: {gguf: ...}`, target cpu: the packed step as .ms) once per scheme of
`quantization.weights` (none: Lite's own MatMul; int8 and int4 with --group_size), kept in --work_dir for
later runs. A scheme may end in `+head` (`quantization.head: int8`) or `+head+embedding` (the embedding
in int8 as well): `int8+head+embedding`; `+attn` exports with `attention: kernel`, `+paged` with `attention:
paged` (the paged KV store; without either, `attention: graph`). Then, round after round, every depth, batch and scheme in turn, each in a child process of its own
under /usr/bin/time: the prompt on each row (one request a row, fed in one step), --new_tokens greedy tokens
(EOS ignored) through `Session.step` (idle cache rows cost nothing), 2 threads. The prompt is a 31-token
sentence, or with `--depths 31 1000 2000` one prompt of each length cut from the start of docs/*.md (joined
in sorted order, the export's tokenizer); the exports' seq_length is the longest prompt plus --new_tokens,
rounded up to 256. Prints per scheme, batch and depth the median decode ms per step, TTFT, peak RSS, the
same-round ratios to the first scheme, and how many greedy tokens of row 0 equal, before the first
difference, the first scheme's and the reference's.

The reference: transformers' greedy tokens after the same prompt on the same GGUF in float32 (a process of
its own before the timed runs, cached in --work_dir). Every timed run's row-0 tokens are counted against it
(`k/N`); a float32 export (`none`, `float32`) with float32 K/V and llama.cpp at F32 must equal it, else its
row says TOKENS DIFFER and the tool exits 1. `--kv_cache_dtype float32 float16` runs every export with each
dtype of its paged KV store (rows `NAME kv float16`). `--reference none` skips the check (a model transformers cannot load).
`--accuracy TEXT_FILE` measures instead each scheme's top-1 agreement with the first one
and its perplexity, teacher-forced over --accuracy_tokens tokens of the text (one slice per cache row), and
so llama.cpp's at each --llama_cpp type (the same slices, our tokenizer's ids), with each --llama_kv type of
its K/V cache (`--llama_kv f16 q8_0`: rows `llama.cpp Q8_0 kv q8_0`; flash attention on at every type, as
a q8_0 V cache needs it).

`--llama_cpp Q4_1 Q8_0 F32` adds llama.cpp (llama-cpp-python in the peers venv, `make peers`) at each batch
on the same GGUF: the file as it is when its type is asked for, else a copy requantized (or dequantized)
by llama.cpp's own quantizer into --work_dir, fed the same prompt ids on each row, timed per decode call.
`--peers ort_int4 openvino_int8 openvino_int4 --hf_dir HF_DIR` adds ONNX Runtime GenAI's int4 (its model
builder, blocks of 32, x rounded to int8) and OpenVINO GenAI with NNCF's int8 / int4 weights (int4 in groups
of 32), built from that Hugging Face folder of the same model (tools/peer_runtimes.py), at each batch, fed the
same ids.
`--plot FILE.png` draws the decode ms/step and the peak RSS against the depth, a line per side and batch.
`--reference F16` also compares every run's logits after the prompt with llama.cpp's at that type (cosine and
top-1): on a random model, whose near-flat logits let any rounding change the greedy tokens, and at sizes
whose float32 export this machine cannot hold (`tools/random_hf_llama.py --gguf`); there `--reference F16
none` drops the token check.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MS20 = os.path.join(REPO, ".venv-ms20", "bin", "python")
PEERS = os.path.join(REPO, ".venv-peers", "bin", "python")
PEER_TOOL = os.path.join(REPO, "tools", "peer_runtimes.py")
LLAMA_FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7}   # llama.cpp's LLAMA_FTYPE_ALL_F32, _MOSTLY_*
LLAMA_KV_TYPES = {"f16": 1, "q8_0": 8}      # its K/V cache's: ggml's GGML_TYPE_F16, GGML_TYPE_Q8_0
DEFAULT_SEQ = 256
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
          "combined movable metal type with an oil-based ink and a wooden press.")


def export(gguf: str, work: str, scheme: str, group: int, batch: int, seq: int) -> str:
    weights, *parts = scheme.split("+")       # e.g. int8+head+embedding+attn
    if any(part not in ("head", "embedding", "attn", "paged") for part in parts):
        raise SystemExit(f"error: --schemes {scheme!r}: a weights scheme, then +head and +embedding (in int8), "
                         "+attn (attention: kernel) or +paged (attention: paged)")
    quantization = {"weights": weights}
    grid = ""
    if weights in ("int8", "int4"):      # the head and the embedding as the scheme names them (their default: int8)
        quantization.update({part: "int8" if part in parts else "float32" for part in ("head", "embedding")},
                            group_size=group)
        grid = "_channel" if group == -1 else f"_g{group}"
    # Folders of the default seq_length keep the names of earlier runs (the docs name some of them).
    out = os.path.join(work, "_".join([weights + grid] + parts + ([] if seq == DEFAULT_SEQ else [f"seq{seq}"])))
    if os.path.isfile(os.path.join(out, "manifest.json")):
        from lite_runtime.contract.manifest import load_manifest
        manifest = load_manifest(out)
        if manifest.seq_length != seq or manifest.batch_size < batch:
            raise SystemExit(f"error: {out} was exported with seq_length {manifest.seq_length} and batch_size "
                             f"{manifest.batch_size}; this run needs {seq} and {batch}: remove the folder")
        return out
    yaml = out + ".yaml"
    with open(yaml, "w") as f:
        json.dump({"model": {"gguf": os.path.abspath(gguf)}, "target": "cpu", "seq_length": seq, "batch_size": batch,
                   "quantization": quantization, "attention": "kernel" if "attn" in parts else "paged" if "paged" in parts else "graph",
                   "output_dir": out}, f)
    start = time.perf_counter()
    if subprocess.run([MS20, "-m", "exporter", "--config", yaml], cwd=REPO, stdout=subprocess.DEVNULL).returncode:
        raise SystemExit(1)     # the exporter printed its one-line error, naming the yaml
    print(f"exported {scheme} to {out} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return out


def lite_session(export_dir: str, threads: int):
    """The export's Lite session; EXPORT may end in `@float16` (a kv_cache_dtype of its paged store) and `@a8`
    (int8_activations)."""
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    folder, *options = export_dir.split("@")
    manifest = load_manifest(folder)
    kv = [o for o in options if o != "a8"]
    return manifest, load_session("mslite", manifest, num_threads=threads, int8_activations="a8" in options,
                                  **({"kv_cache_dtype": kv[0]} if kv else {}))


def child(export_dir: str, ids_file: str, batch: int, new_tokens: int, threads: int) -> None:
    """Runs in its own process: prints one JSON line of timings and row 0's tokens. The prompts go as the
    engine feeds a prompt alone: on the paged store in calls of LONE_CHUNK tokens (the rows' together), else
    whole."""
    import numpy as np
    from lite_runtime.backends.paged_cache import PagedKVCache
    from lite_runtime.decode.scheduler import LONE_CHUNK
    manifest, session = lite_session(export_dir, threads)
    ids = read_ids(ids_file)
    rows = manifest.batch_size
    width = max(1, LONE_CHUNK // batch) if isinstance(session.cache, PagedKVCache) else len(ids)
    past = np.zeros(rows, np.int32)
    start = time.perf_counter()
    for at in range(0, len(ids), width):
        piece = ids[at:at + width]
        counts = np.array([len(piece)] * batch + [0] * (rows - batch), np.int32)
        tokens = np.zeros((rows, len(piece)), np.int32)
        tokens[:batch] = piece
        logits = session.step(tokens, counts, past)
        past = past + counts
    ttft = time.perf_counter() - start
    first = logits[0].tolist()
    ones = (counts > 0).astype(np.int32)
    steps, out = [], [int(logits[0].argmax())]
    for _ in range(new_tokens):
        nxt = logits.argmax(-1).astype(np.int32).reshape(-1, 1)
        start = time.perf_counter()
        logits = session.step(nxt, ones, past)
        steps.append(time.perf_counter() - start)
        past = past + ones
        out.append(int(logits[0].argmax()))
    print(json.dumps({"ttft_ms": ttft * 1e3, "step_ms": statistics.median(steps) * 1e3, "tokens": out,
                      "first": first}))


def prompts(export_dir: str, depths: list, work: str) -> dict:
    """{prompt length: a file of its token ids} by the export's tokenizer, written into `work` for every process
    that runs it: the 31-token sentence without `depths`, else the start of docs/*.md cut at each depth."""
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.tokenizers import export_tokenizer
    tokenizer = export_tokenizer(load_manifest(export_dir.partition("@")[0]))
    if not depths:
        cuts = [tokenizer.encode(PROMPT)[:31]]
    else:
        docs = os.path.join(REPO, "docs")
        text = "\n\n".join(open(os.path.join(docs, name), encoding="utf-8").read()
                            for name in sorted(os.listdir(docs)) if name.endswith(".md"))
        ids = tokenizer.encode(text)
        if len(ids) < max(depths):
            raise SystemExit(f"error: --depths {max(depths)}: docs/*.md make only {len(ids)} tokens")
        cuts = [ids[:depth] for depth in depths]
    files = {}
    for ids in cuts:
        files[len(ids)] = os.path.join(work, f"prompt_{len(ids)}.json")
        with open(files[len(ids)], "w", encoding="utf-8") as f:
            json.dump(ids, f)
    return files


def read_ids(ids_file: str) -> list:
    with open(ids_file, encoding="utf-8") as f:
        return json.load(f)


def llama_child(gguf: str, ids_file: str, batch: int, new_tokens: int, threads: int) -> None:
    """Runs in the peers venv: llama.cpp on `batch` sequences of the prompt (one decode call a step for all of
    them, each sequence its own cache), one JSON line as child() prints."""
    import llama_cpp as lc
    import numpy as np
    ids = read_ids(ids_file)
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(gguf.encode(), lc.llama_model_default_params())
    params = lc.llama_context_default_params()
    per_sequence = -(-(len(ids) + new_tokens) // 256) * 256
    params.n_ctx, params.n_batch, params.n_seq_max = per_sequence * batch, per_sequence * batch, batch
    params.n_threads = params.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, params)
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    calls = lc.llama_batch_init(len(ids) * batch, 0, 1)

    def decode(rows: list, position: int) -> np.ndarray:
        """rows[r]: sequence r's next tokens from `position`; returns each sequence's last logits."""
        n, last = 0, []
        for r, tokens in enumerate(rows):
            for i, token in enumerate(tokens):
                calls.token[n], calls.pos[n], calls.n_seq_id[n] = token, position + i, 1
                calls.seq_id[n][0], calls.logits[n] = r, i == len(tokens) - 1
                n += 1
            last.append(n - 1)
        calls.n_tokens = n
        if lc.llama_decode(ctx, calls) != 0:
            raise SystemExit(f"error: llama_decode failed on {gguf}")
        return np.stack([np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(vocab,)) for i in last])
    start = time.perf_counter()
    logits = decode([ids] * batch, 0)
    ttft = time.perf_counter() - start
    first = logits[0].tolist()
    out, steps = [int(logits[0].argmax())], []
    for t in range(new_tokens):
        nxt = [[int(i)] for i in logits.argmax(-1)]
        start = time.perf_counter()
        logits = decode(nxt, len(ids) + t)
        steps.append(time.perf_counter() - start)
        out.append(int(logits[0].argmax()))
    print(json.dumps({"ttft_ms": ttft * 1e3, "step_ms": statistics.median(steps) * 1e3, "tokens": out,
                      "first": first}))


def peer_model(peer: str, hf_dir: str, work: str, threads: int) -> str:
    """The model of a --peers runtime ("ort_int4", "openvino_int8", ...) built from `hf_dir` in --work_dir."""
    out = os.path.join(work, peer)
    runtime, weights = peer.split("_")
    if not os.path.isdir(out):
        extra = [str(threads), weights] if runtime == "ort" else [weights]
        subprocess.run([PEERS, PEER_TOOL, runtime, os.path.abspath(hf_dir), out + ".part"] + extra, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.replace(out + ".part", out)
    return out


def measure_peer(peer: str, model_dir: str, ids: list, batch: int, new_tokens: int, threads: int) -> dict:
    """One run of a --peers runtime (tools/peer_runtimes.py measure) as measure() reports it (no logits)."""
    job, out = os.path.join(model_dir, "job.json"), os.path.join(model_dir, "result.json")
    with open(job, "w", encoding="utf-8") as f:
        json.dump({"runtime": peer.split("_")[0], "model_dir": model_dir, "prompts": [ids] * batch, "warmup": 1,
                   "new_tokens": new_tokens, "threads": threads}, f)
    result = subprocess.run([PEERS, PEER_TOOL, "measure", job, out], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: measuring {model_dir} at batch {batch} failed: {result.stderr.strip()[-500:]}")
    with open(out, encoding="utf-8") as f:
        got = json.load(f)
    return {"ttft_ms": got["ttft_ms"], "step_ms": got["step_ms"]["median"], "rss_mb": got["peak_rss_mb"],
            "tokens": got["tokens"][0], "first": None}


def llama_file(gguf: str, work: str, ftype: str) -> str:
    """The GGUF itself when it is of type `ftype` (its file name says), else llama.cpp's requantized copy."""
    if f".{ftype}.".lower() in os.path.basename(gguf).lower():
        return gguf
    out = os.path.join(work, f"llama_{ftype}.gguf")
    if not os.path.isfile(out):
        code = ("import sys, llama_cpp as l\np = l.llama_model_quantize_default_params()\n"
                "p.ftype = int(sys.argv[3]); p.allow_requantize = True\n"
                "sys.exit(l.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))")
        subprocess.run([PEERS, "-c", code, gguf, out + ".part", str(LLAMA_FTYPES[ftype])], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.replace(out + ".part", out)
    return out


def teacher_text(export_dir: str, text_file: str, tokens: int) -> tuple:
    """(ids of the text's first rows x length + 1 tokens, rows, length): `tokens` tokens cut into one slice per
    cache row of the export, by its tokenizer."""
    import numpy as np
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.tokenizers import export_tokenizer
    manifest = load_manifest(export_dir.partition("@")[0])
    ids = export_tokenizer(manifest).encode(open(text_file, encoding="utf-8").read())
    rows = manifest.batch_size
    length = min(tokens, len(ids) - 1) // rows
    return np.array(ids[: rows * length + 1], np.int64), rows, length


def scored(logits, target) -> tuple:
    """(greedy choices, summed negative log-likelihood of `target`) of logits (n, vocab)."""
    import numpy as np
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1)
    logz = top + np.log(np.exp(logits - top[:, None]).sum(-1))
    return logits.argmax(-1), float((logz - logits[np.arange(len(target)), target]).sum())


def accuracy_child(export_dir: str, text_file: str, tokens: int, threads: int) -> None:
    """Teacher-forced over `tokens` tokens of a text, cut into one slice per cache row: each position's
    greedy choice and the negative log-likelihood of the text's next token."""
    import numpy as np
    text, rows, length = teacher_text(export_dir, text_file, tokens)
    session = lite_session(export_dir, threads)[1]
    ones, past = np.ones(rows, np.int32), np.zeros(rows, np.int32)
    choices, nll = np.zeros((rows, length), np.int64), 0.0
    for t in range(length):
        feed = text[np.arange(rows) * length + t].astype(np.int32).reshape(-1, 1)
        logits = session.step(feed, ones, past)
        past = past + 1
        choices[:, t], step_nll = scored(logits, text[np.arange(rows) * length + t + 1])
        nll += step_nll
    print(json.dumps({"choices": choices.ravel().tolist(), "nll": nll / (rows * length), "tokens": rows * length}))


def llama_accuracy_child(gguf: str, slices: list, threads: int) -> None:
    """Runs in the peers venv: accuracy_child's measure for llama.cpp on the GGUF (`FILE@KV`: its K/V cache of
    that type, f16 without), `slices` the rows' token ids (each its length + 1), each a sequence of its own
    decoded in one call, logits at every position."""
    import llama_cpp as lc
    import numpy as np
    gguf, _, kv = gguf.partition("@")
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(gguf.encode(), lc.llama_model_default_params())
    length, rows = len(slices[0]) - 1, len(slices)
    params = lc.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_seq_max = rows * -(-length // 256) * 256, rows * length, rows
    params.n_threads = params.n_threads_batch = threads
    params.type_k = params.type_v = LLAMA_KV_TYPES[kv or "f16"]
    # A quantized V cache needs flash attention; on for every K/V type, so that f16 compares like with like.
    params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = lc.llama_init_from_model(model, params)
    vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    calls = lc.llama_batch_init(rows * length, 0, 1)
    for n, (r, t) in enumerate((r, t) for r in range(rows) for t in range(length)):
        calls.token[n], calls.pos[n], calls.n_seq_id[n] = slices[r][t], t, 1
        calls.seq_id[n][0], calls.logits[n] = r, True
    calls.n_tokens = rows * length
    if lc.llama_decode(ctx, calls) != 0:
        raise SystemExit(f"error: llama_decode failed on {gguf}")
    logits = np.stack([np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(vocab,))
                       for i in range(rows * length)])
    choices, nll = scored(logits, np.array([s[t + 1] for s in slices for t in range(length)]))
    print(json.dumps({"choices": choices.reshape(rows, length).ravel().tolist(), "nll": nll / (rows * length),
                      "tokens": rows * length}))


def accuracy(exports: dict, text_file: str, tokens: int, threads: int, llama: dict) -> None:
    """Each export's (and each of `llama`'s GGUFs' on llama.cpp) greedy choices teacher-forced over the text,
    against the first export's, and perplexity."""
    got, slices = {}, None
    if llama:
        text, rows, length = teacher_text(next(iter(exports.values())), text_file, tokens)
        slices = json.dumps([text[r * length: (r + 1) * length + 1].tolist() for r in range(rows)])
    commands = {name: [sys.executable, os.path.abspath(__file__), "--accuracy_child", folder, text_file, str(tokens),
                       str(threads)] for name, folder in exports.items()}
    commands.update({name: [PEERS, os.path.abspath(__file__), "--llama_accuracy_child", path, slices, str(threads)]
                     for name, path in llama.items()})
    for name, command in commands.items():
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"error: teacher-forcing {name} failed: {result.stderr.strip()[-500:]}")
        got[name] = json.loads(result.stdout.strip().splitlines()[-1])
    base = next(iter(got))
    print(f"teacher-forced over {got[base]['tokens']} tokens of {os.path.basename(text_file)}:")
    print(f"| weights | top-1 agreement with {base} | perplexity |")
    print("|---|---|---|")
    for name, g in got.items():
        agree = sum(a == b for a, b in zip(g["choices"], got[base]["choices"])) / len(g["choices"])
        print(f"| {name} | {100 * agree:.1f} % | {math.exp(g['nll']):.3f} |")


def measure(export_dir: str, ids_file: str, batch: int, new_tokens: int, threads: int, llama=False) -> dict:
    """One run in a child under /usr/bin/time; `llama`: export_dir is a GGUF for llama.cpp."""
    python, flag = (PEERS, "--llama_child") if llama else (sys.executable, "--child")
    command = ["/usr/bin/time", "-f", "%M", python, os.path.abspath(__file__), flag, export_dir, ids_file,
               str(batch), str(new_tokens), str(threads)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: measuring {export_dir} at batch {batch} failed: {result.stderr.strip()[-500:]}")
    got = json.loads(result.stdout.strip().splitlines()[-1])
    got["rss_mb"] = int(result.stderr.strip().splitlines()[-1]) / 1024
    return got


def reference_child(gguf: str, steps: int, ids_files: list) -> None:
    """Runs in its own process: transformers' greedy tokens (float32, a KV cache, EOS ignored) after each
    prompt, on the GGUF as transformers reads it; one JSON line, a list of tokens per prompt."""
    import torch
    from transformers import AutoModelForCausalLM
    folder, name = os.path.split(os.path.abspath(gguf))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    got = []
    with torch.no_grad():
        for ids_file in ids_files:
            tokens, past, feed = [], None, torch.tensor([read_ids(ids_file)])
            for _ in range(steps):
                out = model(feed, past_key_values=past, use_cache=True, logits_to_keep=1)
                past = out.past_key_values
                tokens.append(int(out.logits[0, -1].argmax()))
                feed = torch.tensor([[tokens[-1]]])
            got.append(tokens)
    print(json.dumps(got))


def reference_tokens(gguf: str, work: str, ids_files: dict, new_tokens: int) -> dict:
    """{depth: transformers' greedy tokens after that prompt}, as many as a timed run gives (the pick after the
    prompt, then one a step); computed once for the GGUF, prompt and new_tokens, then read from `work`."""
    stat = os.stat(gguf)
    caches = {}
    for depth, ids_file in ids_files.items():
        key = json.dumps([os.path.realpath(gguf), stat.st_size, stat.st_mtime_ns, new_tokens, read_ids(ids_file)])
        caches[depth] = os.path.join(work, f"reference_{depth}_{hashlib.sha1(key.encode()).hexdigest()[:16]}.json")
    missing = [depth for depth, cache in caches.items() if not os.path.isfile(cache)]
    if missing:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, os.path.abspath(__file__), "--reference_child", gguf,
                                 str(new_tokens + 1)] + [ids_files[depth] for depth in missing],
                                cwd=REPO, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"error: transformers could not compute the reference tokens on {gguf}: "
                             f"{result.stderr.strip()[-500:]}\n(--reference none skips the token check, on a "
                             "model transformers cannot load)")
        for depth, tokens in zip(missing, json.loads(result.stdout.strip().splitlines()[-1])):
            with open(caches[depth], "w", encoding="utf-8") as f:
                json.dump(tokens, f)
        print(f"reference tokens by transformers at depths {missing} in {time.perf_counter() - start:.0f} s",
              file=sys.stderr)
    return {depth: read_ids(cache) for depth, cache in caches.items()}


def float32_export(export_dir: str) -> bool:
    """Whether an export's weights are all float32 (the head and embedding are int8 only beside int8 or int4), run
    with float32 K/V (host arrays, or a paged store given `@float32`)."""
    from lite_runtime.contract.manifest import load_manifest
    folder, *options = export_dir.split("@")
    manifest = load_manifest(folder)
    return manifest.quantization.get("weights", "none") in ("none", "float32") and (
        not manifest.dims.kv_block or "float32" in options)


def same_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", default=os.path.join(REPO, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--work_dir", default=os.path.join(REPO, "build", "bench_quant"))
    p.add_argument("--schemes", nargs="*", default=["none", "int8", "int4"],
                   help="exported here first (none: only the --extra exports are measured)")
    p.add_argument("--group_size", type=int, default=32)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--depths", type=int, nargs="+", metavar="TOKENS",
                   help="prompt lengths, each cut from docs/*.md (default: one 31-token sentence)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seq_length", type=int, help="of the exports (default: the longest prompt + --new_tokens, "
                   f"rounded up to a multiple of {DEFAULT_SEQ})")
    p.add_argument("--extra", nargs="*", default=[], metavar="NAME=DIR",
                   help="more exports measured beside the schemes' (e.g. another head choice)")
    p.add_argument("--plot", metavar="PNG", help="also draw decode ms/step and peak RSS against the depth, a line per "
                   "side and batch (tools/bench_plot.py)")
    p.add_argument("--int8_activations", action="store_true", help="each int8 scheme also with its products on int8 "
                   "activations (rows `NAME a8`; AVX512-VNNI)")
    p.add_argument("--kv_cache_dtype", nargs="*", default=[], metavar="DTYPE",
                   help="run each export with each of these dtypes of its paged KV store (default: the runtime's)")
    p.add_argument("--accuracy", metavar="TEXT_FILE", help="instead of timing: top-1 agreement with the first "
                   "scheme and perplexity, teacher-forced over --accuracy_tokens tokens of this text")
    p.add_argument("--accuracy_tokens", type=int, default=1024)
    p.add_argument("--accuracy_child", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--llama_accuracy_child", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--child", nargs=5, metavar=("EXPORT", "IDS_FILE", "BATCH", "NEW_TOKENS", "THREADS"),
                   help=argparse.SUPPRESS)
    p.add_argument("--reference_child", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--llama_cpp", nargs="*", default=[], choices=sorted(LLAMA_FTYPES),
                   help="llama.cpp on the GGUF in these types (needs the peers venv: make peers)")
    p.add_argument("--llama_kv", nargs="*", default=[], choices=sorted(LLAMA_KV_TYPES),
                   help="with --accuracy: llama.cpp at each --llama_cpp type with each of these types of its K/V "
                   "cache (default: f16)")
    p.add_argument("--peers", nargs="*", default=[], choices=["ort_int4", "openvino_int8", "openvino_int4"],
                   help="quantized peers built from --hf_dir (needs the peers venv)")
    p.add_argument("--hf_dir", help="a Hugging Face folder of the GGUF's model, for --peers")
    p.add_argument("--reference", nargs="+", default=[], choices=sorted(LLAMA_FTYPES) + ["none"],
                   metavar="TYPE|none",
                   help="none: no check of the tokens against transformers' (a model it cannot load); a llama.cpp "
                   "type: compare every run's logits after the prompt with llama.cpp's at this type as well (e.g. "
                   "F16: the model unquantized, where ours cannot hold it)")
    p.add_argument("--llama_child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.llama_child:
        a = args.llama_child
        return llama_child(a[0], a[1], int(a[2]), int(a[3]), int(a[4]))
    if args.llama_accuracy_child:
        a = args.llama_accuracy_child
        return llama_accuracy_child(a[0], json.loads(a[1]), int(a[2]))
    if args.reference_child:
        a = args.reference_child
        return reference_child(a[0], int(a[1]), a[2:])
    if args.child or args.accuracy_child:
        sys.path.insert(0, REPO)
        if args.accuracy_child:
            a = args.accuracy_child
            return accuracy_child(a[0], a[1], int(a[2]), int(a[3]))
        a = args.child
        return child(a[0], a[1], int(a[2]), int(a[3]), int(a[4]))
    from lite_runtime.contract.families import KV_CACHE_DTYPES      # not in the peers' venv, whose children run here
    wrong = [d for d in args.kv_cache_dtype if d not in KV_CACHE_DTYPES]
    if wrong:
        raise SystemExit(f"error: --kv_cache_dtype {wrong[0]!r}: allowed: {', '.join(KV_CACHE_DTYPES)}")
    if args.llama_kv and not args.accuracy:
        raise SystemExit(f"error: --llama_kv {' '.join(args.llama_kv)}: only with --accuracy")
    check_tokens = "none" not in args.reference
    llama_reference = [t for t in args.reference if t != "none"]
    if len(llama_reference) > 1:
        raise SystemExit(f"error: --reference {' '.join(args.reference)}: one llama.cpp type at most")
    needed = -(-(max(args.depths or [31]) + args.new_tokens) // DEFAULT_SEQ) * DEFAULT_SEQ
    if args.seq_length is not None and args.seq_length < needed:
        raise SystemExit(f"error: --seq_length {args.seq_length}: prompts of {max(args.depths or [31])} tokens "
                         f"and {args.new_tokens} new tokens need {needed}")
    os.makedirs(args.work_dir, exist_ok=True)
    exports = {s: export(args.gguf, args.work_dir, s, args.group_size, max(args.batch), args.seq_length or needed)
               for s in args.schemes}
    exports.update(item.split("=", 1) for item in args.extra)
    if args.kv_cache_dtype:      # each export with each dtype of its paged store
        exports = {f"{name} kv {kv}": f"{folder}@{kv}" for name, folder in exports.items() for kv in args.kv_cache_dtype}
    if args.int8_activations:    # each int8 export also with its products on int8 activations
        exports.update({f"{name} a8": f"{folder}@a8" for name, folder in list(exports.items()) if name.startswith("int8")})
    args.schemes = list(exports)
    if (args.llama_cpp or llama_reference or args.peers) and not os.path.isfile(PEERS):
        raise SystemExit(f"error: --llama_cpp, --reference {'/'.join(sorted(LLAMA_FTYPES))} and --peers need the "
                         f"peers venv {PEERS}: run `make peers` (it builds llama-cpp-python)")
    llama = {f"llama.cpp {t}": llama_file(args.gguf, args.work_dir, t) for t in args.llama_cpp}
    if args.llama_kv:       # each llama.cpp type with each type of its K/V cache
        llama = {f"{name} kv {kv}": f"{path}@{kv}" for name, path in llama.items() for kv in args.llama_kv}
    if args.accuracy:
        return accuracy(exports, os.path.abspath(args.accuracy), args.accuracy_tokens, args.threads, llama)
    if args.rounds < 1:
        return 0
    if args.peers and not os.path.isfile(os.path.join(args.hf_dir or "", "config.json")):
        raise SystemExit(f"error: --peers needs --hf_dir, a Hugging Face folder of the model; {args.hf_dir!r} "
                         "has no config.json")
    peers = {p: peer_model(p, args.hf_dir, args.work_dir, args.threads) for p in args.peers}
    ids_files = prompts(exports[args.schemes[0]], args.depths, args.work_dir)
    depths = list(ids_files)
    expected = reference_tokens(args.gguf, args.work_dir, ids_files, args.new_tokens) if check_tokens else {}
    # tokens that must equal transformers': float32 weights, ours or llama.cpp's
    exact = {s for s in args.schemes if float32_export(exports[s])} | ({"llama.cpp F32"} & set(llama))
    logits = {}
    if llama_reference:       # the prompt's last logits of the model as llama.cpp runs it at that type
        path = llama_file(args.gguf, args.work_dir, llama_reference[0])
        logits = {d: np.array(measure(path, ids_files[d], 1, 1, args.threads, llama=True)["first"]) for d in depths}
    results = {(s, b, d): [] for s in args.schemes + list(llama) + list(peers) for b in args.batch for d in depths}
    for r in range(args.rounds):
        for d in depths:
            for b in args.batch:
                for s in args.schemes:
                    results[(s, b, d)].append(measure(exports[s], ids_files[d], b, args.new_tokens, args.threads))
                for name, path in llama.items():
                    results[(name, b, d)].append(measure(path, ids_files[d], b, args.new_tokens, args.threads,
                                                         llama=True))
                for name, path in peers.items():
                    results[(name, b, d)].append(measure_peer(name, path, read_ids(ids_files[d]), b,
                                                              args.new_tokens, args.threads))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    args.schemes += list(llama) + list(peers)
    base = args.schemes[0]
    prompt = f"prompts of {', '.join(map(str, depths))} tokens of docs/*.md" if args.depths else \
        f"a {depths[0]}-token prompt"
    print(f"{os.path.basename(args.gguf)}: {args.new_tokens} new tokens after {prompt}, {args.threads} threads, "
          f"{args.rounds} rounds (medians; ratios to {base} of the same round); "
          + ("tokens against transformers' float32 greedy ones, every round" if check_tokens else
             "tokens unchecked (--reference none)"))
    against = f" | first logits vs llama.cpp {llama_reference[0]}: cosine, top-1" if llama_reference else ""
    print(f"| weights | batch | depth | decode ms/step | ratio | TTFT ms | peak RSS MB | tokens equal to {base} | "
          f"tokens equal to transformers{against} |")
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if llama_reference else ""))
    differ = []
    for d in depths:
        for b in args.batch:
            for s in args.schemes:
                runs, ref = results[(s, b, d)], results[(base, b, d)]
                if not runs:
                    continue
                ratio = statistics.median(x["step_ms"] / y["step_ms"] for x, y in zip(runs, ref))
                agree = same_prefix(runs[0]["tokens"], ref[0]["tokens"])
                checked = "unchecked"
                if check_tokens:
                    counts = [same_prefix(run["tokens"], expected[d]) for run in runs]
                    per_run = [f"{k}/{len(expected[d])}" for k in counts]
                    checked = per_run[0] if len(set(per_run)) == 1 else ", ".join(per_run)
                    if s in exact and min(counts) < len(expected[d]):
                        checked += " TOKENS DIFFER"
                        differ.append(f"{s} at batch {b}, depth {d}")
                print(f"| {s} | {b} | {d} | {statistics.median(x['step_ms'] for x in runs):.2f} | {ratio:.2f}x | "
                      f"{statistics.median(x['ttft_ms'] for x in runs):.1f} | "
                      f"{statistics.median(x['rss_mb'] for x in runs):.0f} | {agree}/{len(ref[0]['tokens'])} | "
                      f"{checked} |"
                      + (f" {cosine(runs[0]['first'], logits[d]):.4f}, "
                         f"{'same' if np.argmax(runs[0]['first']) == logits[d].argmax() else 'differs'} |"
                         if logits and runs[0]["first"] is not None else " - |" if logits else ""))
    if args.plot:
        from bench_plot import plot_context
        plot_context(results, args.plot, f"{os.path.basename(args.gguf)}: {args.new_tokens} new tokens, "
                     f"{args.threads} threads, medians of {args.rounds} rounds")
        print(f"drew {args.plot}", file=sys.stderr)
    if differ:
        print(f"error: tokens differ from transformers' where they must equal them: {'; '.join(differ)}",
              file=sys.stderr)
        return 1
    return 0


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


if __name__ == "__main__":
    sys.exit(main())
