"""The attention core, written once for every family and kv mode: one softmax over the scores of
a call's new keys and (a decode step) the past ones (`Attention._attend`), with grouped query heads
(GQA/MQA: no repeated K/V) and one additive score bias description shared by all layers
(`ScoreBias`: causal masking, ALiBi, prefix attention, the cache rows each row may see). Prefill
has no past; the `io` decode step (host-owned cache in, new rows out) is one new token per row
against the past rows; `in_graph` is the io step reading, then writing, Parameter caches. The
packed step's attention is packed.py's, on the projections made here (`project_tokens`). Positions
that rotate q/k come in as cos/sin.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from exporter.models.config import DecoderConfig
from exporter.models.linear import ColumnParallelLinear, RowParallelLinear, zeros_param
from exporter.models.positions import Rotary, alibi_slopes, rotate_pairs
from lite_runtime.contract.quant import ROTARY_TYPE

# Additive mask value: finite, so a fully masked row gives no NaN, and finite in float16 too (-1e9
# becomes -inf there, and 0 * -inf is NaN), with room for two masks added together.
NEG = -3.0e4


class BuildContext(NamedTuple):
    """What one rank's graph is built for."""
    world_size: int
    rank: int
    kv_mode: str          # io | in_graph | packed
    batch: int
    seq: int
    dtype: object         # compute dtype (ms.float32 / ms.float16)
    lora_width: int = 0   # SLoRA: adapter slots x lora_rank, 0 without adapters
    lora_rank: int = 0    # SLoRA: the largest adapter rank (smaller ones padded with zeros)
    lora_targets: frozenset = frozenset()   # adapted layers of every block: "attn.q", "mlp.down" ...
    graph_collectives: bool = True   # False: the segment form, whose partial sums are reduced on the host
    own_head: bool = False           # a tied head as a layer of its own (quantized apart from the embedding)
    attention_kernel: bool = False   # the packed step's attention is one Custom node (packed.KernelAttend)
    paged_kv: bool = False           # that node reads and writes the kernels' paged store (packed.PagedAttend)

    @property
    def flat(self) -> bool:
        """Hidden states are (tokens, hidden): the packed step's layout."""
        return self.kv_mode == "packed"

    @property
    def layer_kernels(self) -> bool:
        """The packed step's norms, MLP activations and rotary run on the project's kernels too (kernels.layer_op):
        where its attention does, in float32."""
        return self.attention_kernel and self.flat


class ScoreBias(nn.Cell):
    """The additive float32 score bias of every kv mode, in the grouped layout (row `g * T + t` of KV
    head `kv` is query head `kv * group + g` at step t): NEG where a query may not see a key, plus
    ALiBi's slope x the key's position (the query's own share is the same for all its keys, and
    softmax drops it). ALiBi slopes are those of this rank's heads."""

    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        n_local, self.n_kv, self.group = cfg.n_heads // ctx.world_size, cfg.n_kv_heads // ctx.world_size, cfg.group
        seq = ctx.seq
        self.alibi = cfg.alibi
        self.key_pos = Tensor(np.arange(seq, dtype=np.float32).reshape(1, 1, 1, seq))
        self.query_pos = Tensor(np.tile(np.arange(seq, dtype=np.float32), self.group).reshape(self.group * seq, 1))
        self.first = Tensor(np.zeros((1, 1, 1, 1), np.float32))     # the one new key's index in a decode step
        self.slopes_step = self.slopes_prefill = None
        if self.alibi:
            slopes = alibi_slopes(cfg.n_heads)[ctx.rank * n_local:(ctx.rank + 1) * n_local]
            slopes = slopes.reshape(self.n_kv, self.group, 1)
            self.slopes_step = Tensor(slopes.reshape(1, self.n_kv, self.group, 1))
            self.slopes_prefill = Tensor(np.repeat(slopes, seq, axis=1).reshape(1, self.n_kv, self.group * seq, 1))
        self.cast = ops.Cast()
        self.greater = ops.Greater()
        self.greater_equal = ops.GreaterEqual()
        self.reshape = ops.Reshape()

    def _bias(self, key, hidden, slopes, context=None):
        """`key`: the keys' positions, `hidden` 1 where the query may not see the key; `context`
        (B, 1, 1, 1) float (prefix attention, GLM): keys before it are seen by every query."""
        if context is not None:
            hidden = hidden * self.cast(self.greater_equal(key, context), ms.float32)
        bias = hidden * NEG
        if self.alibi:
            bias = bias + slopes * key
        return bias

    def prefill(self, context=None):
        """(1 | B, 1 | kv, group*S, S): each query sees keys up to its own position. `context` (B,)
        int32: prefix attention's context lengths."""
        if context is not None:
            context = self.reshape(self.cast(context, ms.float32), (-1, 1, 1, 1))
        return self._bias(self.key_pos, self.cast(self.greater(self.key_pos, self.query_pos), ms.float32),
                          self.slopes_prefill, context)

    def past_keys(self, key, past):
        """Bias of cached keys at positions `key`: those at or beyond `past` (B, 1, 1, 1) float are
        not the row's (later positions, a dummy row, or room left in a bucket)."""
        return self._bias(key, self.cast(self.greater_equal(key, past), ms.float32), self.slopes_step)

    def new_keys(self, key, query, past):
        """Bias of the call's new keys: causal among its tokens (`key`, `query`: their indices in the
        call), at positions `past` (B, 1, 1, 1) float on."""
        return self._bias(key + past, self.cast(self.greater(key, query), ms.float32), self.slopes_step)

    def step(self, pos):
        """(cache bias (B, 1 | kv, group, S), bias of the new key) for one decode token per row at
        `pos` (B, 1) int32: the cache rows before pos are the row's."""
        pos = self.reshape(self.cast(pos, ms.float32), (-1, 1, 1, 1))
        return self.past_keys(self.key_pos, pos), self.new_keys(self.first, self.first, pos)


