"""One rank's dynamic step cut at its collectives (`parallel.collectives: host`), for runtimes
without collectives (MindSpore Lite on CPU). The segments and their I/O are the runtime contract's
(lite_runtime/contract/segments.py); each is a thin view of the same `CausalLM` the whole step uses,
so the two forms cannot compute different things.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
from mindspore import Tensor, nn

from exporter.models.decoder import CausalLM
from exporter.models.linear import RowParallelLinear


def keep_row_biases_on_rank0(net: CausalLM, rank: int) -> None:
    """A row-parallel layer's replicated bias stays on rank 0 only, so the host's sum of the ranks'
    partial outputs adds it once. Call after the weights are loaded (net built with
    graph_collectives False)."""
    for _, cell in net.cells_and_names():
        if isinstance(cell, RowParallelLinear) and cell.has_bias and rank > 0:
            cell.bias.set_data(Tensor(np.zeros(cell.bias.shape, np.float32), cell.bias.dtype))


class EmbedSegment(nn.Cell):
    def __init__(self, net: CausalLM):
        super().__init__(auto_prefix=False)
        self.net = net
        self.rotary = net.cfg.positions == "rotary"

    def construct(self, input_ids, past_length):
        x, cos, sin, past, _ = self.net.step_start(input_ids, past_length)
        if self.rotary:
            return x, cos, sin, past
        return x, past


class AttentionSegment(nn.Cell):
    """A layer's attention up to (not including) the all-reduce of its output projection. Each
    segment makes its own score biases (the whole step shares them across layers)."""

    def __init__(self, net: CausalLM, layer: int):
        super().__init__(auto_prefix=False)
        self.net, self.layer = net, net.layers[layer]

    def _attend(self, hidden, cos, sin, past, key_cache, value_cache):
        out, k, v, _ = self.layer.attn.step_dynamic(self.layer.attn_norm(hidden), cos, sin, key_cache, value_cache,
                                                    past, self.net.bias)
        return out, k, v


class RotaryAttentionSegment(AttentionSegment):
    def construct(self, hidden, cos, sin, past, key_cache, value_cache):
        return self._attend(hidden, cos, sin, past, key_cache, value_cache)


class PlainAttentionSegment(AttentionSegment):
    """Positions that do not rotate q/k (learned, ALiBi): no cos/sin inputs."""

    def construct(self, hidden, past, key_cache, value_cache):
        return self._attend(hidden, None, None, past, key_cache, value_cache)


class MlpSegment(nn.Cell):
    def __init__(self, net: CausalLM, layer: int):
        super().__init__(auto_prefix=False)
        self.layer = net.layers[layer]

    def construct(self, hidden):
        return self.layer.mlp(self.layer.mlp_norm(hidden))


class HeadSegment(nn.Cell):
    def __init__(self, net: CausalLM):
        super().__init__(auto_prefix=False)
        self.net = net

    def construct(self, hidden, input_ids, batch_valid_length, past_length):
        return self.net.step_logits(hidden, input_ids, batch_valid_length, past_length)


def segment_cells(net: CausalLM) -> Dict[str, nn.Cell]:
    """The cells to export, by segment name (contract order)."""
    cells = {"embed": EmbedSegment(net)}
    attention = RotaryAttentionSegment if net.cfg.positions == "rotary" else PlainAttentionSegment
    for l in range(len(net.layers)):
        cells[f"layer{l}.attn"] = attention(net, l)
        cells[f"layer{l}.mlp"] = MlpSegment(net, l)
    cells["head"] = HeadSegment(net)
    return cells
