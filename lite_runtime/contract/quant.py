"""Weight-only quantization shared by the exporter (which writes the weights: exporter/weights/quantize.py) and
the runtime's kernels (lite_runtime/backends/native/linear_math.h, which read them): the schemes, their
storage (the panels' packing, the dequantizers), the Custom op types that run them on MindSpore Lite. numpy only.

Storage of a linear weight W (N, K) (out, in):
  int8          per output channel (`group_size: -1`): q int8 (N, K) stored as float32's panels (pack_int8: 16
                rows transposed, the float GEMM's tiles, converted as they are read), scale float32 (N,):
                w = q * scale[n]; q in [-127, 127]
  int4          u in [0, 15], K zero-padded to Kp (a multiple of 32), per group of `group` along K a float16
                scale and min (N, G), G = ceil(K / group): w = u * scale[n, g] + min[n, g]; stored as the
                panels of float32 (pack_int4: per pair of steps of k, 16 rows' u two to a byte; the scales and
                mins transposed alike, their float16 bits as int8 pairs (N, 2G), which Lite keeps as they are),
                converted as they are read. A weight whose every group's min is -8 scale (a GGUF's Q4_0
                tensor: d (q - 8)) is stored without its mins (int4_sym, 0.5625 bytes a weight in groups of 32)
  int8_group    int8 in groups (the default of `weights: int8`): q in [-127, 127] as int8's panels, per group of
                `group` along K (K a multiple of 32; the last group may be short) a float16 scale d = max |w| / 127
                as int4's scales (1.0625 bytes a weight in groups of 32): w = q * d[n, k // group]. In groups of
                32 these are llama.cpp's Q8_0 blocks: a GGUF's Q8_0 tensor is stored as it is, bit for bit.
                A weight whose rows are not a multiple of 32 is stored as int8 (per channel)
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
PER_CHANNEL = -1      # group_size of int8 with one scale per output channel
# Custom op type per storage; the aot func a graph names is "<KERNEL_LIBRARY>:<type>" (never opened: Lite
# finds the kernel by its type, MindSpore's op-info by "Custom__<func>").
OP_TYPES: Dict[str, str] = {"float32": "LiteLinearF32", "float32_p16": "LiteLinearF32P16", "int8": "LiteLinearI8P16",
                            "int4_min": "LiteLinearI4F16P16", "int4_sym": "LiteLinearI4SymF16P16",
                            "int8_group": "LiteLinearI8GroupF16P16"}
# The embedding's lookups by the table's storage: ids, and the table as a linear weight (a tied head reads it):
# int8 with its scales (in groups, or by rows), or float32 in the GEMM's panels.
GATHER_TYPES: Dict[str, str] = {"int8": "LiteGatherI8P16", "float32_p16": "LiteGatherF32P16",
                                "int8_group": "LiteGatherI8GroupF16P16"}
# The packed step's attention as one node, each token reading its own cache row in place (export key `attention`).
ATTEND_TYPE = "LiteAttend"
PAGED_ATTEND_TYPE = "LitePagedAttend"    # the attention over the kernels' paged KV store (lite_kernels.KVStore)
# A layer's small ops, each one node, beside the attention kernel (native/layer_ops_kernel.cc).
NORM_TYPE, LAYER_NORM_TYPE, SWIGLU_TYPE, GELU_TYPE, ROTARY_TYPE = (
    "LiteRMSNorm", "LiteLayerNorm", "LiteSwiGLU", "LiteGELU", "LiteRotary")
LAYER_KERNELS = [ATTEND_TYPE, PAGED_ATTEND_TYPE, NORM_TYPE, LAYER_NORM_TYPE, SWIGLU_TYPE, GELU_TYPE, ROTARY_TYPE]
GELU_FORMS = {"gelu": 0, "gelu_tanh": 1, "fast_gelu": 2}     # LiteGELU's form input (native/layer_math.h)
# Types no kernel runs any more are refused by the manifest (manifest.RETIRED_OP_TYPES).
KIND_CODES: Dict[str, int] = {"float32": 0, "int8": 1, "int4_min": 5, "int4_sym": 5, "float32_p16": 4,
                              "int8_group": 6}   # lk::Kind
HALF_SCALES = ("int4_min", "int4_sym", "int8_group")    # scales (and mins) as float16 bits in int8 pairs


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
    when the head reads it (`tied_table`). An int8 weight may be stored in groups or per channel (a row not a
    multiple of 32): both kernels are listed."""
    kernels = {"none": [], "float32": [OP_TYPES["float32_p16"]], "int8": [OP_TYPES["int8"], OP_TYPES["int8_group"]],
               "int4": [OP_TYPES["int4_min"], OP_TYPES["int4_sym"]]}[scheme]
    head_types = [OP_TYPES["float32_p16"]] if head == "float32" else [OP_TYPES["int8"], OP_TYPES["int8_group"]]
    if kernels:
        kernels += [t for t in head_types if t not in kernels]
    if kernels and (embedding == "int8" or tied_table):
        kernels += [GATHER_TYPES["int8"], GATHER_TYPES["int8_group"]] if embedding == "int8" else \
            [GATHER_TYPES["float32_p16"]]
    return kernels


