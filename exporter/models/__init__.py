"""Model implementations by family name; every family of the registry must have one (tested)."""
from __future__ import annotations

from typing import NamedTuple

from lite_runtime.families import FAMILIES
from .llama import IncrementGraph, LlamaForCausalLM, PrefillGraph


class FamilyModel(NamedTuple):
    network: type          # network(cfg, batch_size, seq_length, kv_mode, world_size, dtype)
    prefill_graph: type    # wraps a network into the exported prefill graph
    increment_graph: type


_LLAMA = FamilyModel(LlamaForCausalLM, PrefillGraph, IncrementGraph)
MODEL_CLASSES = {name: _LLAMA for name in FAMILIES}
