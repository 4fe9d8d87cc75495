"""`CausalLM`: one rank's share of a decoder-only model, assembled from blocks chosen by the
config's features, with its graph entry points: `prefill` and `increment` (kv modes io and
in_graph), or the one `step` of the dynamic kv mode (prefill and decode alike). With
`top_query` (PanGu-α) the last of num_layers is the top query layer (models/top_query.py), run
after the final norm, its K/V cache the last pair.

Parameter names are the project's canonical names (`embed.weight`, `layers.0.attn.q.weight`,
`layers.0.mlp.up.bias`, `final_norm.weight`, `head.weight` ...); each family's weight plan maps its
MindFormers and Hugging Face names onto them. Graph I/O is the runtime contract's
(lite_runtime/contract/families.py).
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from exporter.models.attention import Attention, BuildContext, ScoreBias, shape_tensor
from exporter.models.config import DecoderConfig
from exporter.models.linear import Collective, ColumnParallelLinear, Embedding
from exporter.models.mlp import make_mlp
from exporter.models.norms import make_norm
from exporter.models.positions import rotary_tables
from exporter.models.top_query import TopQueryLayer


class DecoderLayer(nn.Cell):
    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        self.attn_norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, ctx.dtype)
        self.attn = Attention(cfg, ctx)
        self.mlp_norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, ctx.dtype)
        lora = {n: ctx.lora_width for n in ("gate", "up", "down") if f"mlp.{n}" in ctx.lora_targets}
        self.mlp = make_mlp(cfg.mlp, cfg.hidden_size, cfg.intermediate_size, ctx.world_size, ctx.dtype, cfg.mlp_bias,
                            ctx.kv_mode == "dynamic", lora, ctx.graph_collectives)

    def finish(self, x, attn_out, select=None):
        h = x + attn_out
        return h + self.mlp(self.mlp_norm(h), select)


class StepShapes(nn.Cell):
    """Reshape targets and the gather axis of the dynamic step (Lite 2.0 builds graphs with dynamic
    dimensions only with these as tensors)."""

    def __init__(self, batch: int, hidden: int, head_dim: int):
        super().__init__()
        self.flat, self.column = shape_tensor(-1), shape_tensor(batch, 1)
        self.per_token, self.per_row = shape_tensor(-1, 1, head_dim), shape_tensor(batch, 1, 1, 1)
        self.pick, self.rows, self.hidden = shape_tensor(batch, 1, -1), shape_tensor(batch, -1, hidden), \
            shape_tensor(batch, hidden)
        self.flat_column = shape_tensor(-1, 1)
        self.axis0 = Tensor(np.array([0], np.int32))


class CausalLM(nn.Cell):
    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        cfg.check_world_size(ctx.world_size)
        cfg.check_seq_length(ctx.seq)
        self.cfg = cfg
        self.batch, self.seq, self.kv_mode, self.dtype = ctx.batch, ctx.seq, ctx.kv_mode, ctx.dtype
        if ctx.kv_mode == "dynamic":
            self.dyn = StepShapes(ctx.batch, cfg.hidden_size, cfg.head_dim)
        dynamic = ctx.kv_mode == "dynamic"
        self.embed = Embedding(cfg.vocab_size, cfg.hidden_size, ctx.dtype, dynamic)
        self.learned_positions = cfg.positions == "learned"
        if self.learned_positions:
            self.pos_embed = Embedding(cfg.max_position_embeddings, cfg.hidden_size, ctx.dtype, dynamic)
        self.use_embed_norm = cfg.embed_norm
        if cfg.embed_norm:
            self.embed_norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, ctx.dtype)
        self.layers = nn.CellList([DecoderLayer(cfg, ctx) for _ in range(cfg.num_blocks)])
        self.final_norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, ctx.dtype)
        self.use_top_query = cfg.top_query
        if cfg.top_query:
            self.top_query = TopQueryLayer(cfg, ctx)
        # A tied head on one rank reads the embedding table itself (no second copy); under tensor
        # parallelism each rank holds its vocabulary rows of it as `head.weight`.
        self.head_is_embedding = cfg.tie_word_embeddings and ctx.world_size == 1
        if not self.head_is_embedding:
            self.head = ColumnParallelLinear(cfg.hidden_size, cfg.vocab_size, ctx.world_size, ctx.dtype,
                                             flat=dynamic)
        self.head_matmul = ops.MatMul(transpose_b=True)
        self.gather_vocab = Collective.gather_last_dim(ctx.world_size if ctx.graph_collectives else 1)
        self.bias = ScoreBias(cfg, ctx)
        cos, sin = rotary_tables(ctx.seq, cfg.head_dim, cfg.rotary_dim, cfg.rope_theta, cfg.rotary_interleaved)
        self.cos_table, self.sin_table = Tensor(cos), Tensor(sin)
        self.cos_prefill = Tensor(cos.reshape(1, 1, ctx.seq, -1), ctx.dtype)
        self.sin_prefill = Tensor(sin.reshape(1, 1, ctx.seq, -1), ctx.dtype)
        self.positions = Tensor(np.arange(ctx.seq, dtype=np.int32).reshape(1, ctx.seq))
        self.batch_positions = Tensor(np.tile(np.arange(ctx.seq, dtype=np.int32), (ctx.batch, 1)))
        self.row_offsets = Tensor(np.arange(ctx.batch, dtype=np.int32) * ctx.seq)
        self.lora = ctx.lora_width > 0
        if self.lora:   # the slot each SLoRA column belongs to (columns of one slot are adjacent)
            slots = ctx.lora_width // ctx.lora_rank
            self.lora_slot_of_column = Tensor(np.repeat(np.arange(slots, dtype=np.float32),
                                                        ctx.lora_rank).reshape(1, -1))
        self.gather = ops.Gather()
        self.reshape = ops.Reshape()
        self.cast = ops.Cast()
        self.equal = ops.Equal()
        self.ones_like = ops.OnesLike()
        self.cumsum = ops.CumSum()
        self.bmm = ops.BatchMatMul()

    def _embed(self, ids, positions):
        x = self.embed(ids)
        if self.learned_positions:
            x = x + self.pos_embed(positions)
        if self.use_embed_norm:
            x = self.embed_norm(x)
        return x

    def _select(self, input_ids, adapter_ids, rows, column):
        """(tokens, slots·r) float: 1 on the columns of each token's adapter (its row's id), in the
        token order the linear layers see (row-major over input_ids); None without adapters."""
        if not self.lora:
            return None
        per_token = self.cast(self.reshape(adapter_ids, rows), ms.float32) * \
            self.cast(self.ones_like(input_ids), ms.float32)
        return self.cast(self.equal(self.reshape(per_token, column), self.lora_slot_of_column), self.dtype)

    def _logits(self, hidden):
        """hidden (B, H) of each row's last valid token -> float32 logits (B, vocab). The final norm
        is applied here, or (top query layer) already before that layer."""
        h = hidden if self.use_top_query else self.final_norm(hidden)
        if self.head_is_embedding:
            logits = self.head_matmul(h, self.embed.weight)
        else:
            logits = self.head(h)
        return self.gather_vocab(self.cast(logits, ms.float32))

    def prefill(self, input_ids, batch_valid_length, adapter_ids=None):
        x = self._embed(input_ids, self.positions)
        bias = self.bias.prefill()
        select = self._select(input_ids, adapter_ids, (self.batch, 1), (-1, 1))
        new_kv = ()
        for layer in self.layers:
            attn, k, v = layer.attn.prefill(layer.attn_norm(x), self.cos_prefill, self.sin_prefill, bias, select)
            x = layer.finish(x, attn, select)
            new_kv = new_kv + (k, v)
        if self.use_top_query:
            x, k, v = self.top_query.prefill(self.final_norm(x), self.batch_positions, self.cos_prefill,
                                             self.sin_prefill, bias)
            new_kv = new_kv + (k, v)
        last = self.row_offsets + batch_valid_length - 1
        logits = self._logits(self.gather(self.reshape(x, (self.batch * self.seq, -1)), last, 0))
        return (logits,) + new_kv if self.kv_mode == "io" else logits

    def increment(self, input_ids, batch_valid_length, kv, adapter_ids=None):
        pos = self.reshape(batch_valid_length - 1, (self.batch, 1))
        cos = self.cast(self.reshape(self.gather(self.cos_table, pos, 0), (self.batch, 1, 1, -1)), self.dtype)
        sin = self.cast(self.reshape(self.gather(self.sin_table, pos, 0), (self.batch, 1, 1, -1)), self.dtype)
        x = self._embed(input_ids, pos)
        in_graph = self.kv_mode == "in_graph"
        cache_bias, new_bias = self.bias.step(pos, self.batch, in_graph)
        onehot = self.reshape(self.cast(self.equal(self.positions, pos), ms.float32), (self.batch, 1, self.seq, 1))
        select = self._select(input_ids, adapter_ids, (self.batch, 1), (-1, 1))
        new_kv = ()
        i = 0
        for layer in self.layers:
            h = layer.attn_norm(x)
            if in_graph:
                attn, k, v = layer.attn.step_in_graph(h, cos, sin, onehot, cache_bias, select)
            else:
                attn, k, v = layer.attn.step_io(h, cos, sin, kv[2 * i], kv[2 * i + 1], cache_bias, new_bias, select)
            x = layer.finish(x, attn, select)
            new_kv = new_kv + (k, v)
            i = i + 1
        if self.use_top_query:
            h = self.final_norm(x)
            if in_graph:
                x, k, v = self.top_query.step_in_graph(h, pos, cos, sin, onehot, cache_bias)
            else:
                x, k, v = self.top_query.step_io(h, pos, cos, sin, kv[2 * i], kv[2 * i + 1], cache_bias, new_bias)
            new_kv = new_kv + (k, v)
        logits = self._logits(self.reshape(x, (self.batch, -1)))
        return (logits,) + new_kv if self.kv_mode == "io" else logits

    def step(self, input_ids, batch_valid_length, past_length, kv, adapter_ids=None):
        """T new tokens per row (B, T) after `past_length` (B,) positions of the host cache `kv`
        (per layer K (B, kv, hd, P), V (B, kv, P, hd)); `batch_valid_length` (B,) = past + the row's
        valid new tokens. Returns logits of each row's last valid token and the new K (B, kv, hd, T)
        and V (B, kv, T, hd)."""
        x, cos, sin, past, select = self.step_start(input_ids, past_length, adapter_ids)
        new_kv = ()
        biases = None
        i = 0
        for layer in self.layers:
            attn, k, v, biases = layer.attn.step_dynamic(layer.attn_norm(x), cos, sin, kv[2 * i], kv[2 * i + 1],
                                                         past, self.bias, biases, select)
            x = layer.finish(x, attn, select)
            new_kv = new_kv + (k, v)
            i = i + 1
        if self.use_top_query:
            x, k, v = self.top_query.step_dynamic(self.final_norm(x), self._step_positions(input_ids, past_length),
                                                  cos, sin, kv[2 * i], kv[2 * i + 1], past, self.bias, biases)
            new_kv = new_kv + (k, v)
        return (self.step_logits(x, input_ids, batch_valid_length, past_length),) + new_kv

    def step_start(self, input_ids, past_length, adapter_ids=None):
        """The dynamic step up to the first layer: the tokens' hidden states (B*T, H), their rotary
        cos/sin (B*T, 1, hd), each row's past length (B, 1, 1, 1) as float and the SLoRA columns."""
        d = self.dyn
        pos = self._step_positions(input_ids, past_length)
        cos = self.cast(self.reshape(self.gather(self.cos_table, pos, d.axis0), d.per_token), self.dtype)
        sin = self.cast(self.reshape(self.gather(self.sin_table, pos, d.axis0), d.per_token), self.dtype)
        x = self._embed(self.reshape(input_ids, d.flat), pos)
        past = self.reshape(self.cast(past_length, ms.float32), d.per_row)
        return x, cos, sin, past, self._select(input_ids, adapter_ids, d.column, d.flat_column)

    def _step_positions(self, input_ids, past_length):
        """Each token's position (B*T,) int32: its row's past length + its step."""
        d = self.dyn
        return self.reshape(self.cast(self._steps(input_ids) + self.cast(self.reshape(past_length, d.column),
                                                                         ms.float32), ms.int32), d.flat)

    def step_logits(self, x, input_ids, batch_valid_length, past_length):
        """Logits of each row's last valid token from the final hidden states x (B*T, H)."""
        d = self.dyn
        steps = self._steps(input_ids)
        last = self.reshape(self.cast(batch_valid_length - past_length, ms.float32) - 1.0, d.column)
        pick = self.reshape(self.cast(self.equal(steps, last), self.dtype), d.pick)         # (B, 1, T)
        hidden = self.bmm(pick, self.reshape(x, d.rows))
        return self._logits(self.reshape(hidden, d.hidden))

    def _steps(self, input_ids):
        """0 .. T-1 along each row of input_ids (B, T), float32."""
        return self.cumsum(self.cast(self.ones_like(input_ids), ms.float32), 1) - 1.0


