"""The Llama family (Llama 2, CodeLlama, Llama 3 shapes) as MindSpore Cells.

Parameter paths follow MindFormers' Llama names (`model.layers.0.attention.wq.weight` ...), so
MindFormers checkpoints load by name; `exporter/weights.py` maps Hugging Face names onto them.
The network has two entry points, one per exported graph: `prefill` (whole padded prompt) and
`increment` (one token per row). Graph I/O is defined in lite_runtime/families.py.
"""
from __future__ import annotations

from dataclasses import dataclass, asdict
from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from lite_runtime.errors import ConfigError
from .layers import (Collective, ColumnParallelLinear, RMSNorm, Rotary, RowParallelLinear, SwiGLU,
                     rotary_tables, zeros_param)

_NEG = -1e9  # additive mask value; finite so fully masked rows never produce NaN


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    n_heads: int
    intermediate_size: int
    n_kv_heads: Optional[int] = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False

    def __post_init__(self):
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.hidden_size % self.n_heads:
            raise ConfigError(f"model.hidden_size {self.hidden_size} is not divisible by "
                              f"model.n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.n_heads {self.n_heads} is not a multiple of "
                              f"model.n_kv_heads {self.n_kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads

    def check_world_size(self, world_size: int) -> None:
        """Tensor parallelism splits whole KV-head groups, FFN columns and vocabulary rows."""
        for what, size in (("n_heads", self.n_heads), ("n_kv_heads", self.n_kv_heads),
                           ("intermediate_size", self.intermediate_size), ("vocab_size", self.vocab_size)):
            if size % world_size:
                raise ConfigError(f"parallel.model_parallel {world_size} does not divide model.{what} {size}; "
                                  f"choose a model_parallel that divides n_heads, n_kv_heads, "
                                  f"intermediate_size and vocab_size")

    def to_json(self) -> dict:
        data = asdict(self)
        data["head_dim"] = self.head_dim
        return data


class Attention(nn.Cell):
    def __init__(self, cfg: LlamaConfig, world_size: int, kv_mode: str, batch: int, seq: int, dtype):
        super().__init__()
        self.n_heads = cfg.n_heads // world_size
        self.n_kv = cfg.n_kv_heads // world_size
        self.group = self.n_heads // self.n_kv
        self.hd = cfg.head_dim
        self.scale = 1.0 / float(np.sqrt(cfg.head_dim))
        self.dtype = dtype
        self.wq = ColumnParallelLinear(cfg.hidden_size, cfg.n_heads * self.hd, world_size, dtype)
        self.wk = ColumnParallelLinear(cfg.hidden_size, cfg.n_kv_heads * self.hd, world_size, dtype)
        self.wv = ColumnParallelLinear(cfg.hidden_size, cfg.n_kv_heads * self.hd, world_size, dtype)
        self.wo = RowParallelLinear(cfg.n_heads * self.hd, cfg.hidden_size, world_size, dtype)
        self.rotary = Rotary()
        self.in_graph = kv_mode == "in_graph"
        if self.in_graph:
            shape = (batch, self.n_kv, seq, self.hd)
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
        q = self.rotary(self._heads(self.wq(x), self.n_heads, batch, steps), cos, sin)
        k = self.rotary(self._heads(self.wk(x), self.n_kv, batch, steps), cos, sin)
        v = self._heads(self.wv(x), self.n_kv, batch, steps)
        # Heads h = kv * group + g share KV head `kv`: grouping them avoids repeating K/V (GQA).
        q = self.reshape(q, (batch, self.n_kv, self.group * steps, self.hd))
        return q, self.cast(k, ms.float32), self.cast(v, ms.float32)

    def _merge(self, o, batch, steps):
        o = self.reshape(self.cast(o, self.dtype), (batch, self.n_heads, steps, self.hd))
        o = self.reshape(self.transpose(o, (0, 2, 1, 3)), (batch, steps, self.n_heads * self.hd))
        return self.wo(o)

    def prefill(self, x, cos, sin, causal_bias):
        """x (B, S, H); causal_bias (group*S, S) float32. Returns output and the prompt's K/V rows."""
        batch, steps, _ = x.shape
        q, k, v = self._project(x, cos, sin, batch, steps)
        scores = self.bmm_t(self.cast(q, ms.float32), k) * self.scale + causal_bias
        o = self.bmm(self.softmax(scores), v)
        out = self._merge(o, batch, steps)
        if self.in_graph:
            out = self.depend(out, self.assign(self.key_cache, k))
            out = self.depend(out, self.assign(self.value_cache, v))
        return out, k, v

    def step_io(self, x, cos, sin, k_cache, v_cache, cache_bias):
        """One token per row against host-owned caches (B, kv, S, hd); cache_bias masks rows >= pos.

        The new token's key is not in the cache yet, so its score joins the softmax separately.
        """
        batch = x.shape[0]
        q, k, v = self._project(x, cos, sin, batch, 1)
        q = self.cast(q, ms.float32)
        s_cache = self.bmm_t(q, k_cache) * self.scale + cache_bias           # (B, kv, g, S)
        s_new = self.sum(q * k, -1) * self.scale                              # (B, kv, g, 1)
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
        scores = self.bmm_t(self.cast(q, ms.float32), k_all) * self.scale + cache_bias
        o = self.bmm(self.softmax(scores), v_all)
        return self._merge(o, batch, 1), k, v


class DecoderLayer(nn.Cell):
    def __init__(self, cfg: LlamaConfig, world_size: int, kv_mode: str, batch: int, seq: int, dtype):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.attention = Attention(cfg, world_size, kv_mode, batch, seq, dtype)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.feed_forward = SwiGLU(cfg.hidden_size, cfg.intermediate_size, world_size, dtype)

    def finish(self, x, attn_out):
        h = x + attn_out
        return h + self.feed_forward(self.ffn_norm(h))


class Embedding(nn.Cell):
    def __init__(self, vocab: int, hidden: int, dtype):
        super().__init__()
        self.embedding_weight = zeros_param((vocab, hidden), dtype, "embedding_weight")
        self.gather = ops.Gather()

    def construct(self, ids):
        return self.gather(self.embedding_weight, ids, 0)


class LlamaModel(nn.Cell):
    def __init__(self, cfg: LlamaConfig, world_size: int, kv_mode: str, batch: int, seq: int, dtype):
        super().__init__()
        self.tok_embeddings = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.CellList([DecoderLayer(cfg, world_size, kv_mode, batch, seq, dtype)
                                   for _ in range(cfg.num_layers)])
        self.norm_out = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)


