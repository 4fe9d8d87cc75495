"""One rank's packed step cut at its collectives (`parallel.collectives: host`), for runtimes
without collectives (MindSpore Lite on CPU). The segments and their I/O are the runtime contract's
(lite_runtime/contract/segments.py); each is a thin view of the same `CausalLM` the whole step uses,
so the two forms cannot compute different things. Optional inputs come as `*kv` in the contract's
order (MindSpore records them as kv0, kv1 ...); every input listed is used, as Lite requires.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
from mindspore import Tensor, nn

from lite_runtime.contract.segments import SegmentLayout
from exporter.models.decoder import CausalLM
from exporter.models.linear import RowParallelLinear
from exporter.models.packed import CONTEXT, PAST, POSITION, ROW


def keep_row_biases_on_rank0(net: CausalLM, rank: int) -> None:
    """A row-parallel layer's replicated bias stays on rank 0 only, so the host's sum of the ranks'
    partial outputs adds it once. Call after the weights are loaded (net built with
    graph_collectives False)."""
    for _, cell in net.cells_and_names():
        if isinstance(cell, RowParallelLinear) and cell.has_bias and rank > 0:
            cell.bias.set_data(Tensor(np.zeros(cell.bias.shape, np.float32), cell.bias.dtype))


class _Segment(nn.Cell):
    def __init__(self, net: CausalLM, layout: SegmentLayout):
        super().__init__(auto_prefix=False)
        self.net = net
        self.rotary = net.cfg.positions in ("rotary", "rotary_2d")
        self.i_adapter = len(layout.row_inputs)                 # embed: adapter_ids after the row inputs
        self.i_context = 2 if self.rotary else 0                # attention: context after cos, sin
        self.i_columns = self.i_context + int(layout.prefix_attention)   # attention: then the adapter columns

    def attention_inputs(self, kv, adapted: bool):
        """cos, sin, context and the adapter columns from an attention's optional inputs `kv` (None
        where the layout has none)."""
        cos = sin = context = select = None
        if self.rotary:
            cos, sin = kv[0], kv[1]
        if self.net.prefix:
            context = kv[self.i_context]
        if adapted:
            select = kv[self.i_columns]
        return cos, sin, context, select


# What the attention reads about the tokens (packed.py: ROWS .. CONTEXT) passes between the segments
# as token_rows (a step input), past, row, position and GLM's context.

class EmbedSegment(_Segment):
    """kv: the family's row inputs (GLM: context_length, mask_position), then adapter_ids (SLoRA)."""

    def construct(self, input_ids, token_rows, token_positions, past_length, *kv):
        context = mask_position = adapter_ids = None
        if self.net.two_d:
            context, mask_position = kv[0], kv[1]
        if self.net.lora:
            adapter_ids = kv[self.i_adapter]
        x, cos, sin, tokens, select = self.net.packed_start(input_ids, token_rows, token_positions, past_length,
                                                            adapter_ids, context, mask_position)
        out = (x,)
        if self.rotary:
            out = out + (cos, sin)
        out = out + (tokens[PAST], tokens[ROW], tokens[POSITION])
        if self.net.prefix:
            out = out + (tokens[CONTEXT],)
        if self.net.lora:
            out = out + (select,)
        return out


def _tokens(token_rows, past, row, position, context):
    """The packed attention's token tuple (packed.py: ROWS .. META; META is made where it is used)."""
    return token_rows, row, position, past, context, None


class AttentionSegment(_Segment):
    """A block's attention up to (not including) the all-reduce of its output projection, with its
    own score biases (the whole step shares them across layers). kv: [cos, sin], [context],
    [adapter columns]. DeepNorm also returns its residual, alpha x the normed input."""

    def __init__(self, net: CausalLM, layout: SegmentLayout, layer: int):
        super().__init__(net, layout)
        self.layer, self.index = net.layers[layer], layer       # index: the layer of the paged store
        self.adapted, self.deepnorm = "attn" in layout.adapted, layout.deepnorm

    def construct(self, hidden, token_rows, past, row, position, key_cache, value_cache, *kv):
        return self.attend(hidden, token_rows, past, row, position, key_cache, value_cache, kv)

    def attend(self, hidden, token_rows, past, row, position, key_cache, value_cache, kv):
        cos, sin, context, select = self.attention_inputs(kv, self.adapted)
        h = self.layer.attn_norm(hidden)
        out, k, v, _ = self.net.packed_attention(self.layer.attn, h, cos, sin, key_cache, value_cache,
                                                 _tokens(token_rows, past, row, position, context), None, select,
                                                 layer=self.index)
        if self.deepnorm:
            return out, h * self.layer.alpha, k, v
        return out, k, v


class BlocksSegment(_Segment):
    """Whole blocks from layer `first` (one rank: no partial sums), returning the hidden state. kv:
    the blocks' past K/V pairs, then [cos, sin], [context], [adapter columns]."""

    def __init__(self, net: CausalLM, layout: SegmentLayout, first: int, count: int):
        super().__init__(net, layout)
        # a tuple: an nn.CellList renames the parameters of the cells put in it (the network's own)
        self.blocks = tuple(net.layers[l] for l in range(first, first + count))
        self.first = first
        self.caches = 2 if layout.paged else 2 * count     # the store's tables and id, or a K/V pair a layer
        self.adapted = bool(layout.adapted)

    def construct(self, hidden, token_rows, past, row, position, *kv):
        return self.run(hidden, token_rows, past, row, position, kv)

    def run(self, hidden, token_rows, past, row, position, kv):
        cos, sin, context, select = self.attention_inputs(kv[self.caches:], self.adapted)
        tokens = _tokens(token_rows, past, row, position, context)
        x, new_kv, _ = self.net.packed_blocks(self.blocks, hidden, cos, sin, kv, tokens, None, select, self.first)
        return (x,) + new_kv


