"""Decode with quantized weights on Lite: one model exported per weight scheme, measured side by side.

    .venv/bin/python tools/bench_quant.py [--gguf build/models/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--work_dir build/bench_quant] [--schemes none int8 int4] [--batch 1 8] [--rounds 3]

Exports the model (`model: {gguf: ...}`, target cpu: the packed step as .ms) once per scheme of
`quantization.weights` (none: Lite's own MatMul; int8 and int4 with --group_size), kept in --work_dir for
later runs. A scheme may end in `+head` (`quantization.head: int8`) or `+head+embedding` (the embedding
in int8 as well): `int8+head+embedding`; `+attn` exports with `attention: kernel` (without it, `attention:
graph`). Then, round after round, every scheme and batch in turn, each in a child process of its own under
/usr/bin/time: a 31-token prompt per row, --new_tokens greedy tokens (EOS ignored) through `Session.step`
(idle cache rows cost nothing), 2 threads. Prints per scheme and batch the median decode ms per step, TTFT,
peak RSS, the same-round ratios to `none`, and how many greedy tokens of row 0 equal `none`'s before the
first difference. `--accuracy TEXT_FILE` measures instead each scheme's top-1 agreement with the first one
and its perplexity, teacher-forced over --accuracy_tokens tokens of the text (one slice per cache row), and
so llama.cpp's at each --llama_cpp type (the same slices, our tokenizer's ids).

`--llama_cpp Q4_1 Q8_0 F32` adds llama.cpp (llama-cpp-python in the peers venv, `make peers`) at each batch
on the same GGUF: the file as it is when its type is asked for, else a copy requantized (or dequantized)
by llama.cpp's own quantizer into --work_dir, fed the same prompt ids on each row, timed per decode call.
`--peers ort_int4 openvino_int8 openvino_int4 --hf_dir HF_DIR` adds ONNX Runtime GenAI's int4 (its model
builder, blocks of 32, x rounded to int8) and OpenVINO GenAI with NNCF's int8 / int4 weights (int4 in groups
of 32), built from that Hugging Face folder of the same model (tools/peer_runtimes.py), at each batch, fed the
same ids.
`--reference F16` compares every run's logits after the prompt with llama.cpp's at that type (cosine and
top-1): on a random model, whose near-flat logits let any rounding change the greedy tokens, and at
sizes whose float32 export this machine cannot hold (`tools/random_hf_llama.py --gguf`).
"""
from __future__ import annotations

import argparse
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
PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
          "combined movable metal type with an oil-based ink and a wooden press.")