def layer_kernels(norm: str, mlp: str, positions: str, paged: bool = False) -> List[str]:
    """The Custom types a packed step with `attention: kernel` (or `paged`) runs for a model of these DecoderConfig
    kinds (the manifest's `kernels` beside the linear layers'): the attention, its norms, its MLP's activation and
    rotary."""
    norm_type = NORM_TYPE if norm == "rms" else LAYER_NORM_TYPE
    mlp_type = SWIGLU_TYPE if mlp == "swiglu" else GELU_TYPE
    return [PAGED_ATTEND_TYPE if paged else ATTEND_TYPE, norm_type, mlp_type] + ([ROTARY_TYPE] if positions in ("rotary", "rotary_2d") else [])


def quantization_record(scheme: str, group_size: int, head: str = "float32", embedding: str = "float32"
                        ) -> Dict[str, object]:
    """The manifest's `quantization`: {} for float32 weights."""
    if scheme == "none":
        return {}
    # head_on_kernel: every large product runs on the kernels (the runtime gives them the threads)
    record: Dict[str, object] = {"weights": scheme, "head": head, "embedding": embedding, "head_on_kernel": True}
    if scheme != "float32":
        record["rounding"] = "nearest"
    if scheme in ("int8", "int4"):
        record["group_size"] = group_size       # int8: PER_CHANNEL, or groups (per channel where a row is not 32s)
    if scheme == "int4":
        record["symmetric"] = False
    return record