class LlamaForCausalLM(nn.Cell):
    """One rank's share of a Llama model with the two graph entry points."""

    def __init__(self, cfg: LlamaConfig, batch_size: int, seq_length: int, kv_mode: str = "io",
                 world_size: int = 1, dtype=ms.float32):
        super().__init__()
        cfg.check_world_size(world_size)
        self.cfg = cfg
        self.batch = batch_size
        self.seq = seq_length
        self.kv_mode = kv_mode
        self.model = LlamaModel(cfg, world_size, kv_mode, batch_size, seq_length, dtype)
        self.lm_head = ColumnParallelLinear(cfg.hidden_size, cfg.vocab_size, world_size, dtype)
        self.gather_vocab = Collective.gather_last_dim(world_size)
        group = cfg.n_heads // cfg.n_kv_heads
        cos, sin = rotary_tables(seq_length, cfg.head_dim, cfg.rope_theta)
        self.cos_table = Tensor(cos)
        self.sin_table = Tensor(sin)
        self.cos_prefill = Tensor(cos.reshape(1, 1, seq_length, -1).astype(np.float32), dtype)
        self.sin_prefill = Tensor(sin.reshape(1, 1, seq_length, -1).astype(np.float32), dtype)
        causal = np.triu(np.full((seq_length, seq_length), _NEG, np.float32), 1)
        self.causal_bias = Tensor(np.tile(causal, (group, 1)))
        self.positions = Tensor(np.arange(seq_length, dtype=np.int32).reshape(1, seq_length))
        self.row_offsets = Tensor(np.arange(batch_size, dtype=np.int32) * seq_length)
        self.dtype = dtype
        self.gather = ops.Gather()
        self.reshape = ops.Reshape()
        self.cast = ops.Cast()
        self.less = ops.Less()
        self.equal = ops.Equal()

    def _logits(self, hidden):
        """hidden (B, H) of each row's last valid token -> float32 logits (B, vocab)."""
        logits = self.lm_head(self.model.norm_out(hidden))
        return self.gather_vocab(self.cast(logits, ms.float32))

    def prefill(self, input_ids, batch_valid_length):
        x = self.model.tok_embeddings(input_ids)
        new_kv = ()
        for layer in self.model.layers:
            attn, k, v = layer.attention.prefill(layer.attention_norm(x), self.cos_prefill,
                                                 self.sin_prefill, self.causal_bias)
            x = layer.finish(x, attn)
            new_kv = new_kv + (k, v)
        last = self.row_offsets + batch_valid_length - 1
        hidden = self.gather(self.reshape(x, (self.batch * self.seq, -1)), last, 0)
        logits = self._logits(hidden)
        return (logits,) + new_kv if self.kv_mode == "io" else logits

    def increment(self, input_ids, batch_valid_length, kv):
        pos = self.reshape(batch_valid_length - 1, (self.batch, 1))
        cos = self.cast(self.reshape(self.gather(self.cos_table, pos, 0), (self.batch, 1, 1, -1)), self.dtype)
        sin = self.cast(self.reshape(self.gather(self.sin_table, pos, 0), (self.batch, 1, 1, -1)), self.dtype)
        x = self.model.tok_embeddings(input_ids)
        new_kv = ()
        i = 0
        for layer in self.model.layers:
            h = layer.attention_norm(x)
            if self.kv_mode == "io":
                visible = self.cast(self.less(self.positions, pos), ms.float32)     # rows < pos
                bias = self.reshape((1.0 - visible) * _NEG, (self.batch, 1, 1, self.seq))
                attn, k, v = layer.attention.step_io(h, cos, sin, kv[2 * i], kv[2 * i + 1], bias)
            else:
                onehot = self.cast(self.equal(self.positions, pos), ms.float32)
                visible = self.cast(self.less(self.positions, pos + 1), ms.float32)  # rows <= pos
                bias = self.reshape((1.0 - visible) * _NEG, (self.batch, 1, 1, self.seq))
                attn, k, v = layer.attention.step_in_graph(
                    h, cos, sin, self.reshape(onehot, (self.batch, 1, self.seq, 1)), bias)
            x = layer.finish(x, attn)
            new_kv = new_kv + (k, v)
            i = i + 1
        logits = self._logits(self.reshape(x, (self.batch, -1)))
        return (logits,) + new_kv if self.kv_mode == "io" else logits


class PrefillGraph(nn.Cell):
    """The exported prefill graph: inputs and outputs as in lite_runtime/families.py."""

    def __init__(self, net: LlamaForCausalLM):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, input_ids, batch_valid_length):
        return self.net.prefill(input_ids, batch_valid_length)


class IncrementGraph(nn.Cell):
    """The exported increment graph; `kv` are the per-layer key/value caches in io mode."""

    def __init__(self, net: LlamaForCausalLM):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, input_ids, batch_valid_length, *kv):
        return self.net.increment(input_ids, batch_valid_length, kv)