class PrefillGraph(nn.Cell):
    """The exported prefill graph (inputs and outputs: the runtime contract)."""

    def __init__(self, net: CausalLM):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, input_ids, batch_valid_length, *kv):
        if self.net.lora:     # SLoRA: kv is (adapter_ids,); `*kv` for the recorded input names (graph_check)
            return self.net.prefill(input_ids, batch_valid_length, kv[0])
        return self.net.prefill(input_ids, batch_valid_length)


class StepGraph(nn.Cell):
    """The one exported graph of the dynamic kv mode."""

    def __init__(self, net: CausalLM):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, input_ids, batch_valid_length, past_length, *kv):
        if self.net.lora:     # SLoRA: adapter_ids (B,) come before the caches
            return self.net.step(input_ids, batch_valid_length, past_length, kv[1:], kv[0])
        return self.net.step(input_ids, batch_valid_length, past_length, kv)


class IncrementGraph(nn.Cell):
    """The exported increment graph; `kv` are the per-layer key/value caches in io mode."""

    def __init__(self, net: CausalLM):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, input_ids, batch_valid_length, *kv):
        if self.net.lora:     # SLoRA: adapter_ids (B,) come before the caches
            return self.net.increment(input_ids, batch_valid_length, kv[1:], kv[0])
        return self.net.increment(input_ids, batch_valid_length, kv)
