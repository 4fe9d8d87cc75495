"""The attention core, written once for every family: prefill, the `io` decode step (host-owned
cache in, new rows out), the `in_graph` decode step (cache as Parameters) and the `dynamic` step
(T new tokens per row against P past rows, T and P chosen per call), with grouped query heads
(GQA/MQA: no repeated K/V) and an additive score bias shared by all layers.

The dynamic step follows what MindSpore Lite 2.0 accepts in graphs with dynamic dimensions:
reshapes name at most one unknown dimension (-1), nothing slices or asks for a shape at run time,
and index ranges come from `CumSum` over a tensor of ones of the right shape.

The score bias (`ScoreBias`) carries what differs between families at the score level: causal
masking, ALiBi, and the cache rows each row may see. Positions that rotate q/k come in as cos/sin.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from lite_runtime.contract.errors import ConfigError
from exporter.models.config import DecoderConfig
from exporter.models.linear import ColumnParallelLinear, RowParallelLinear, zeros_param
from exporter.models.positions import Rotary, alibi_slopes

# Additive mask value: finite, so a fully masked row gives no NaN, and finite in float16 too (-1e9
# becomes -inf there, and 0 * -inf is NaN), with room for two masks added together.
NEG = -3.0e4


class BuildContext(NamedTuple):
    """What one rank's graph is built for."""
    world_size: int
    rank: int
    kv_mode: str          # io | in_graph | dynamic
    batch: int
    seq: int
    dtype: object         # compute dtype (ms.float32 / ms.float16)
    lora_width: int = 0   # SLoRA: adapter slots x lora_rank, 0 without adapters
    lora_rank: int = 0    # SLoRA: the largest adapter rank (smaller ones padded with zeros)
    lora_targets: frozenset = frozenset()   # adapted layers of every block: "attn.q", "mlp.down" ...
    graph_collectives: bool = True   # False: the segment form, whose partial sums are reduced on the host


class ScoreBias(nn.Cell):
    """Additive float32 score biases in the grouped layout: row `g * T + t` of KV head `kv` is query
    head `kv * group + g` at step t. ALiBi slopes are those of this rank's heads."""

    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        n_local, self.n_kv, self.group = cfg.n_heads // ctx.world_size, cfg.n_kv_heads // ctx.world_size, cfg.group
        seq = ctx.seq
        self.alibi = cfg.alibi
        if self.alibi and self.group > 1 and ctx.kv_mode == "dynamic":
            raise ConfigError("kv_cache dynamic does not support ALiBi with grouped KV heads (n_kv_heads "
                              f"{cfg.n_kv_heads} < n_heads {cfg.n_heads}); use kv_cache io")
        self.key_pos = Tensor(np.arange(seq, dtype=np.float32).reshape(1, 1, 1, seq))
        self.query_pos = Tensor(np.tile(np.arange(seq, dtype=np.float32), self.group).reshape(self.group * seq, 1))
        if self.alibi:
            slopes = alibi_slopes(cfg.n_heads)[ctx.rank * n_local:(ctx.rank + 1) * n_local]
            slopes = slopes.reshape(self.n_kv, self.group, 1)
            self.slopes_step = Tensor(slopes.reshape(1, self.n_kv, self.group, 1))
            self.slopes_prefill = Tensor(np.repeat(slopes, seq, axis=1).reshape(1, self.n_kv, self.group * seq, 1))
        self.cast = ops.Cast()
        self.greater = ops.Greater()
        self.greater_equal = ops.GreaterEqual()
        self.less = ops.Less()
        self.reshape = ops.Reshape()
        self.ones_like = ops.OnesLike()
        self.cumsum = ops.CumSum()
        self.floor_mod = ops.FloorMod()
        self.sum = ops.ReduceSum(keep_dims=True)

    def prefill(self, context=None):
        """(1, 1 | kv, group*S, S): each query sees keys up to its own position. `context` (B,) int32
        (prefix attention, GLM): keys before the row's context length are seen by every query too,
        (B, 1, group*S, S)."""
        key = self.reshape(self.key_pos, (1, -1))
        later = self.cast(self.greater(key, self.query_pos), ms.float32)
        if context is not None:     # as dynamic_new: masked only if also outside the prompt's context
            context = self.reshape(self.cast(context, ms.float32), (-1, 1, 1, 1))
            later = later * self.cast(self.greater_equal(self.key_pos, context), ms.float32)
        bias = later * NEG
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

    def _index(self, scores, axis):
        """0, 1, 2, ... along `axis` of `scores`, as float32 of its shape."""
        return self.cumsum(self.ones_like(scores), axis) - 1.0

    def dynamic_past(self, s_past, past):
        """Bias of the past keys (B, kv, g*T, P): those at or beyond `past` (B, 1, 1, 1) rows are
        not the row's (a dummy row, or room left in a bucket)."""
        key = self._index(s_past, -1)
        bias = self.cast(self.greater_equal(key, past), ms.float32) * NEG
        if self.alibi:
            bias = bias + self.slopes_step * key
        return bias

    def dynamic_new(self, s_new, past, context=None):
        """Bias of the new keys (B, kv, g*T, T): causal among the call's tokens (row g*T + t is
        token t); padding tokens past a row's valid count only precede padding queries. `context`
        (B, 1, 1, 1) float (prefix attention): new keys at positions before it are seen by all."""
        key = self._index(s_new, -1)
        query = self._index(s_new, -2)
        if self.group > 1:
            query = self.floor_mod(query, self.sum(self.ones_like(s_new), -1))
        later = self.cast(self.greater(key, query), ms.float32)
        if context is not None:
            later = later * self.cast(self.greater_equal(key + past, context), ms.float32)
        bias = later * NEG
        if self.alibi:
            bias = bias + self.slopes_step * (key + past)
        return bias