class MlpSegment(_Segment):
    """A block's (or the top query layer's) MLP up to the all-reduce; kv: [adapter columns]."""

    def __init__(self, net: CausalLM, layout: SegmentLayout, layer, block: bool = True):
        super().__init__(net, layout)
        self.layer = layer
        self.adapted = block and "mlp" in layout.adapted
        self.deepnorm = block and layout.deepnorm

    def construct(self, hidden, *kv):
        m = self.layer.mlp_norm(hidden)
        part = self.layer.mlp(m, kv[0]) if self.adapted else self.layer.mlp(m)
        if self.deepnorm:
            return part, m * self.layer.alpha
        return part


class TopQueryAttentionSegment(_Segment):
    """PanGu-alpha's top query layer's attention on the final norm's output, which is its residual;
    kv: [cos, sin]."""

    def construct(self, hidden, token_positions, token_rows, past, row, position, key_cache, value_cache, *kv):
        return self.attend(hidden, token_positions, token_rows, past, row, position, key_cache, value_cache, kv)

    def attend(self, hidden, token_positions, token_rows, past, row, position, key_cache, value_cache, kv):
        cos = sin = None
        if self.rotary:
            cos, sin = kv[0], kv[1]
        layer = self.net.top_query
        h = self.net.final_norm(hidden)
        out, k, v, _ = self.net.packed_attention(layer.attn, layer.attn_norm(h), cos, sin, key_cache, value_cache,
                                                 _tokens(token_rows, past, row, position, None), None, None,
                                                 layer.query_embed(token_positions), len(self.net.layers))
        return out, h, k, v


# With `attention: kernel` the attention reads no token_rows (the kernel finds each token's row in `row`), and
# Lite drops an input no node reads: these take none.

class KernelAttentionSegment(AttentionSegment):
    def construct(self, hidden, past, row, position, key_cache, value_cache, *kv):
        return self.attend(hidden, None, past, row, position, key_cache, value_cache, kv)


class KernelBlocksSegment(BlocksSegment):
    def construct(self, hidden, past, row, position, *kv):
        return self.run(hidden, None, past, row, position, kv)


class KernelTopQueryAttentionSegment(TopQueryAttentionSegment):
    def construct(self, hidden, token_positions, past, row, position, key_cache, value_cache, *kv):
        return self.attend(hidden, token_positions, None, past, row, position, key_cache, value_cache, kv)


# With `attention: paged` the attention nodes read each row's block ids and the store's id (the step's own
# inputs) in place of the caches, and write the new K/V into the store: the same segments, named so.

class PagedAttentionSegment(AttentionSegment):
    def construct(self, hidden, past, row, position, block_tables, kv_store, *kv):
        out = self.attend(hidden, None, past, row, position, block_tables, kv_store, kv)
        return out[:2] if self.deepnorm else out[0]       # no new K/V: the node wrote them


class PagedBlocksSegment(BlocksSegment):
    def construct(self, hidden, past, row, position, block_tables, kv_store, *kv):
        return self.run(hidden, None, past, row, position, (block_tables, kv_store) + kv)[0]


class PagedTopQueryAttentionSegment(TopQueryAttentionSegment):
    def construct(self, hidden, token_positions, past, row, position, block_tables, kv_store, *kv):
        out = self.attend(hidden, token_positions, None, past, row, position, block_tables, kv_store, kv)
        return out[:2]


class HeadSegment(_Segment):
    def construct(self, hidden, last_token):
        return self.net.packed_logits(hidden, last_token)


def segment_cells(net: CausalLM, layout: SegmentLayout) -> Dict[str, nn.Cell]:
    """The cells to export, by segment name (the contract's order)."""
    cells = {"embed": EmbedSegment(net, layout)}
    group = layout.blocks_per_segment
    form = "paged" if layout.paged else "kernel" if layout.attention_kernel else "graph"
    blocks, attention, top_query = {
        "graph": (BlocksSegment, AttentionSegment, TopQueryAttentionSegment),
        "kernel": (KernelBlocksSegment, KernelAttentionSegment, KernelTopQueryAttentionSegment),
        "paged": (PagedBlocksSegment, PagedAttentionSegment, PagedTopQueryAttentionSegment)}[form]
    for l, layer in enumerate(net.layers):
        if group and l % group == 0:
            cells[f"layer{l}.blocks"] = blocks(net, layout, l, min(group, len(net.layers) - l))
        elif not group:
            cells[f"layer{l}.attn"] = attention(net, layout, l)
            cells[f"layer{l}.mlp"] = MlpSegment(net, layout, layer)
    if net.use_top_query:
        cells["top_query.attn"] = top_query(net, layout)
        cells["top_query.mlp"] = MlpSegment(net, layout, net.top_query, block=False)
    cells["head"] = HeadSegment(net, layout)
    return cells
