"""The attention core, written once for every family: prefill, the `io` decode step (host-owned
cache in, new rows out) and the `in_graph` decode step (cache as Parameters), with grouped
query heads (GQA/MQA: no repeated K/V) and an additive score bias shared by all layers.

The score bias (`ScoreBias`) carries what differs between families at the score level: causal
masking, ALiBi, and the cache rows each row may see. Positions that rotate q/k come in as cos/sin.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from exporter.models.config import DecoderConfig
from exporter.models.linear import ColumnParallelLinear, RowParallelLinear, zeros_param
from exporter.models.positions import Rotary, alibi_slopes

NEG = -1e9  # additive mask value; finite so fully masked rows never produce NaN


class BuildContext(NamedTuple):
    """What one rank's graph is built for."""
    world_size: int
    rank: int
    kv_mode: str          # io | in_graph
    batch: int
    seq: int
    dtype: object         # compute dtype (ms.float32 / ms.float16)


class ScoreBias(nn.Cell):
    """Additive float32 score biases in the grouped layout: row `g * T + t` of KV head `kv` is query
    head `kv * group + g` at step t. ALiBi slopes are those of this rank's heads."""

    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        n_local, self.n_kv, self.group = cfg.n_heads // ctx.world_size, cfg.n_kv_heads // ctx.world_size, cfg.group
        seq = ctx.seq
        self.alibi = cfg.alibi
        self.key_pos = Tensor(np.arange(seq, dtype=np.float32).reshape(1, 1, 1, seq))
        self.query_pos = Tensor(np.tile(np.arange(seq, dtype=np.float32), self.group).reshape(self.group * seq, 1))
        if self.alibi:
            slopes = alibi_slopes(cfg.n_heads)[ctx.rank * n_local:(ctx.rank + 1) * n_local]
            slopes = slopes.reshape(self.n_kv, self.group, 1)
            self.slopes_step = Tensor(slopes.reshape(1, self.n_kv, self.group, 1))
            self.slopes_prefill = Tensor(np.repeat(slopes, seq, axis=1).reshape(1, self.n_kv, self.group * seq, 1))
        self.cast = ops.Cast()
        self.greater = ops.Greater()
        self.less = ops.Less()
        self.reshape = ops.Reshape()

    def prefill(self):
        """(1, 1 | kv, group*S, S): each query sees keys up to its own position."""
        key = self.reshape(self.key_pos, (1, -1))
        bias = self.cast(self.greater(key, self.query_pos), ms.float32) * NEG
        if self.alibi:
            bias = bias + self.slopes_prefill * self.key_pos
        return bias

    def step(self, pos, batch: int, include_current: bool):
        """(cache bias (B, 1 | kv, group, S), bias of the new key (1 | B, kv, group, 1)) for decode
        tokens at `pos` (B, 1) int32; the cache rows visible are those before pos (io mode, where
        the new key is scored apart) or up to pos (in_graph, where it is already in the cache)."""
        limit = self.cast(pos, ms.float32) + (1.0 if include_current else 0.0)
        visible = self.cast(self.less(self.reshape(self.key_pos, (1, -1)), limit), ms.float32)
        bias = self.reshape((1.0 - visible) * NEG, (batch, 1, 1, -1))
        new_bias = 0.0
        if self.alibi:
            bias = bias + self.slopes_step * self.key_pos
            new_bias = self.slopes_step * self.reshape(self.cast(pos, ms.float32), (batch, 1, 1, 1))
        return bias, new_bias


