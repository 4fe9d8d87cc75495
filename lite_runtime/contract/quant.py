"""Weight-only quantization shared by the exporter (which writes the weights) and the runtime's kernels
(lite_runtime/backends/native/linear_math.h, which read them): the schemes, their storage, the Custom op
types that run them on MindSpore Lite, and numpy quantizers / dequantizers. numpy only.

Storage of a linear weight W (N, K) (out, in):
  int8          q int8 (N, K) stored as float32's panels (pack_int8: 16 rows transposed, the float GEMM's
                tiles, converted as they are read), scale float32 (N,): w = q * scale[n]; q in [-127, 127]
  int4          u in [0, 15] packed two to a byte, int8 (N, Kp / 2), Kp = K rounded up to 32; in each run of
                32 weights along K byte j holds weight j (low nibble) and j + 16 (high nibble);
                scale float32 (N, G), G = ceil(K / group): w = (u - 8) * scale[n, g]
  int4 with min as int4 with min float32 (N, G): w = u * scale[n, g] + min[n, g]
Rounding is to nearest (numpy's, half to even).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

KERNEL_LIBRARY = "liblite_kernels.so"
# "none": float32 weights on Lite's own MatMul; "float32": float32 weights on the project's kernels, stored as
# a float GEMM's panels (decode steps faster than Lite's MatMul where the CPU has AVX-512: docs/quantization.md).
WEIGHT_SCHEMES = ("none", "float32", "int8", "int4")
HEAD_SCHEMES = ("float32", "int8")
EMBEDDING_SCHEMES = ("float32", "int8")
GROUP_SIZES = (32, 64, 128)
# Custom op type per storage; the aot func a graph names is "<KERNEL_LIBRARY>:<type>" (never opened: Lite
# finds the kernel by its type, MindSpore's op-info by "Custom__<func>").
OP_TYPES: Dict[str, str] = {"float32": "LiteLinearF32", "float32_p16": "LiteLinearF32P16", "int8": "LiteLinearI8P16",
                            "int4": "LiteLinearI4", "int4_min": "LiteLinearI4Min"}
# The embedding's lookups by the table's storage: ids, and the table as a linear weight (a tied head reads it):
# int8 with its scales, or float32 in the GEMM's panels.
GATHER_TYPES: Dict[str, str] = {"int8": "LiteGatherI8P16", "float32_p16": "LiteGatherF32P16"}
# The packed step's attention as one node, each token reading its own cache row in place (export key `attention`).
ATTEND_TYPE = "LiteAttend"
# A layer's small ops, each one node, beside the attention kernel (native/layer_ops_kernel.cc).
NORM_TYPE, LAYER_NORM_TYPE, SWIGLU_TYPE, GELU_TYPE, ROTARY_TYPE = (
    "LiteRMSNorm", "LiteLayerNorm", "LiteSwiGLU", "LiteGELU", "LiteRotary")
LAYER_KERNELS = [ATTEND_TYPE, NORM_TYPE, LAYER_NORM_TYPE, SWIGLU_TYPE, GELU_TYPE, ROTARY_TYPE]
GELU_FORMS = {"gelu": 0, "gelu_tanh": 1, "fast_gelu": 2}     # LiteGELU's form input (native/layer_math.h)
# Types no kernel runs any more are refused by the manifest (manifest.RETIRED_OP_TYPES).
KIND_CODES: Dict[str, int] = {"float32": 0, "int8": 1, "int4": 2, "int4_min": 3, "float32_p16": 4}   # lk::Kind


def aot_func(op_type: str) -> str:
    return f"{KERNEL_LIBRARY}:{op_type}"


def own_head(scheme: str, head: str, embedding: str) -> bool:
    """A tied head kept as a layer of its own: its product runs on the kernels in another storage than the
    embedding's table."""
    return scheme != "none" and head != embedding


def head_reads_embedding(tied: bool, world_size: int, own: bool) -> bool:
    """A tied head on one rank reads the embedding's table itself (under tensor parallelism each rank holds its
    vocabulary rows as a head of its own, and so does an `own_head`)."""
    return tied and world_size == 1 and not own


