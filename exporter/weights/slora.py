"""SLoRA: many LoRA adapters served by one export, chosen per row at run time.

`pet_config: {pet_type: slora, adapter_path: lora_adapter.json}` names the adapters
(`{"adapter1": "/path/to/adapter1_dir", ...}`, paths relative to the json file). Each folder is a
Hugging Face PEFT adapter (`adapter_config.json` + `adapter_model.safetensors`) or a MindFormers one
(`adapter_config.json` with `r`, `lora_alpha` + `adapter_model.ckpt` with `…mindpet_delta_lora_a/b`
under MindFormers names). Every adapted layer of the network holds all adapters side by side
(models/linear.py): A (slots·r, in) and B (out, slots·r), slot 0 zeros (the base model), slot i
the i-th adapter of the json, smaller ranks padded with zeros, alpha/r folded into B.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Tuple

import numpy as np

from lite_runtime.contract.errors import ConfigError, WeightError
from exporter.weights.adapters import MF_A, MF_B, LoraAdapter, _digest, check_rank_alpha, read_peft_adapter

_LAYER_TENSOR = re.compile(r"layers\.(\d+)\.(attn\.[qkvo]|mlp\.(?:gate|up|down))\.weight")


@dataclass
class SLoraSet:
    adapters: List[LoraAdapter]          # slot i + 1 = adapters[i]
    plans: List[object]                  # each adapter's weight plan (its names: HF or MindFormers)

    @property
    def slots(self) -> int:
        return len(self.adapters) + 1

    @property
    def rank(self) -> int:
        return max(a.r for a in self.adapters)

    def describe(self) -> List[dict]:
        return [{"name": a.name, "type": "slora", "slot": i + 1, "r": a.r, "alpha": a.alpha,
                 "targets": sorted(a.pairs), "sha256": a.sha256} for i, a in enumerate(self.adapters)]


def read_slora(pet_config: dict, family, where: str) -> SLoraSet:
    path = pet_config.get("adapter_path")
    if not path or not os.path.isfile(path):
        raise ConfigError(f"{where}: pet_config.adapter_path {path!r} is not a file (a lora_adapter.json mapping "
                          "adapter names to adapter folders)")
    try:
        with open(path, encoding="utf-8") as f:
            folders = json.load(f)
    except ValueError as e:
        raise ConfigError(f"{path}: not JSON: {e}") from None
    if not isinstance(folders, dict) or not folders:
        raise ConfigError(f"{path}: expected a mapping of adapter names to folders, got {folders!r}")
    adapters, plans = [], []
    for name, folder in folders.items():
        folder = os.path.join(os.path.dirname(os.path.abspath(path)), folder)
        if os.path.isfile(os.path.join(folder, "adapter_model.safetensors")):
            adapter, plan = read_peft_adapter(folder), family.hf_weights
        elif os.path.isfile(os.path.join(folder, "adapter_model.ckpt")):
            adapter, plan = _read_mindformers_adapter(folder), family.mindformers_weights
        else:
            raise ConfigError(f"{path}: adapter {name!r}: {folder} has neither adapter_model.safetensors (PEFT) "
                              "nor adapter_model.ckpt (MindFormers)")
        adapter.name = name
        adapters.append(adapter)
        plans.append(plan)
    return SLoraSet(adapters, plans)


def _read_mindformers_adapter(folder: str) -> LoraAdapter:
    from exporter.weights.checkpoints import read_ckpt
    config_path = os.path.join(folder, "adapter_config.json")
    if not os.path.isfile(config_path):
        raise ConfigError(f"adapter folder {folder} has no adapter_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    adapter = LoraAdapter(os.path.basename(os.path.normpath(folder)),
                          *check_rank_alpha(config.get("r", config.get("lora_rank")),
                                            config.get("lora_alpha"), config_path))
    weights_path = os.path.join(folder, "adapter_model.ckpt")
    tensors = read_ckpt(weights_path)
    for name, value in tensors.items():
        if not name.endswith((MF_A, MF_B)):
            raise WeightError(f"{weights_path}: tensor {name} is not a LoRA A or B matrix ({MF_A} / {MF_B})")
        stem, other = (name[:-len(MF_A)], MF_B) if name.endswith(MF_A) else (name[:-len(MF_B)], MF_A)
        if stem + other not in tensors:
            raise WeightError(f"{weights_path}: LoRA tensor {name} has no {stem + other}")
        if name.endswith(MF_A):
            adapter.pairs[stem + ".weight"] = (value, tensors[stem + MF_B])
    adapter.sha256 = _digest(adapter.pairs)
    return adapter


def targets(slora: SLoraSet) -> FrozenSet[str]:
    """The adapted layer kinds ("attn.q", "mlp.down" ...): every block gets them all."""
    return frozenset(kind for _, kind, _ in _canonical_pairs(slora))


def stacked_weights(slora: SLoraSet, cfg) -> Dict[str, np.ndarray]:
    """Canonical `layers.{L}.{kind}.lora_a` (slots·r, in) and `.lora_b` (out, slots·r) of the full model."""
    r, out = slora.rank, {}
    shapes = _layer_shapes(cfg)
    kinds = targets(slora)
    for layer in range(cfg.num_blocks):      # the blocks (a top query layer is not adapted)
        for kind in kinds:
            rows, cols = shapes[kind]
            out[f"layers.{layer}.{kind}.lora_a"] = np.zeros((slora.slots * r, cols), np.float32)
            out[f"layers.{layer}.{kind}.lora_b"] = np.zeros((rows, slora.slots * r), np.float32)
    for (layer, kind, source), slot, adapter in _canonical_pairs(slora, with_slots=True):
        a, b = adapter.pairs[source]
        rows, cols = shapes[kind]
        if a.ndim != 2 or b.ndim != 2 or a.shape != (adapter.r, cols) or b.shape != (rows, adapter.r):
            raise WeightError(f"adapter {adapter.name}: {source} has A {tuple(a.shape)} and B {tuple(b.shape)}; the "
                              f"base layer needs A ({adapter.r}, {cols}) and B ({rows}, {adapter.r})")
        columns = slice(slot * r, slot * r + adapter.r)
        out[f"layers.{layer}.{kind}.lora_a"][columns] = a
        out[f"layers.{layer}.{kind}.lora_b"][:, columns] = adapter.scale * b
    return out


def _canonical_pairs(slora: SLoraSet, with_slots: bool = False):
    """((layer, kind, source name), slot, adapter) of every adapter pair, by the adapter's plan."""
    found = []
    for slot, (adapter, plan) in enumerate(zip(slora.adapters, slora.plans), start=1):
        for source in adapter.pairs:
            match = plan._match(source)
            canonical = match and len(match[0].targets) == 1 and match[0].targets[0].format(**match[1])
            m = _LAYER_TENSOR.fullmatch(canonical or "")
            if not m:
                raise WeightError(f"adapter {adapter.name}: target {source} is not a projection the SLoRA export "
                                  "can adapt (q, k, v, o, gate, up, down of a block, not fused in the checkpoint)")
            found.append(((int(m.group(1)), m.group(2), source), slot, adapter))
    return found if with_slots else [key for key, _, _ in found]


def _layer_shapes(cfg) -> Dict[str, Tuple[int, int]]:
    """(out, in) of each adaptable layer of the full model."""
    hd, h, inter = cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    return {"attn.q": (cfg.n_heads * hd, h), "attn.k": (cfg.n_kv_heads * hd, h), "attn.v": (cfg.n_kv_heads * hd, h),
            "attn.o": (h, cfg.n_heads * hd), "mlp.gate": (inter, h), "mlp.up": (inter, h), "mlp.down": (h, inter)}
