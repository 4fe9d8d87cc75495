"""PanGu-α's top query layer (`DecoderConfig.top_query`): the last of the model's num_layers, after
the final norm. It is a pre-norm block whose attention takes its query from a learned embedding of
each token's position (`query_embed`, one row per position, as the position table) instead of the
hidden state; keys and values come from the normed hidden state as in any block, so its K/V cache
is one more pair after the blocks'. Then its own MLP and the two residuals; no norm follows (the
head reads its output).

Its layers are the blocks' (column-parallel q/k/v and up, row-parallel o and down), so tensor
parallelism splits it by the same rules; the query table is replicated. SLoRA adapts the blocks only.
"""
from __future__ import annotations

from mindspore import nn

from exporter.models.attention import Attention, BuildContext
from exporter.models.config import DecoderConfig
from exporter.models.linear import Embedding
from exporter.models.mlp import make_mlp
from exporter.models.norms import make_norm


class TopQueryLayer(nn.Cell):
    def __init__(self, cfg: DecoderConfig, ctx: BuildContext):
        super().__init__()
        ctx = ctx._replace(lora_width=0, lora_rank=0, lora_targets=frozenset())
        self.query_embed = Embedding(cfg.max_position_embeddings, cfg.hidden_size, ctx.dtype, ctx.flat)
        self.attn_norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, ctx.dtype)
        self.attn = Attention(cfg, ctx)
        self.mlp_norm = make_norm(cfg.norm, cfg.hidden_size, cfg.norm_eps, ctx.dtype)
        self.mlp = make_mlp(cfg.mlp, cfg.hidden_size, cfg.intermediate_size, ctx.world_size, ctx.dtype, cfg.mlp_bias,
                            ctx.flat, None, ctx.graph_collectives)

    def finish(self, x, attn_out):
        h = x + attn_out
        return h + self.mlp(self.mlp_norm(h))

    # Each method: x the final norm's output, `positions` int32 of the tokens (x's leading shape);
    # returns the layer's output and the new K/V rows, as Attention's method of the same name.

    def prefill(self, x, positions, cos, sin, bias):
        attn, k, v = self.attn.prefill(self.attn_norm(x), cos, sin, bias, query=self.query_embed(positions))
        return self.finish(x, attn), k, v

    def step(self, x, positions, cos, sin, k_past, v_past, biases, row=None):
        attn, k, v = self.attn.step(self.attn_norm(x), cos, sin, k_past, v_past, biases,
                                    query=self.query_embed(positions), row=row)
        return self.finish(x, attn), k, v