def kernels_for(scheme: str, head: str = "float32", embedding: str = "float32", tied_table: bool = False
                ) -> List[str]:
    """The Custom op types an export quantized by `scheme` (its head by `head`, its embedding by
    `embedding`) runs (the manifest's `kernels`). The head of a quantized export runs on a kernel too,
    float32 (the GEMM's panels) or int8; the embedding's table is looked up by a kernel when it is int8 or
    when the head reads it (`tied_table`)."""
    kernels = {"none": [], "float32": [OP_TYPES["float32_p16"]], "int8": [OP_TYPES["int8"]],
               "int4": [OP_TYPES["int4_min"]]}[scheme]
    head_type = OP_TYPES["float32_p16" if head == "float32" else "int8"]
    if kernels and head_type not in kernels:
        kernels.append(head_type)
    if kernels and (embedding == "int8" or tied_table):
        kernels.append(GATHER_TYPES["int8" if embedding == "int8" else "float32_p16"])
    return kernels


def layer_kernels(norm: str, mlp: str, positions: str) -> List[str]:
    """The Custom types a packed step with `attention: kernel` runs for a model of these DecoderConfig kinds (the
    manifest's `kernels` beside the linear layers'): the attention, its norms, its MLP's activation and rotary."""
    norm_type = NORM_TYPE if norm == "rms" else LAYER_NORM_TYPE
    mlp_type = SWIGLU_TYPE if mlp == "swiglu" else GELU_TYPE
    return [ATTEND_TYPE, norm_type, mlp_type] + ([ROTARY_TYPE] if positions in ("rotary", "rotary_2d") else [])


def quantization_record(scheme: str, group_size: int, head: str = "float32", embedding: str = "float32"
                        ) -> Dict[str, object]:
    """The manifest's `quantization`: {} for float32 weights."""
    if scheme == "none":
        return {}
    # head_on_kernel: every large product runs on the kernels (the runtime gives them the threads)
    record: Dict[str, object] = {"weights": scheme, "head": head, "embedding": embedding, "head_on_kernel": True}
    if scheme != "float32":
        record["rounding"] = "nearest"
    if scheme == "int4":
        record.update(group_size=group_size, symmetric=False)
    return record


def _rows(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"a linear weight is 2-D (out, in), got shape {w.shape}")
    return w