def export(gguf: str, work: str, scheme: str, group: int, batch: int, seq: int) -> str:
    weights, *parts = scheme.split("+")       # e.g. int8+head+embedding+attn
    if any(part not in ("head", "embedding", "attn") for part in parts):
        raise SystemExit(f"error: --schemes {scheme!r}: a weights scheme, then +head and +embedding (in int8), "
                         "+attn (attention: kernel)")
    int8_parts = [part for part in parts if part != "attn"]
    quantization = dict({part: "int8" for part in int8_parts}, weights=weights)
    grid = ""
    if weights in ("int8", "int4"):
        quantization["group_size"] = group
        grid = "_channel" if group == -1 else f"_g{group}"
    out = os.path.join(work, "_".join([weights + grid] + parts))
    if os.path.isfile(os.path.join(out, "manifest.json")):
        return out
    yaml = out + ".yaml"
    with open(yaml, "w") as f:
        json.dump({"model": {"gguf": os.path.abspath(gguf)}, "target": "cpu", "seq_length": seq, "batch_size": batch,
                   "quantization": quantization, "attention": "kernel" if "attn" in parts else "graph",
                   "output_dir": out}, f)
    start = time.perf_counter()
    if subprocess.run([MS20, "-m", "exporter", "--config", yaml], cwd=REPO, stdout=subprocess.DEVNULL).returncode:
        raise SystemExit(1)     # the exporter printed its one-line error, naming the yaml
    print(f"exported {scheme} to {out} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return out


def child(export_dir: str, batch: int, new_tokens: int, threads: int) -> None:
    """Runs in its own process: prints one JSON line of timings and row 0's tokens."""
    import numpy as np
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.tokenizers import export_tokenizer
    manifest = load_manifest(export_dir)
    ids = export_tokenizer(manifest).encode(PROMPT)[:31]
    session = load_session("mslite", manifest, num_threads=threads)
    rows = manifest.batch_size
    counts = np.array([len(ids)] * batch + [0] * (rows - batch), np.int32)
    tokens = np.zeros((rows, len(ids)), np.int32)
    tokens[:batch] = ids
    past = np.zeros(rows, np.int32)
    start = time.perf_counter()
    logits = session.step(tokens, counts, past)
    ttft = time.perf_counter() - start
    first = logits[0].tolist()
    past = past + counts
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


def prompt_ids(export_dir: str) -> list:
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.tokenizers import export_tokenizer
    return export_tokenizer(load_manifest(export_dir)).encode(PROMPT)[:31]


def llama_child(gguf: str, ids: list, batch: int, new_tokens: int, threads: int) -> None:
    """Runs in the peers venv: llama.cpp on `batch` sequences of the prompt (one decode call a step for all of
    them, each sequence its own cache), one JSON line as child() prints."""
    import llama_cpp as lc
    import numpy as np
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(gguf.encode(), lc.llama_model_default_params())
    params = lc.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_seq_max = 256 * batch, 256 * batch, batch
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
    manifest = load_manifest(export_dir)
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
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    text, rows, length = teacher_text(export_dir, text_file, tokens)
    session = load_session("mslite", load_manifest(export_dir), num_threads=threads)
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
    """Runs in the peers venv: accuracy_child's measure for llama.cpp on the GGUF, `slices` the rows' token ids
    (each its length + 1), each a sequence of its own decoded in one call, logits at every position."""
    import llama_cpp as lc
    import numpy as np
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(gguf.encode(), lc.llama_model_default_params())
    length, rows = len(slices[0]) - 1, len(slices)
    params = lc.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_seq_max = rows * 256, rows * length, rows
    params.n_threads = params.n_threads_batch = threads
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


def measure(export_dir: str, batch: int, new_tokens: int, threads: int, llama_ids=None) -> dict:
    """One run in a child under /usr/bin/time; `llama_ids`: export_dir is a GGUF for llama.cpp."""
    if llama_ids is not None:
        command = ["/usr/bin/time", "-f", "%M", PEERS, os.path.abspath(__file__), "--llama_child", export_dir,
                   json.dumps(llama_ids), str(batch), str(new_tokens), str(threads)]
    else:
        command = ["/usr/bin/time", "-f", "%M", sys.executable, os.path.abspath(__file__), "--child", export_dir,
                   str(batch), str(new_tokens), str(threads)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"error: measuring {export_dir} at batch {batch} failed: {result.stderr.strip()[-500:]}")
    got = json.loads(result.stdout.strip().splitlines()[-1])
    got["rss_mb"] = int(result.stderr.strip().splitlines()[-1]) / 1024
    return got


def same_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", default=os.path.join(REPO, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--work_dir", default=os.path.join(REPO, "build", "bench_quant"))
    p.add_argument("--schemes", nargs="*", default=["none", "int8", "int4"],
                   help="exported here first (none: only the --extra exports are measured)")
    p.add_argument("--group_size", type=int, default=32)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seq_length", type=int, default=256)
    p.add_argument("--extra", nargs="*", default=[], metavar="NAME=DIR",
                   help="more exports measured beside the schemes' (e.g. another head choice)")
    p.add_argument("--accuracy", metavar="TEXT_FILE", help="instead of timing: top-1 agreement with the first "
                   "scheme and perplexity, teacher-forced over --accuracy_tokens tokens of this text")
    p.add_argument("--accuracy_tokens", type=int, default=1024)
    p.add_argument("--accuracy_child", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--llama_accuracy_child", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--child", nargs=4, metavar=("EXPORT", "BATCH", "NEW_TOKENS", "THREADS"), help=argparse.SUPPRESS)
    p.add_argument("--llama_cpp", nargs="*", default=[], choices=sorted(LLAMA_FTYPES),
                   help="llama.cpp on the GGUF in these types (needs the peers venv: make peers)")
    p.add_argument("--peers", nargs="*", default=[], choices=["ort_int4", "openvino_int8", "openvino_int4"],
                   help="quantized peers built from --hf_dir (needs the peers venv)")
    p.add_argument("--hf_dir", help="a Hugging Face folder of the GGUF's model, for --peers")
    p.add_argument("--reference", choices=sorted(LLAMA_FTYPES), help="compare every run's logits after the prompt "
                   "with llama.cpp's at this type (e.g. F16: the model unquantized, where ours cannot hold it)")
    p.add_argument("--llama_child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.llama_child:
        a = args.llama_child
        return llama_child(a[0], json.loads(a[1]), int(a[2]), int(a[3]), int(a[4]))
    if args.llama_accuracy_child:
        a = args.llama_accuracy_child
        return llama_accuracy_child(a[0], json.loads(a[1]), int(a[2]))
    if args.child or args.accuracy_child:
        sys.path.insert(0, REPO)
        if args.accuracy_child:
            a = args.accuracy_child
            return accuracy_child(a[0], a[1], int(a[2]), int(a[3]))
        return child(args.child[0], int(args.child[1]), int(args.child[2]), int(args.child[3]))
    os.makedirs(args.work_dir, exist_ok=True)
    exports = {s: export(args.gguf, args.work_dir, s, args.group_size, max(args.batch), args.seq_length)
               for s in args.schemes}
    exports.update(item.split("=", 1) for item in args.extra)
    args.schemes = list(exports)
    if (args.llama_cpp or args.reference or args.peers) and not os.path.isfile(PEERS):
        raise SystemExit(f"error: --llama_cpp, --reference and --peers need the peers venv {PEERS}: run `make "
                         "peers` (it builds llama-cpp-python)")
    llama = {f"llama.cpp {t}": llama_file(args.gguf, args.work_dir, t) for t in args.llama_cpp}
    if args.accuracy:
        return accuracy(exports, os.path.abspath(args.accuracy), args.accuracy_tokens, args.threads, llama)
    if args.rounds < 1:
        return
    if args.peers and not os.path.isfile(os.path.join(args.hf_dir or "", "config.json")):
        raise SystemExit(f"error: --peers needs --hf_dir, a Hugging Face folder of the model; {args.hf_dir!r} "
                         "has no config.json")
    peers = {p: peer_model(p, args.hf_dir, args.work_dir, args.threads) for p in args.peers}
    ids = prompt_ids(exports[args.schemes[0]]) if llama or peers or args.reference else None
    reference = None
    if args.reference:       # the prompt's last logits of the model as llama.cpp runs it at that type
        path = llama_file(args.gguf, args.work_dir, args.reference)
        reference = np.array(measure(path, 1, 1, args.threads, llama_ids=ids)["first"])
    results = {(s, b): [] for s in args.schemes + list(llama) + list(peers) for b in args.batch}
    for r in range(args.rounds):
        for b in args.batch:
            for s in args.schemes:
                results[(s, b)].append(measure(exports[s], b, args.new_tokens, args.threads))
            for name, path in llama.items():
                results[(name, b)].append(measure(path, b, args.new_tokens, args.threads, llama_ids=ids))
            for name, path in peers.items():
                results[(name, b)].append(measure_peer(name, path, ids, b, args.new_tokens, args.threads))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    args.schemes += list(llama) + list(peers)
    base = args.schemes[0]
    print(f"{os.path.basename(args.gguf)}: {args.new_tokens} new tokens after a 31-token prompt, {args.threads} "
          f"threads, {args.rounds} rounds (medians; ratios to {base} of the same round)")
    against = f" | first logits vs llama.cpp {args.reference}: cosine, top-1" if args.reference else ""
    print(f"| weights | batch | decode ms/step | ratio | TTFT ms | peak RSS MB | tokens equal to {base}{against} |")
    print("|---|---|---|---|---|---|---|" + ("---|" if args.reference else ""))
    for b in args.batch:
        for s in args.schemes:
            runs, ref = results[(s, b)], results[(base, b)]
            if not runs:
                continue
            ratio = statistics.median(x["step_ms"] / y["step_ms"] for x, y in zip(runs, ref))
            agree = same_prefix(runs[0]["tokens"], ref[0]["tokens"])
            print(f"| {s} | {b} | {statistics.median(x['step_ms'] for x in runs):.2f} | {ratio:.2f}x | "
                  f"{statistics.median(x['ttft_ms'] for x in runs):.1f} | "
                  f"{statistics.median(x['rss_mb'] for x in runs):.0f} | {agree}/{len(ref[0]['tokens'])} |"
                  + (f" {cosine(runs[0]['first'], reference):.4f}, "
                     f"{'same' if np.argmax(runs[0]['first']) == reference.argmax() else 'differs'} |"
                     if reference is not None and runs[0]["first"] is not None else
                     " - |" if reference is not None else ""))


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


if __name__ == "__main__":
    main()
