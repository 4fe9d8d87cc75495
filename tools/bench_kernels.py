"""Weight streaming of the project's linear kernels (liblite_kernels.so) against a plain memory read.

    .venv/bin/python tools/bench_kernels.py [--shape smollm2-135m] [--rows 1 8] [--threads 2] [--rounds 5]

Lays out every linear layer of a model shape (distinct weights, so a step streams them all from memory as
a decode step does), runs the step's products in order with M rows, and prints per storage kind the step
time and the weight bytes read per second, beside `lk_read`, a plain read of as many bytes on the same
threads. Kinds and the read are interleaved round by round; the median of the rounds is printed.

Each layer's product is one Python call here, where a Lite graph calls the kernel from C++: the step's time
includes those calls (8-9 µs each here, 1.8 ms of a SmolLM2 step of 210 layers). The tool measures them on
layers too small to cost anything else and prints the rate net of them too, which is what a graph sees.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from lite_runtime.backends import lite_kernels  # noqa: E402
from lite_runtime.backends.lite_native import shim_path  # noqa: E402
from exporter.weights import quantize as quantizers  # noqa: E402
from lite_runtime.contract import quant  # noqa: E402

# (hidden, intermediate, layers, q heads, kv heads, vocabulary)
SHAPES = {"smollm2-135m": (576, 1536, 30, 9, 3, 49152), "1b": (2048, 5632, 22, 32, 4, 32000),
          "small": (256, 688, 4, 8, 8, 32000)}


def layer_shapes(shape: str, head: bool):
    hidden, ffn, layers, heads, kv, vocab = SHAPES[shape]
    hd = hidden // heads
    one = [(heads * hd, hidden), (kv * hd, hidden), (kv * hd, hidden), (hidden, heads * hd),
           (ffn, hidden), (ffn, hidden), (hidden, ffn)]
    return one * layers + ([(vocab, hidden)] if head else [])


def build(shapes, storage: str, group: int, rng):
    layers = []
    for n, k in shapes:
        w = (rng.standard_normal((n, k), dtype=np.float32) * 0.05)
        if storage == "float32":
            layers.append([w])
        elif storage == "float32_p16":     # what `weights: float32` stores: the float GEMM's panels
            layers.append([quant.pack_f32_panels(w)])
        elif storage == "int8":
            layers.append(list(quantizers.quantize_int8(w)))
        elif storage in ("int8_group", "int8_group_a8"):   # `weights: int8`'s default: a float16 scale per --group inputs
            layers.append(list(quantizers.quantize_int8_group(w, group)))
        else:
            layers.append(list(quantizers.quantize_int4(w, group)))
    return layers


def nbytes(layers) -> int:
    return sum(a.nbytes for consts in layers for a in consts)


def step(layers, kind, xs, ys, threads):
    """int8_group_a8: int8_group's weights on activations quantized to int8 (set_int8_activations)."""
    storage = {"int4": "int4_min", "int8_group_a8": "int8_group"}.get(kind, kind)
    if kind == "int8_group_a8" and not lite_kernels.set_int8_activations(True):
        raise SystemExit("error: int8_group_a8 needs a CPU with AVX512-VNNI")
    try:
        for consts, x, y in zip(layers, xs, ys):
            lite_kernels.linear(x, storage, consts, threads, out=y)
    finally:
        lite_kernels.set_int8_activations(False)


def call_seconds(kind: str, calls: int, rows: int, threads: int, steps: int, group: int, rng) -> float:
    """Seconds of a step's `calls` Python calls alone: the same calls on layers of 16 x 32 weights."""
    layers = build([(16, 32)] * calls, kind, group, rng)
    xs, ys = [np.ones((rows, 32), np.float32)] * calls, [np.empty((rows, 16), np.float32) for _ in range(calls)]
    step(layers, kind, xs, ys, threads)
    start = time.perf_counter()
    for _ in range(steps):
        step(layers, kind, xs, ys, threads)
    return (time.perf_counter() - start) / steps


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps timed per round")
    p.add_argument("--kinds", nargs="+", default=["float32_p16", "int8", "int4"],
                   help="storages: float32_p16 (weights: float32), float32 (by rows), int8 (per channel), int8_group "
                        "(in groups: weights: int8), int8_group_a8 (those on int8 activations: AVX512-VNNI), int4")
    p.add_argument("--group", type=int, default=32)
    p.add_argument("--head", action="store_true", help="include the output head")
    args = p.parse_args()
    path = lite_kernels.library_path(shim_path())
    if not path:
        raise SystemExit("error: liblite_kernels.so not found beside the shim; run `lite-setup` (make setup)")
    lite_kernels.load(path)
    rng = np.random.default_rng(0)
    shapes = layer_shapes(args.shape, args.head)
    models = {kind: build(shapes, kind, args.group, rng) for kind in args.kinds}
    biggest = max(nbytes(m) for m in models.values())
    plain = np.ones(biggest // 8, np.uint64)
    print(f"shape {args.shape}: {len(shapes)} linear layers, isa {lite_kernels.isa()}, {args.threads} threads; "
          + ", ".join(f"{k} {nbytes(m) / 1e6:.0f} MB" for k, m in models.items()))
    for rows in args.rows:
        xs = [rng.standard_normal((rows, k), dtype=np.float32) for _, k in shapes]
        ys = [np.empty((rows, n), np.float32) for n, _ in shapes]
        times = {kind: [] for kind in models}
        reads = {kind: [] for kind in models}
        calls = {kind: [] for kind in models}
        for _ in range(args.rounds):
            for kind, layers in models.items():
                step(layers, kind, xs, ys, args.threads)
                start = time.perf_counter()
                for _ in range(args.steps):
                    step(layers, kind, xs, ys, args.threads)
                times[kind].append((time.perf_counter() - start) / args.steps)
                size = nbytes(layers)
                start = time.perf_counter()
                for _ in range(args.steps):
                    lite_kernels.loaded().lk_read(plain.ctypes.data, size, args.threads)
                reads[kind].append((time.perf_counter() - start) / args.steps)
                calls[kind].append(call_seconds(kind, len(shapes), rows, args.threads, args.steps, args.group, rng))
        for kind, layers in models.items():
            size = nbytes(layers)
            t, r, c = (statistics.median(v[kind]) for v in (times, reads, calls))
            print(f"M={rows:<3d} {kind:8s} step {t * 1e3:7.2f} ms  {size / t / 1e9:6.1f} GB/s of weights; "
                  f"plain read of {size / 1e6:.0f} MB {r * 1e3:6.2f} ms ({size / r / 1e9:5.1f} GB/s): "
                  f"kernel/read {t / r:.2f}x; net of the Python calls ({c * 1e3:.2f} ms) {size / (t - c) / 1e9:6.1f} "
                  f"GB/s, {(t - c) / r:.2f}x")


if __name__ == "__main__":
    main()
