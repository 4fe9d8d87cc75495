"""Linear products (and the packed step's attention) as Custom nodes that MindSpore Lite runs with the project's kernels
(lite_runtime/backends/native/lite_kernels.cc), for MindSpore 2.0 exports.

MindSpore 2.0 writes `ops.Custom(func, func_type="aot")` with a `type` attribute as a Custom node of
that type; the aot library in `func` is never opened (not at export, not by Lite). The weight, its scales
(and mins) are the node's constant inputs, in the storage of lite_runtime/contract/quant.py.
"""
from __future__ import annotations

from mindspore import dtype as mstype
from mindspore import ops

from lite_runtime.contract.quant import ATTEND_TYPE, GATHER_TYPES, OP_TYPES, PAGED_ATTEND_TYPE, ROTARY_TYPE, aot_func


def _out_shape(x, w, *scales):
    return list(x[:-1]) + [w[0]]


def _out_dtype(x, *rest):
    return x


def linear_op(storage: str) -> ops.Custom:
    """y (..., N) = op(x (..., K), *constants) for weights in `storage` (a key of quant.OP_TYPES)."""
    op_type = OP_TYPES[storage]
    op = ops.Custom(aot_func(op_type), out_shape=_out_shape, out_dtype=_out_dtype, func_type="aot")
    op.add_prim_attr("type", op_type)
    return op


def _rows_shape(ids, table, *scale):
    return list(ids) + [table[1]]


def _float_dtype(ids, table, *scale):
    return mstype.float32


def gather_op(storage: str) -> ops.Custom:
    """y (ids' shape, H) = op(ids int32, table (V, H) in a linear storage: int8 with its scale float32 (V,), or
    float32 in the GEMM's panels)."""
    op_type = GATHER_TYPES[storage]
    op = ops.Custom(aot_func(op_type), out_shape=_rows_shape, out_dtype=_float_dtype, func_type="aot")
    op.add_prim_attr("type", op_type)
    return op


def _attend_shape(q, *rest):
    return [q[0], q[1] * q[2] * q[3]]


def attend_op() -> ops.Custom:
    """out (N, kv·g·hd) = op(q (N, kv, g, hd), k, v (N, kv, hd), k_cache (B, kv, hd, P), v_cache (B, kv, P, hd),
    meta (N, 4), slopes (kv·g,), scale (1,)): the packed call's attention (native/attention_math.h)."""
    op = ops.Custom(aot_func(ATTEND_TYPE), out_shape=_attend_shape, out_dtype=_out_dtype, func_type="aot")
    op.add_prim_attr("type", ATTEND_TYPE)
    return op


def paged_attend_op() -> ops.Custom:
    """out (N, kv·g·hd) = op(q (N, kv, g, hd), k, v (N, kv, hd), meta (N, 4), block tables (B, T), the store's id
    (1,), the layer (1,), slopes (kv·g,), scale (1,)): the packed call's attention over the kernels' paged store,
    into which it writes k and v first (native/attention_math.h PagedArgs)."""
    op = ops.Custom(aot_func(PAGED_ATTEND_TYPE), out_shape=_attend_shape, out_dtype=_out_dtype, func_type="aot")
    op.add_prim_attr("type", PAGED_ATTEND_TYPE)
    return op


def _same_shape(x, *rest):
    return list(x)


def _rotated_shape(x, cos, sin, pair):
    if len(x) < 2 or x[1] < 0:      # (GLM's graphs reach this with x's rank unknown)
        return [-1, -1, pair[1]]
    return [x[0], x[1] // pair[1], pair[1]]


def layer_op(op_type: str) -> ops.Custom:
    """One of a layer's small float32 ops (native/layer_ops_kernel.cc): LiteRMSNorm (x, weight, eps), LiteLayerNorm
    (x, weight, bias, eps), LiteSwiGLU (gate, up) and LiteGELU (x, form) keep x's shape; LiteRotary (x (N, n·hd),
    cos, sin, pair (2, hd)) gives (N, n, hd)."""
    shape = _rotated_shape if op_type == ROTARY_TYPE else _same_shape
    op = ops.Custom(aot_func(op_type), out_shape=shape, out_dtype=_out_dtype, func_type="aot")
    op.add_prim_attr("type", op_type)
    return op
