"""The segment form of a tensor-parallel export: each rank's packed step cut at its collectives.

MindSpore Lite on CPU has no collectives (Lite 2.0 drops AllReduce with a warning), so an export
with `parallel.collectives: host` holds, per rank, the step graph in pieces that contain none; the
runtime runs them in this order and does the reductions on the host between them (N tokens of any
rows, L of them picked for logits, P cache positions; [..]: only where the layout has it):

    embed          input_ids, token_rows, token_positions (N,), past_length (B,), [the family's row
                   inputs], [adapter_ids]
                   -> hidden (N, H), [cos, sin (N, 1, hd)], past (N, 1, 1, 1), row, position (N,)
                      float32, [context (N,)], [adapter_columns (N, slots*r)]
    layer{l}.attn  hidden, token_rows, past, row, position, key_cache (B, kv, hd, P),
                   value_cache (B, kv, P, hd) of layer l, [cos, sin], [context], [adapter_columns]
                   -> attn_part (N, H), [residual (N, H)], key_new, value_new (N, kv, hd)
    layer{l}.mlp   hidden, [adapter_columns] -> mlp_part (N, H), [residual]
    top_query.attn hidden, token_positions, token_rows, past, row, position, key_cache, value_cache
                   of the last layer, [cos, sin] -> attn_part, residual, key_new, value_new
    top_query.mlp  hidden -> mlp_part
    head           hidden, last_token (L,) -> logits_part (L, vocab / ranks): the picked tokens'
                   logits (families.py; exports before it pick exactly B)

One rank has nothing to reduce, so its blocks go in groups of whole layers instead (fewer, larger
models: a 1.1B model's step is 10 Lite calls instead of 46, each with its own per-call and load cost):

    layer{l}.blocks hidden, token_rows, past, row, position, key_cache, value_cache of each layer from
                   l on (pair after pair), [cos, sin], [context], [adapter_columns]
                   -> hidden (N, H), key_new, value_new of each of its layers

With the K/V in the kernels' paged store (`attention: paged`) each attention segment (or group of blocks)
reads `block_tables` (B, T) and `kv_store` (1,), the step's own two, in place of the caches, and returns no
new rows: its kernel node writes them into the rank's store, each layer into its own layer of it.

What the runtime does with a segment's tensors follows from their names alone, so its chain knows
no family: inputs named `key_cache` / `value_cache` take the step's caches in the order of the
segments and of their inputs (and `key_new` / `value_new` are the step's new rows in that order),
inputs named `block_tables` / `kv_store` the step's paged inputs of that name; a
partial sum (`attn_part`, `mlp_part`) is all-reduced and added to `hidden`, or, when the segment also returns a
`residual`, hidden = residual + the sum; `logits_part` is joined along the vocabulary across ranks;
any other output is host state read by later segments' inputs of its name, and any other input is
one of the step's own inputs (families.py) or such state. A row-parallel layer's bias is held by
rank 0 only, so the sum adds it once.

Where the families differ: positions that rotate q/k pass cos/sin; GLM v1 (prefix attention, 2-D
positions) gives its row inputs to embed, which passes each row's context length on as `context`,
and its DeepNorm blocks return the residual (alpha x the normed input) as the network does; PanGu-alpha's
top query layer is two segments of its own after the blocks (its query reads the
`token_positions`; its residual is the final norm's output); SLoRA exports give `adapter_ids` to embed,
which makes each token's adapter column mask for the segments whose layers carry adapters; with the
attention as one kernel node (`attention: kernel`) the attention segments read no `token_rows`. Lite
drops graph inputs a graph does not use, so no segment lists an input it does not read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from lite_runtime.contract.families import DYNAMIC, GraphDims, TensorSpec

COLLECTIVE_FORMS = ("graph", "host")   # collectives inside each rank's graphs, or between segments on the host
SEGMENT_FOLDER = "segments"
CACHE_INPUTS = ("key_cache", "value_cache")
PAGED_INPUTS = ("block_tables", "kv_store")     # the step's own (families.py), read by every attention segment
NEW_CACHE = ("key_new", "value_new")
PARTIAL_SUMS = ("attn_part", "mlp_part")
RESIDUAL = "residual"
LOGITS_PART = "logits_part"
HIDDEN = "hidden"
Specs = Tuple[List[TensorSpec], List[TensorSpec]]


@dataclass(frozen=True)
class SegmentLayout:
    """What of the network shapes the segments' I/O besides the graph dims (the exporter's choice)."""
    row_inputs: Tuple[str, ...] = ()   # the family's per-row step inputs (GLM's), read by embed
    prefix_attention: bool = False     # `context` from embed to the attention segments (GLM)
    deepnorm: bool = False             # the blocks' segments return their residual (GLM v1)
    top_query: bool = False            # the last layer is PanGu-alpha's top query layer
    adapter_columns: int = 0           # SLoRA: slots x rank, the width of the per-token adapter mask
    adapted: Tuple[str, ...] = ()      # "attn", "mlp": the block parts whose layers carry adapters
    blocks_per_segment: int = 0        # one rank: whole layers per `blocks` segment (0: attn and mlp apart)
    attention_kernel: bool = False     # `attention: kernel`: the attention reads no token_rows (`row` serves)
    paged: bool = False                # `attention: paged` (a kernel node too): the K/V in the rank's paged store


def segment_relpath(name: str, rank: int) -> str:
    return f"{SEGMENT_FOLDER}/rank_{rank}/{name}.mindir"


def segment_specs(dims: GraphDims, world_size: int, layout: SegmentLayout = SegmentLayout()) -> Dict[str, Specs]:
    """(inputs, outputs) of every segment, in the order they run; N, L and P are DYNAMIC (`call_shape`)."""
    b, kv, hd, hidden, n = dims.batch_size, dims.kv_heads_per_rank, dims.head_dim, dims.hidden_size, DYNAMIC
    f32, i32 = "float32", "int32"
    x = TensorSpec(HIDDEN, f32, (n, hidden))
    rotary = [TensorSpec("cos", f32, (n, 1, hd)), TensorSpec("sin", f32, (n, 1, hd))] if dims.rotary else []
    columns = [TensorSpec("adapter_columns", f32, (n, layout.adapter_columns))] if layout.adapter_columns else []
    rows = [TensorSpec(name, i32, (b,)) for name in layout.row_inputs]
    adapter_ids = [TensorSpec("adapter_ids", i32, (b,))] if layout.adapter_columns else []
    cache = [TensorSpec(CACHE_INPUTS[0], f32, (b, kv, hd, DYNAMIC)), TensorSpec(CACHE_INPUTS[1], f32, (b, kv, DYNAMIC, hd))]
    paged = ([TensorSpec(PAGED_INPUTS[0], f32, (b, dims.kv_blocks_per_row)), TensorSpec(PAGED_INPUTS[1], f32, (1,))]
             if dims.kv_block else [])
    # per token: its row, its row's past, as float its row and position; GLM's context
    ids = [TensorSpec(name, i32, (n,)) for name in ("input_ids", "token_rows", "token_positions")]
    past_length, last = TensorSpec("past_length", i32, (b,)), TensorSpec("last_token", i32, (n,))
    tokens = [ids[1], TensorSpec("past", f32, (n, 1, 1, 1)), TensorSpec("row", f32, (n,)),
              TensorSpec("position", f32, (n,))]
    context = [TensorSpec("context", f32, (n,))] if layout.prefix_attention else []
    attending = tokens[1:] if layout.attention_kernel else tokens     # what the attention segments read of them
    new = [TensorSpec(name, f32, (n, kv, hd)) for name in NEW_CACHE]
    if layout.paged != bool(paged) or layout.paged and not layout.attention_kernel:
        raise ValueError("a paged layout is a kernel node's, over dims with kv_block, and only it has kv_block")
    if layout.paged:
        new = []
    caches = lambda layers: paged if layout.paged else cache * layers     # what an attention or a group reads
    embed = (ids + [past_length] + rows + adapter_ids, [x] + rotary + tokens[1:] + context + columns)
    positions, head = ids[2:3], [x, last]
    residual = [TensorSpec(RESIDUAL, f32, (n, hidden))]
    part = {name: TensorSpec(name, f32, (n, hidden)) for name in PARTIAL_SUMS}
    specs = {"embed": embed}
    own = lambda part_name: columns if part_name in layout.adapted else []
    blocks = dims.num_layers - int(layout.top_query)
    group = layout.blocks_per_segment
    if group and world_size != 1:
        raise ValueError(f"blocks_per_segment is for one rank, not {world_size}")
    for first in range(0, blocks, group or 1):
        if group:
            layers = min(group, blocks - first)
            adapters = columns if layout.adapted else []
            specs[f"layer{first}.blocks"] = ([x] + attending + caches(layers) + rotary + context + adapters,
                                             [x] + new * layers)
            continue
        kept = residual if layout.deepnorm else []
        specs[f"layer{first}.attn"] = ([x] + attending + caches(1) + rotary + context + own("attn"),
                                       [part["attn_part"]] + kept + new)
        specs[f"layer{first}.mlp"] = ([x] + own("mlp"), [part["mlp_part"]] + kept)
    if layout.top_query:
        specs["top_query.attn"] = ([x] + positions + attending + caches(1) + rotary, [part["attn_part"]] + residual + new)
        specs["top_query.mlp"] = ([x], [part["mlp_part"]])
    specs["head"] = (head, [TensorSpec(LOGITS_PART, f32, (n, dims.vocab_size // world_size))])
    return specs


def run_order(names) -> List[str]:
    """Segment names in the order they run (a manifest keeps its segments sorted by name): embed, the
    blocks' attn then mlp (or their groups) by layer, the top query layer's, head."""
    def key(name: str):
        if name in ("embed", "head"):
            return (0 if name == "embed" else 3, 0, 0)
        block, part = name.split(".")
        layer = int(block[len("layer"):]) if block.startswith("layer") else 0
        return (1 if block.startswith("layer") else 2, layer, ("attn", "mlp", "blocks").index(part))
    return sorted(names, key=key)


PICKED = ("last_token", LOGITS_PART)     # per picked token (the step's L)


def call_shape(spec: TensorSpec, tokens: int, positions: int, picks: int) -> Tuple[int, ...]:
    """A segment tensor's shape in a call of `tokens` tokens, `picks` of them giving logits, against
    `positions` cache rows: DYNAMIC is P in the caches, L in PICKED, N elsewhere."""
    def size() -> int:
        if spec.name in CACHE_INPUTS:
            return positions
        return picks if spec.name in PICKED else tokens
    return tuple(size() if d == DYNAMIC else d for d in spec.shape)