def quantize_int8(w: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(q int8 (N, K) in panels (pack_int8), scale float32 (N,)), symmetric per output row."""
    w = _rows(w)
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return pack_int8(q), scale


PANEL_ROWS = 16     # float32_p16: rows of W per panel (linear_math.h kF32P16)


def _transpose_panels(a: np.ndarray, by_rows: bool) -> np.ndarray:
    """Each whole panel of PANEL_ROWS rows of `a` (N, K) transposed: read as (16, K) when `by_rows`, else as
    (K, 16); the last N % 16 rows copied as they are."""
    n, k = a.shape
    n16 = n - n % PANEL_ROWS
    panel = (PANEL_ROWS, k) if by_rows else (k, PANEL_ROWS)
    out = np.empty_like(a)
    out[:n16] = a[:n16].reshape((n16 // PANEL_ROWS,) + panel).transpose(0, 2, 1).reshape(n16, k)
    out[n16:] = a[n16:]
    return out


def pack_f32_panels(w: np.ndarray) -> np.ndarray:
    """W (N, K) float32 by rows -> the float GEMM's panel layout, still shaped (N, K): rows 16p .. 16p+15 become
    one panel transposed, (K, 16); the last N % 16 rows stay whole (linear_math.h)."""
    return _transpose_panels(_rows(w), by_rows=True)


def unpack_f32_panels(packed: np.ndarray) -> np.ndarray:
    """The panel layout (pack_f32_panels) -> W (N, K) by rows."""
    return _transpose_panels(packed, by_rows=False)


def pack_int8(q: np.ndarray) -> np.ndarray:
    """q (N, K) int8 by rows -> the panel layout of pack_f32_panels, still shaped (N, K)."""
    return _transpose_panels(np.asarray(q, np.int8), by_rows=True)


def unpack_int8(packed: np.ndarray) -> np.ndarray:
    """The panel layout (pack_int8) -> q (N, K) by rows."""
    return _transpose_panels(packed, by_rows=False)


def _groups(w: np.ndarray, group: int) -> Tuple[np.ndarray, int]:
    """W (N, K) zero-padded to (N, G, group)."""
    if group not in GROUP_SIZES:
        raise ValueError(f"group_size {group}: allowed {', '.join(map(str, GROUP_SIZES))}")
    n, k = w.shape
    g = -(-k // group)
    padded = np.zeros((n, g * group), np.float32)
    padded[:, :k] = w
    return padded.reshape(n, g, group), g


def pack_u4(u: np.ndarray) -> np.ndarray:
    """u (N, K) in [0, 15] -> int8 (N, Kp / 2) in the kernels' nibble order (zero-padded to Kp)."""
    n, k = u.shape
    kp = -(-k // 32) * 32
    full = np.zeros((n, kp), np.uint8)
    full[:, :k] = u
    runs = full.reshape(n, kp // 32, 2, 16)
    return (runs[:, :, 0, :] | (runs[:, :, 1, :] << 4)).reshape(n, kp // 2).view(np.int8)


def unpack_u4(packed: np.ndarray, k: int) -> np.ndarray:
    b = np.asarray(packed).view(np.uint8)
    n = b.shape[0]
    runs = b.reshape(n, -1, 16)
    return np.stack([runs & 15, runs >> 4], axis=2).reshape(n, -1)[:, :k]


def quantize_int4(w: np.ndarray, group: int, with_min: bool = False
                  ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """(packed int8 (N, Kp / 2), scale (N, G), min (N, G) or None). Symmetric: u = q + 8, q in [-8, 7],
    scale = max|w| / 7 per group; with a min: scale = (max - min) / 15."""
    w = _rows(w)
    k = w.shape[1]
    grouped, _ = _groups(w, group)
    if with_min:
        lo, hi = grouped.min(axis=2), grouped.max(axis=2)
        scale = np.where(hi > lo, (hi - lo) / 15.0, 1.0).astype(np.float32)
        u = np.clip(np.rint((grouped - lo[:, :, None]) / scale[:, :, None]), 0, 15)
        mins = lo.astype(np.float32)
    else:
        amax = np.abs(grouped).max(axis=2)
        scale = np.where(amax > 0, amax / 7.0, 1.0).astype(np.float32)
        u = np.clip(np.rint(grouped / scale[:, :, None]), -8, 7) + 8
        mins = None
    u = u.reshape(w.shape[0], -1)[:, :k].astype(np.uint8)
    return pack_u4(u), scale, mins


def dequantize_int8(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (unpack_int8(packed).astype(np.float32) * scale[:, None]).astype(np.float32)


def dequantize_int4(packed: np.ndarray, scale: np.ndarray, k: int, group: int,
                    mins: Optional[np.ndarray] = None) -> np.ndarray:
    u = unpack_u4(packed, k).astype(np.float32)
    g = np.arange(k) // group
    s = scale[:, g]
    return (u * s + (mins[:, g] if mins is not None else -8.0 * s)).astype(np.float32)


def quantize(w: np.ndarray, scheme: str, group: int = 32) -> Tuple[str, list]:
    """(op storage name of OP_TYPES, the constant inputs after x) of `w` under `scheme` (WEIGHT_SCHEMES;
    "none" keeps float32). int4 stores a min per group: symmetric int4 kept 58 % of SmolLM2-135M's top-1
    choices (teacher-forced, 1024 tokens), with a min 100 % (its GGUF is Q4_1: the same grid), at 0.75
    instead of 0.625 bytes a weight in groups of 32 (docs/quantization.md)."""
    if scheme == "int8":
        return "int8", list(quantize_int8(w))
    if scheme == "int4":
        return "int4_min", list(quantize_int4(w, group, with_min=True))
    if scheme == "none":
        return "float32", [_rows(w)]
    if scheme == "float32":
        return "float32_p16", [pack_f32_panels(w)]
    raise ValueError(f"quantization weights {scheme!r}: allowed {', '.join(WEIGHT_SCHEMES)}")


def dequantize(storage: str, constants: list, k: int, group: int = 32) -> np.ndarray:
    """The float32 weight (N, k) that `quantize`'s storage and constants stand for."""
    if storage == "int8":
        return dequantize_int8(*constants)
    if storage == "int4_min":
        packed, scale, mins = constants
        return dequantize_int4(packed, scale, k, group, mins)
    if storage == "float32_p16":
        return unpack_f32_panels(constants[0])
    return constants[0]