class Attention(nn.Cell):
    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        ws, hidden = ctx.world_size, cfg.hidden_size
        self.n_heads = cfg.n_heads // ws
        self.n_kv = cfg.n_kv_heads // ws
        self.group = cfg.group
        self.hd = cfg.head_dim
        self.scale = 1.0 / float(np.sqrt(cfg.head_dim))
        self.dtype = ctx.dtype
        self.q = ColumnParallelLinear(hidden, cfg.n_heads * self.hd, ws, ctx.dtype, cfg.qkv_bias)
        self.k = ColumnParallelLinear(hidden, cfg.n_kv_heads * self.hd, ws, ctx.dtype, cfg.qkv_bias)
        self.v = ColumnParallelLinear(hidden, cfg.n_kv_heads * self.hd, ws, ctx.dtype, cfg.qkv_bias)
        self.o = RowParallelLinear(cfg.n_heads * self.hd, hidden, ws, ctx.dtype, cfg.o_bias)
        self.use_rotary = cfg.positions == "rotary"
        self.rotary = Rotary(self.hd, cfg.rotary_dim, cfg.rotary_interleaved, ctx.dtype)
        self.in_graph = ctx.kv_mode == "in_graph"
        if self.in_graph:
            shape = (ctx.batch, self.n_kv, ctx.seq, self.hd)
            self.key_cache = zeros_param(shape, ms.float32, "key_cache")
            self.value_cache = zeros_param(shape, ms.float32, "value_cache")
        self.reshape = ops.Reshape()
        self.transpose = ops.Transpose()
        self.bmm = ops.BatchMatMul()
        self.bmm_t = ops.BatchMatMul(transpose_b=True)
        self.softmax = ops.Softmax(-1)
        self.cast = ops.Cast()
        self.exp = ops.Exp()
        self.sum = ops.ReduceSum(keep_dims=True)
        self.max = ops.ReduceMax(keep_dims=True)
        self.maximum = ops.Maximum()
        self.assign = ops.Assign()
        self.depend = ops.Depend()

    def _heads(self, x, n, batch, steps):
        return self.transpose(self.reshape(x, (batch, steps, n, self.hd)), (0, 2, 1, 3))

    def _project(self, x, cos, sin, batch, steps):
        q = self._heads(self.q(x), self.n_heads, batch, steps)
        k = self._heads(self.k(x), self.n_kv, batch, steps)
        v = self._heads(self.v(x), self.n_kv, batch, steps)
        if self.use_rotary:
            q = self.rotary(q, cos, sin)
            k = self.rotary(k, cos, sin)
        # Heads h = kv * group + g share KV head `kv`: grouping them avoids repeating K/V (GQA).
        q = self.reshape(q, (batch, self.n_kv, self.group * steps, self.hd))
        return self.cast(q, ms.float32), self.cast(k, ms.float32), self.cast(v, ms.float32)

    def _merge(self, o, batch, steps):
        o = self.reshape(self.cast(o, self.dtype), (batch, self.n_heads, steps, self.hd))
        o = self.reshape(self.transpose(o, (0, 2, 1, 3)), (batch, steps, self.n_heads * self.hd))
        return self.o(o)

    def prefill(self, x, cos, sin, bias):
        """x (B, S, H). Returns the output and the prompt's K/V rows (B, kv, S, hd)."""
        batch, steps, _ = x.shape
        q, k, v = self._project(x, cos, sin, batch, steps)
        scores = self.bmm_t(q, k) * self.scale + bias
        out = self._merge(self.bmm(self.softmax(scores), v), batch, steps)
        if self.in_graph:
            out = self.depend(out, self.assign(self.key_cache, k))
            out = self.depend(out, self.assign(self.value_cache, v))
        return out, k, v

    def step_io(self, x, cos, sin, k_cache, v_cache, cache_bias, new_bias):
        """One token per row against host-owned caches (B, kv, S, hd). The new key is not in the
        cache yet, so its score joins the softmax as a separate term (no cache copy)."""
        batch = x.shape[0]
        q, k, v = self._project(x, cos, sin, batch, 1)
        s_cache = self.bmm_t(q, k_cache) * self.scale + cache_bias           # (B, kv, g, S)
        s_new = self.sum(q * k, -1) * self.scale + new_bias                   # (B, kv, g, 1)
        m = self.maximum(self.max(s_cache, -1), s_new)
        e_cache = self.exp(s_cache - m)
        e_new = self.exp(s_new - m)
        o = (self.bmm(e_cache, v_cache) + e_new * v) / (self.sum(e_cache, -1) + e_new)
        return self._merge(o, batch, 1), k, v

    def step_in_graph(self, x, cos, sin, row_onehot, cache_bias):
        """One token per row; the row at pos is written into the Parameter caches first."""
        batch = x.shape[0]
        q, k, v = self._project(x, cos, sin, batch, 1)
        keep = 1.0 - row_onehot                                               # (B, 1, S, 1)
        k_all = self.key_cache * keep + k * row_onehot
        v_all = self.value_cache * keep + v * row_onehot
        k_all = self.depend(k_all, self.assign(self.key_cache, k_all))
        v_all = self.depend(v_all, self.assign(self.value_cache, v_all))
        scores = self.bmm_t(q, k_all) * self.scale + cache_bias
        o = self.bmm(self.softmax(scores), v_all)
        return self._merge(o, batch, 1), k, v