def shape_tensor(*dims) -> Tensor:
    """A reshape target for graphs with dynamic dimensions (Lite 2.0 cannot build tuple targets there)."""
    return Tensor(np.array(dims, np.int32))


class Weigh(nn.Cell):
    """e (..., M, P) @ v (..., P, d) for score weights and values made in the graph (4-D). Lite 2.0's CPU
    MatMul and BatchMatMul sum such a product wrongly when its left operand has one row and the depth P
    passes 1,500 (a lone 1,502-token prompt of SmolLM2 got all-zero logits; measured up to P 8,000). Where
    M may be 1 (`one_row`: one query head a KV head, one token), the product is taken as (v^T e^T)^T,
    whose left operand has d rows."""

    def __init__(self, one_row: bool):
        super().__init__()
        self.one_row = one_row
        self.bmm = ops.BatchMatMul()
        self.bmm_ta = ops.BatchMatMul(transpose_a=True)
        self.transpose = ops.Transpose()

    def construct(self, e, v):
        if not self.one_row:
            return self.bmm(e, v)
        return self.transpose(self.bmm_ta(v, self.transpose(e, (0, 1, 3, 2))), (0, 1, 3, 2))


class TokenShapes(nn.Cell):
    """The reshape targets of the packed step's projections: one unknown dimension (-1) each."""

    def __init__(self, n_heads: int, n_kv: int, hd: int):
        super().__init__()
        self.rows = shape_tensor(-1, hd)
        self.tokens_q, self.tokens_kv = shape_tensor(-1, n_heads, hd), shape_tensor(-1, n_kv, hd)
        self.tokens_grouped = shape_tensor(-1, n_kv, n_heads // n_kv, hd)


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
        flat = ctx.flat
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
        self.rotary_kernel = self.use_rotary and ctx.layer_kernels
        if self.rotary_kernel:
            from exporter.models.kernels import layer_op
            self.rotary_op = layer_op(ROTARY_TYPE)
            self.rotary_pairs = Tensor(rotate_pairs(self.rotary.p.asnumpy()))
        if flat:
            self.dyn = TokenShapes(self.n_heads, self.n_kv, self.hd)
        if self.in_graph:
            shape = (ctx.batch, self.n_kv, ctx.seq, self.hd)
            self.key_cache = zeros_param(shape, ms.float32, "key_cache")
            self.value_cache = zeros_param(shape, ms.float32, "value_cache")
        self.reshape = ops.Reshape()
        self.transpose = ops.Transpose()
        self.bmm = ops.BatchMatMul()
        self.bmm_t = ops.BatchMatMul(transpose_b=True)
        self.weigh_past = Weigh(one_row=self.group == 1)     # a decode step's past: one row a KV head
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

    def _score(self, q, k):
        """q (B, kv, g*T, hd) against keys (B, kv, N, hd): (B, kv, g*T, N)."""
        return self.bmm_t(q, k) * self.scale

    def _attend(self, s_new, v_new, s_past=None, v_past=None):
        """The attention of every kv mode: one softmax over the scores of the call's keys and (a decode
        step) the past ones, applied to their values. Past and new keys stay two terms: joining
        them would copy the cache on every call."""
        if s_past is None:
            return self.bmm(self.softmax(s_new), v_new)
        m = self.maximum(self.max(s_past, -1), self.max(s_new, -1))
        e_past, e_new = self.exp(s_past - m), self.exp(s_new - m)
        return (self.weigh_past(e_past, v_past) + self.bmm(e_new, v_new)) / (self.sum(e_past, -1) + self.sum(e_new, -1))

    def prefill(self, x, cos, sin, bias, select=None, query=None):
        """x (B, S, H). Returns the output and the prompt's K/V rows (B, kv, S, hd). `select`: each
        token's SLoRA adapter columns (see Linear), None without adapters (as in every method here).
        `query`: what the query projection reads instead of x (PanGu-α's top query layer: a learned
        embedding of each token's position), of x's shape; None: x (as in every method here)."""
        batch, steps, _ = x.shape
        q, k, v = self._project(x, cos, sin, batch, steps, select, query)
        out = self._merge(self._attend(self._score(q, k) + bias, v), batch, steps, select)
        if self.in_graph:
            out = self.depend(out, self.assign(self.key_cache, k))
            out = self.depend(out, self.assign(self.value_cache, v))
        return out, k, v

    def step(self, x, cos, sin, k_past, v_past, biases, select=None, query=None, row=None):
        """One new token per row against past keys and values: x (B, 1, H), caches (B, kv, S, hd)
        (in_graph: None, the Parameter caches, into which the new row goes at `row` (B, 1, S, 1)
        one-hot; what the cache held there is masked), `biases` of past and new keys
        (ScoreBias.step), which every layer shares. Returns the output and the new rows (B, kv, 1, hd)."""
        q, k, v = self._project(x, cos, sin, x.shape[0], 1, select, query)
        if self.in_graph:
            k_past, v_past = self.key_cache, self.value_cache
        o = self._attend(self._score(q, k) + biases[1], v, self._score(q, k_past) + biases[0], v_past)
        out = self._merge(o, x.shape[0], 1, select)
        if self.in_graph:
            keep = 1.0 - row
            out = self.depend(out, self.assign(self.key_cache, self.key_cache * keep + k * row))
            out = self.depend(out, self.assign(self.value_cache, self.value_cache * keep + v * row))
        return out, k, v

    def _rotate(self, x, tokens_shape, cos, sin):
        """(N, n*hd) -> (N, n, hd), rotated by cos/sin (N, 1, hd)."""
        if self.rotary_kernel:
            return self.rotary_op(x, cos, sin, self.rotary_pairs)
        x = self.reshape(x, tokens_shape)
        if self.use_rotary:
            partner = self.reshape(self.rotary.matmul(self.reshape(x, self.dyn.rows), self.rotary.p), tokens_shape)
            x = x * cos + partner * sin
        return x

    def project_tokens(self, x, cos, sin, select=None, query=None):
        """The packed step's q (N, kv, g, hd), keys and values (N, kv, hd), float32, from x (N, H)."""
        d = self.dyn
        q = self._rotate(self.q(x if query is None else query, select), d.tokens_q, cos, sin)
        k = self._rotate(self.k(x, select), d.tokens_kv, cos, sin)
        v = self.reshape(self.v(x, select), d.tokens_kv)
        return (self.cast(self.reshape(q, d.tokens_grouped), ms.float32), self.cast(k, ms.float32),
                self.cast(v, ms.float32))

    def output(self, o, select=None):
        """The output projection of attention values (N, heads*hd) float32."""
        return self.o(self.cast(o, self.dtype), select)
