"""The segment form of a tensor-parallel export: each rank's dynamic step cut at its collectives.

MindSpore Lite on CPU has no collectives (Lite 2.0 drops AllReduce with a warning), so an export
with `parallel.collectives: host` holds, per rank, the step graph in pieces that contain none; the
runtime runs them in order and does the reductions on the host between them:

    embed         input_ids (B, T), past_length
                  -> hidden (N, H), cos, sin (N, 1, hd), past (B, 1, 1, 1) float32     N = B*T
    layer{l}.attn hidden, cos, sin, past, key_cache (B, kv, hd, P), value_cache (B, kv, P, hd) of layer l
                  -> attn_part (N, H), key_new (B, kv, hd, T), value_new (B, kv, T, hd)
    layer{l}.mlp  hidden -> mlp_part (N, H)
    head          hidden, input_ids, batch_valid_length, past_length -> logits_part (B, vocab / ranks)

Between them, on the host: hidden += all_reduce(attn_part); hidden += all_reduce(mlp_part); the
logits are the ranks' parts joined along the vocabulary. A row-parallel layer's bias is held by
rank 0 only, so the sum adds it once. The step's own contract (families.py) stays what the decode
loop sees; segments are the backend's business. cos and sin exist only where positions rotate
(dims.rotary): Lite drops graph inputs a graph does not use, so the contract must not list any.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from lite_runtime.contract.families import DYNAMIC, GraphDims, TensorSpec

COLLECTIVE_FORMS = ("graph", "host")   # collectives inside each rank's graphs, or between segments on the host
SEGMENT_FOLDER = "segments"
Specs = Tuple[List[TensorSpec], List[TensorSpec]]


def segment_names(num_layers: int) -> List[str]:
    """The segments of one step, in the order they run."""
    layers = [f"layer{l}.{part}" for l in range(num_layers) for part in ("attn", "mlp")]
    return ["embed"] + layers + ["head"]


def segment_relpath(name: str, rank: int) -> str:
    return f"{SEGMENT_FOLDER}/rank_{rank}/{name}.mindir"


def segment_specs(dims: GraphDims, world_size: int, steps: int = DYNAMIC, positions: int = DYNAMIC) -> Dict[str, Specs]:
    """(inputs, outputs) of every segment; `steps` (T) and `positions` (P) are DYNAMIC in the manifest
    and the call's sizes when the runtime resizes the segments."""
    b, kv, hd, hidden = dims.batch_size, dims.kv_heads_per_rank, dims.head_dim, dims.hidden_size
    tokens = DYNAMIC if steps == DYNAMIC else b * steps
    f32 = "float32"
    x = TensorSpec("hidden", f32, (tokens, hidden))
    rotary = [TensorSpec("cos", f32, (tokens, 1, hd)), TensorSpec("sin", f32, (tokens, 1, hd))] if dims.rotary else []
    past = TensorSpec("past", f32, (b, 1, 1, 1))
    ids = [TensorSpec("input_ids", "int32", (b, steps)), TensorSpec("batch_valid_length", "int32", (b,)),
           TensorSpec("past_length", "int32", (b,))]
    specs = {"embed": ([ids[0], ids[2]], [x] + rotary + [past])}
    for l in range(dims.num_layers):
        cache = [TensorSpec("key_cache", f32, (b, kv, hd, positions)),
                 TensorSpec("value_cache", f32, (b, kv, positions, hd))]
        new = [TensorSpec("key_new", f32, (b, kv, hd, steps)), TensorSpec("value_new", f32, (b, kv, steps, hd))]
        specs[f"layer{l}.attn"] = ([x] + rotary + [past] + cache, [TensorSpec("attn_part", f32, (tokens, hidden))] + new)
        specs[f"layer{l}.mlp"] = ([x], [TensorSpec("mlp_part", f32, (tokens, hidden))])
    specs["head"] = ([x] + ids, [TensorSpec("logits_part", f32, (b, dims.vocab_size // world_size))])
    return specs