def shape_tensor(*dims) -> Tensor:
    """A reshape target for graphs with dynamic dimensions (Lite 2.0 cannot build tuple targets there)."""
    return Tensor(np.array(dims, np.int32))


class DynamicShapes(nn.Cell):
    """The reshape targets of the dynamic step: one unknown dimension (-1) each."""

    def __init__(self, batch: int, n_heads: int, n_kv: int, hd: int):
        super().__init__()
        self.rows = shape_tensor(-1, hd)
        self.tokens_q, self.tokens_kv = shape_tensor(-1, n_heads, hd), shape_tensor(-1, n_kv, hd)
        self.heads_q, self.heads_kv = shape_tensor(batch, -1, n_heads, hd), shape_tensor(batch, -1, n_kv, hd)
        self.grouped = shape_tensor(batch, n_kv, -1, hd)
        self.heads_out = shape_tensor(batch, n_heads, -1, hd)
        self.merged = shape_tensor(-1, n_heads * hd)


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
        flat = ctx.kv_mode == "dynamic"
        lora = {n: ctx.lora_width if f"attn.{n}" in ctx.lora_targets else 0 for n in "qkvo"}
        self.q = ColumnParallelLinear(hidden, cfg.n_heads * self.hd, ws, ctx.dtype, cfg.qkv_bias, flat, lora["q"])
        self.k = ColumnParallelLinear(hidden, cfg.n_kv_heads * self.hd, ws, ctx.dtype, cfg.qkv_bias, flat, lora["k"])
        self.v = ColumnParallelLinear(hidden, cfg.n_kv_heads * self.hd, ws, ctx.dtype, cfg.qkv_bias, flat, lora["v"])
        self.o = RowParallelLinear(cfg.n_heads * self.hd, hidden, ws, ctx.dtype, cfg.o_bias, flat, lora["o"],
                                   ctx.graph_collectives)
        self.use_rotary = cfg.positions in ("rotary", "rotary_2d")
        self.rotary = Rotary(self.hd, cfg.rotary_dim, cfg.rotary_interleaved, ctx.dtype,
                             blocks=2 if cfg.positions == "rotary_2d" else 1)
        self.in_graph = ctx.kv_mode == "in_graph"
        if ctx.kv_mode == "dynamic":
            self.dyn = DynamicShapes(ctx.batch, self.n_heads, self.n_kv, self.hd)
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

    def _project(self, x, cos, sin, batch, steps, select, query=None):
        q = self._heads(self.q(x if query is None else query, select), self.n_heads, batch, steps)
        k = self._heads(self.k(x, select), self.n_kv, batch, steps)
        v = self._heads(self.v(x, select), self.n_kv, batch, steps)
        if self.use_rotary:
            q = self.rotary(q, cos, sin)
            k = self.rotary(k, cos, sin)
        # Heads h = kv * group + g share KV head `kv`: grouping them avoids repeating K/V (GQA).
        q = self.reshape(q, (batch, self.n_kv, self.group * steps, self.hd))
        return self.cast(q, ms.float32), self.cast(k, ms.float32), self.cast(v, ms.float32)

    def _merge(self, o, batch, steps, select):
        o = self.reshape(self.cast(o, self.dtype), (batch, self.n_heads, steps, self.hd))
        o = self.reshape(self.transpose(o, (0, 2, 1, 3)), (batch, steps, self.n_heads * self.hd))
        return self.o(o, select)

    def prefill(self, x, cos, sin, bias, select=None, query=None):
        """x (B, S, H). Returns the output and the prompt's K/V rows (B, kv, S, hd). `select`: each
        token's SLoRA adapter columns (see Linear), None without adapters (as in every method here).
        `query`: what the query projection reads instead of x (PanGu-α's top query layer: a learned
        embedding of each token's position), of x's shape; None: x (as in every method here)."""
        batch, steps, _ = x.shape
        q, k, v = self._project(x, cos, sin, batch, steps, select, query)
        scores = self.bmm_t(q, k) * self.scale + bias
        out = self._merge(self.bmm(self.softmax(scores), v), batch, steps, select)
        if self.in_graph:
            out = self.depend(out, self.assign(self.key_cache, k))
            out = self.depend(out, self.assign(self.value_cache, v))
        return out, k, v

    def step_io(self, x, cos, sin, k_cache, v_cache, cache_bias, new_bias, select=None, query=None):
        """One token per row against host-owned caches (B, kv, S, hd). The new key is not in the
        cache yet, so its score joins the softmax as a separate term (no cache copy)."""
        batch = x.shape[0]
        q, k, v = self._project(x, cos, sin, batch, 1, select, query)
        s_cache = self.bmm_t(q, k_cache) * self.scale + cache_bias           # (B, kv, g, S)
        s_new = self.sum(q * k, -1) * self.scale + new_bias                   # (B, kv, g, 1)
        m = self.maximum(self.max(s_cache, -1), s_new)
        e_cache = self.exp(s_cache - m)
        e_new = self.exp(s_new - m)
        o = (self.bmm(e_cache, v_cache) + e_new * v) / (self.sum(e_cache, -1) + e_new)
        return self._merge(o, batch, 1, select), k, v

    def step_dynamic(self, x, cos, sin, k_past, v_past, past, bias: ScoreBias, biases=None, select=None, query=None,
                     context=None):
        """x (B*T, H): T new tokens per row, against host-owned past keys (B, kv, hd, P, transposed)
        and values (B, kv, P, hd) whose first `past` (B, 1, 1, 1) positions are the row's; cos/sin
        (B*T, 1, hd). Returns the output (B*T, H), the new keys (B, kv, hd, T) and values (B, kv, T, hd)
        and the score biases of past and new keys, which every layer shares: the first layer makes
        them (`biases` None), the others reuse them. Past and new keys are two softmax terms: joining
        them would copy the cache on every call. `context` (B, 1, 1, 1) float: prefix attention's
        context lengths (ScoreBias.dynamic_new)."""
        d = self.dyn
        q = self._heads_dynamic(self.q(x if query is None else query, select), d.tokens_q, d.heads_q, cos, sin)
        k = self._heads_dynamic(self.k(x, select), d.tokens_kv, d.heads_kv, cos, sin)
        v = self.transpose(self.reshape(self.v(x, select), d.heads_kv), (0, 2, 1, 3))
        q = self.cast(self.reshape(q, d.grouped), ms.float32)
        k, v = self.transpose(self.cast(k, ms.float32), (0, 1, 3, 2)), self.cast(v, ms.float32)
        s_past = self.bmm(q, k_past) * self.scale
        s_new = self.bmm(q, k) * self.scale
        if biases is None:
            biases = (bias.dynamic_past(s_past, past), bias.dynamic_new(s_new, past, context))
        s_past = s_past + biases[0]
        s_new = s_new + biases[1]
        m = self.maximum(self.max(s_past, -1), self.max(s_new, -1))
        e_past = self.exp(s_past - m)
        e_new = self.exp(s_new - m)
        o = (self.bmm(e_past, v_past) + self.bmm(e_new, v)) / (self.sum(e_past, -1) + self.sum(e_new, -1))
        o = self.transpose(self.cast(self.reshape(o, d.heads_out), self.dtype), (0, 2, 1, 3))
        return self.o(self.reshape(o, d.merged), select), k, v, biases

    def _heads_dynamic(self, x, tokens_shape, heads_shape, cos, sin):
        """(B*T, n*hd) -> rotated (B, n, T, hd)."""
        if self.use_rotary:
            x = self.reshape(x, tokens_shape)                                             # (B*T, n, hd)
            partner = self.reshape(self.rotary.matmul(self.reshape(x, self.dyn.rows), self.rotary.p), tokens_shape)
            x = x * cos + partner * sin
        return self.transpose(self.reshape(x, heads_shape), (0, 2, 1, 3))

    def step_in_graph(self, x, cos, sin, row_onehot, cache_bias, select=None, query=None):
        """One token per row; the row at pos is written into the Parameter caches first."""
        batch = x.shape[0]
        q, k, v = self._project(x, cos, sin, batch, 1, select, query)
        keep = 1.0 - row_onehot                                               # (B, 1, S, 1)
        k_all = self.key_cache * keep + k * row_onehot
        v_all = self.value_cache * keep + v * row_onehot
        k_all = self.depend(k_all, self.assign(self.key_cache, k_all))
        v_all = self.depend(v_all, self.assign(self.value_cache, v_all))
        scores = self.bmm_t(q, k_all) * self.scale + cache_bias
        o = self.bmm(self.softmax(scores), v_all)
        return self._merge(o, batch, 1, select), k, v