def linear_weight(w: np.ndarray) -> np.ndarray:
    """`w` as float32, checked 2-D (out, in)."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"a linear weight is 2-D (out, in), got shape {w.shape}")
    return w


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
    return _transpose_panels(linear_weight(w), by_rows=True)


def unpack_f32_panels(packed: np.ndarray) -> np.ndarray:
    """The panel layout (pack_f32_panels) -> W (N, K) by rows."""
    return _transpose_panels(packed, by_rows=False)


def pack_int8(q: np.ndarray) -> np.ndarray:
    """q (N, K) int8 by rows -> the panel layout of pack_f32_panels, still shaped (N, K)."""
    return _transpose_panels(np.asarray(q, np.int8), by_rows=True)


def unpack_int8(packed: np.ndarray) -> np.ndarray:
    """The panel layout (pack_int8) -> q (N, K) by rows."""
    return _transpose_panels(packed, by_rows=False)


def pack_u4(u: np.ndarray) -> np.ndarray:
    """u (N, Kp) in [0, 15] -> int8 (N, Kp / 2): in each run of 32 along K byte j holds u j (low nibble) and
    u j + 16 (high nibble)."""
    n, kp = u.shape
    runs = np.asarray(u, np.uint8).reshape(n, kp // 32, 2, 16)
    return (runs[:, :, 0, :] | (runs[:, :, 1, :] << 4)).reshape(n, kp // 2).view(np.int8)


def unpack_u4(packed: np.ndarray) -> np.ndarray:
    b = np.asarray(packed).view(np.uint8)
    n, kp = b.shape[0], b.shape[1] * 2
    runs = b.reshape(n, kp // 32, 16)
    return np.stack([runs & 15, runs >> 4], axis=2).reshape(n, kp)


def pack_int4(u: np.ndarray) -> np.ndarray:
    """u (N, Kp) in [0, 15] -> int8 (N, Kp / 2) in panels: rows 16p .. 16p+15 as, for each pair of steps k, k + 1
    (k even), 16 bytes whose byte j holds row 16p + j's u at k (low nibble) and at k + 1 (high nibble); the
    last N % 16 rows whole (pack_u4) (linear_math.h)."""
    n, kp = u.shape
    n16 = n - n % PANEL_ROWS
    u = np.asarray(u, np.uint8)
    out = np.empty((n, kp // 2), np.int8)
    pairs = u[:n16].reshape(n16 // PANEL_ROWS, PANEL_ROWS, kp // 2, 2).transpose(0, 2, 3, 1)    # (P, Kp/2, 2, 16)
    out[:n16] = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(n16, kp // 2).view(np.int8)
    out[n16:] = pack_u4(u[n16:])
    return out


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """The panel layout (pack_int4) -> u (N, Kp)."""
    b = np.asarray(packed).view(np.uint8)
    n, kp = b.shape[0], b.shape[1] * 2
    n16 = n - n % PANEL_ROWS
    out = np.empty((n, kp), np.uint8)
    pairs = b[:n16].reshape(n16 // PANEL_ROWS, kp // 2, 1, PANEL_ROWS)
    out[:n16] = np.concatenate([pairs & 15, pairs >> 4], axis=2).transpose(0, 3, 1, 2).reshape(n16, kp)
    out[n16:] = unpack_u4(b[n16:])
    return out


def pack_halves(a: np.ndarray) -> np.ndarray:
    """(N, G) float16 -> the panel layout of pack_f32_panels as int8 pairs (N, 2G)."""
    return np.ascontiguousarray(_transpose_panels(np.asarray(a, np.float16), by_rows=True)).view(np.int8)


def unpack_halves(packed: np.ndarray) -> np.ndarray:
    """pack_halves' layout -> (N, G) float32."""
    return _transpose_panels(np.ascontiguousarray(packed).view(np.float16), by_rows=False).astype(np.float32)


def dequantize_int8(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (unpack_int8(packed).astype(np.float32) * scale[:, None]).astype(np.float32)


def dequantize_int4(packed: np.ndarray, scale: np.ndarray, mins: Optional[np.ndarray], k: int, group: int
                    ) -> np.ndarray:
    """The weight of int4_min's constants, or without mins (None) of int4_sym's."""
    u = unpack_int4(packed)[:, :k].astype(np.float32)
    g = np.arange(k) // group
    step = unpack_halves(scale)[:, g]
    return (u * step + (unpack_halves(mins)[:, g] if mins is not None else -8 * step)).astype(np.float32)


def dequantize_int8_group(packed: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    q = unpack_int8(packed).astype(np.float32)
    return (q * unpack_halves(scale)[:, np.arange(q.shape[1]) // group]).astype(np.float32)


def dequantize(storage: str, constants: list, k: int, group: int = 32) -> np.ndarray:
    """The float32 weight (N, k) that a storage (OP_TYPES) and its constants stand for (exporter/weights/
    quantize.py writes them)."""
    if storage == "int8":
        return dequantize_int8(*constants)
    if storage == "int8_group":
        return dequantize_int8_group(*constants, group)
    if storage == "int4_min":
        return dequantize_int4(*constants, k, group)
    if storage == "int4_sym":
        return dequantize_int4(*constants, None, k, group)
    if storage == "float32_p16":
        return unpack_f32_panels(constants[0])
    return constants[0]
