"""The attention of the `packed` kv mode: N new tokens of any rows in one list, each computed once.

A token reads its own row's cached keys and values (the cache is gathered by the tokens' rows,
(N, kv, hd, P)), and the call's new keys of its row at positions up to its own. The two score terms
keep their natural layouts: past scores per token (N, kv, g, P), new-to-new scores per KV head
(kv, N·g, N) (row n·g + j is token n's query head kv·g + j). The softmax's max and sums move between
the two by a transpose and a reshape with one unknown dimension, the only kind Lite 2.0 builds with
dynamic dimensions.

`ROWS` .. `META` index what every layer reads about the call's tokens, made once per call by the model;
`PackedBias` makes the additive score biases (masks, ALiBi, prefix attention) once, in the first
layer; `PackedAttend` is the softmax over both terms. `KernelAttend` is the same attention as one Custom
node of the project's Lite kernels (export key `attention: kernel`): it reads each token's own cache row
in place and only the positions that row has cached, instead of gathering every row's whole cache.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from exporter.models.attention import NEG, BuildContext, Weigh, shape_tensor
from exporter.models.config import DecoderConfig
from exporter.models.positions import alibi_slopes


# What every layer reads about a packed call's tokens, made once per call by the model (a plain
# tuple: graph mode builds no named tuples): each token's cache row (N,) int32, the same as float32,
# its position (N,) float32, its row's cached positions (N, 1, 1, 1) float32 (those before are its
# past), and prefix attention's context length of its row (N,) float32 (GLM), else None.
# With the attention kernel, META: the same per token as one (N, 4) float32 table (row, position, past,
# context or -1), the kernel's `meta`.
ROWS, ROW, POSITION, PAST, CONTEXT, META = range(6)


class _Layouts(nn.Cell):
    """Moves (N, kv, g, last) tensors to the new-to-new layout (kv, N·g, last) and back."""

    def __init__(self, n_kv: int, group: int, head_dim: int):
        super().__init__()
        self.n_kv, self.group = n_kv, group
        self.heads_col = shape_tensor(n_kv, -1, 1)
        self.heads_hd = shape_tensor(n_kv, -1, head_dim)
        self.tokens_col = shape_tensor(n_kv, -1, group, 1)
        self.tokens_hd = shape_tensor(n_kv, -1, group, head_dim)
        self.column = shape_tensor(-1, 1)
        self.group_ones = Tensor(np.ones((1, group), np.float32))
        self.reshape = ops.Reshape()
        self.transpose = ops.Transpose()

    def to_heads(self, t, shape):
        """(N, kv, g, d) -> (kv, N·g, d)."""
        return self.reshape(self.transpose(t, (1, 0, 2, 3)), shape)

    def to_tokens(self, t, shape):
        """(kv, N·g, d) -> (N, kv, g, d)."""
        return self.transpose(self.reshape(t, shape), (1, 0, 2, 3))

    def per_query(self, t):
        """(N,) -> (N·g, 1): a token's value on each of its g query rows."""
        return self.reshape(self.reshape(t, self.column) * self.group_ones, self.column)


class PackedBias(nn.Cell):
    """The additive float32 score biases of a packed call: (past (N, 1 | kv, 1 | g, P), new (1 | kv,
    N·g, N)). NEG where a query may not see a key (a cached position at or past its row's length, a
    new key of another row or at a later position; prefix attention lets every query of a row see
    the keys before its context length), plus ALiBi's slope x the key's position."""

    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        n_local, n_kv = cfg.n_heads // ctx.world_size, cfg.n_kv_heads // ctx.world_size
        self.alibi, self.lay = cfg.alibi, _Layouts(n_kv, cfg.group, cfg.head_dim)
        if self.alibi:
            slopes = alibi_slopes(cfg.n_heads)[ctx.rank * n_local:(ctx.rank + 1) * n_local]
            self.slopes = Tensor(slopes.reshape(1, n_kv, cfg.group, 1).astype(np.float32))
        self.per_token = shape_tensor(-1, 1, 1, 1)
        self.cast = ops.Cast()
        self.reshape = ops.Reshape()
        self.equal = ops.Equal()
        self.less_equal = ops.LessEqual()
        self.greater_equal = ops.GreaterEqual()
        self.ones_like = ops.OnesLike()
        self.cumsum = ops.CumSum()

    def construct(self, s_past, tokens):
        lay, row, position, context = self.lay, tokens[ROW], tokens[POSITION], tokens[CONTEXT]
        key = self.cumsum(self.ones_like(s_past), 3) - 1.0                          # cached positions
        past = self.cast(self.greater_equal(key, tokens[PAST]), ms.float32) * NEG
        later = 1.0 - self.cast(self.less_equal(position, lay.per_query(position)), ms.float32)
        if context is not None:
            later = later * self.cast(self.greater_equal(position, lay.per_query(context)), ms.float32)
        same_row = self.cast(self.equal(row, lay.per_query(row)), ms.float32)
        new = (1.0 - same_row * (1.0 - later)) * NEG
        if self.alibi:
            past = past + self.slopes * key
            slopes = lay.to_heads(self.reshape(self.ones_like(position), self.per_token) * self.slopes, lay.heads_col)
            new = new + slopes * position
        return past, new


class PackedAttend(nn.Cell):
    """One softmax over a packed call's past and new scores, applied to their values."""

    def __init__(self, n_kv: int, group: int, head_dim: int, scale: float):
        super().__init__()
        self.lay, self.scale = _Layouts(n_kv, group, head_dim), scale
        self.merged = shape_tensor(-1, n_kv * group * head_dim)
        self.axis0 = Tensor(np.array([0], np.int32))
        self.gather = ops.Gather()
        self.transpose = ops.Transpose()
        self.reshape = ops.Reshape()
        self.bmm = ops.BatchMatMul()
        self.weigh_past = Weigh(one_row=group == 1)
        self.exp = ops.Exp()
        self.sum = ops.ReduceSum(keep_dims=True)
        self.max = ops.ReduceMax(keep_dims=True)
        self.maximum = ops.Maximum()

    def scores(self, q, k, k_cache, rows):
        """q (N, kv, g, hd), the new keys (N, kv, hd) and the cache (B, kv, hd, P): the past scores
        (N, kv, g, P) and the new ones (kv, N·g, N), scaled."""
        lay = self.lay
        s_past = self.bmm(q, self.gather(k_cache, rows, self.axis0)) * self.scale
        s_new = self.bmm(lay.to_heads(q, lay.heads_hd), self.transpose(k, (1, 2, 0))) * self.scale
        return s_past, s_new

    def construct(self, s_past, s_new, v, v_cache, rows):
        """The attention output (N, heads·hd) from biased scores, the new values (N, kv, hd) and the
        value cache (B, kv, P, hd)."""
        lay = self.lay
        m = self.maximum(self.max(s_past, -1), lay.to_tokens(self.max(s_new, -1), lay.tokens_col))
        e_past = self.exp(s_past - m)
        e_new = self.exp(s_new - lay.to_heads(m, lay.heads_col))
        den = self.sum(e_past, -1) + lay.to_tokens(self.sum(e_new, -1), lay.tokens_col)
        o_new = lay.to_tokens(self.bmm(e_new, self.transpose(v, (1, 0, 2))), lay.tokens_hd)
        o = (self.weigh_past(e_past, self.gather(v_cache, rows, self.axis0)) + o_new) / den
        return self.reshape(o, self.merged)


class KernelAttend(nn.Cell):
    """The attention of a packed call as one node that the project's Lite kernel runs (LiteAttend,
    lite_runtime/backends/native/attention_math.h): the same scores, masks, ALiBi slopes and prefix
    context as PackedBias and PackedAttend, from the per-token table `tokens[META]`."""

    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        from exporter.models.kernels import attend_op
        n_local = cfg.n_heads // ctx.world_size
        slopes = (alibi_slopes(cfg.n_heads)[ctx.rank * n_local:(ctx.rank + 1) * n_local] if cfg.alibi
                  else np.zeros(n_local))
        self.slopes = Tensor(np.asarray(slopes, np.float32).reshape(-1))
        self.scale = Tensor(np.array([1.0 / np.sqrt(cfg.head_dim)], np.float32))
        self.op = attend_op()

    def construct(self, q, k, v, k_cache, v_cache, meta):
        return self.op(q, k, v, k_cache, v_cache, meta, self.slopes, self.scale)


class PagedAttend(KernelAttend):
    """KernelAttend over the kernels' paged store (export key `attention: paged`, LitePagedAttend): the node writes
    the call's keys and values into each row's blocks (`tables`, the store `store`, its layer `layer`) and reads
    them there; no cache goes in or out of the graph."""

    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__(cfg, ctx)
        from exporter.models.kernels import paged_attend_op
        self.op = paged_attend_op()

    def construct(self, q, k, v, meta, tables, store, layer):
        return self.op(q, k, v, meta, tables, store, layer, self.slopes, self.scale)
