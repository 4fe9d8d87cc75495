"""LoRA adapters merged into the base weights at export: W + (alpha / r) · B·A, so the exported
graphs cost nothing extra.

Sources: a MindFormers LoRA checkpoint (base weights plus `<layer>.mindpet_delta_lora_a` (r, in) and
`<layer>.mindpet_delta_lora_b` (out, r) tensors, with `pet_config` in the yaml), or a Hugging Face
PEFT folder (`adapter_config.json` + `adapter_model.safetensors`, `…q_proj.lora_A.weight`). The merge
happens under the checkpoint's own names, before the family's plan, so fused and transposed source
tensors are handled by the same rules as the base weights.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np

from lite_runtime.contract.errors import ConfigError, WeightError
from exporter.weights.safetensors_io import read_safetensors

MF_A, MF_B = ".mindpet_delta_lora_a", ".mindpet_delta_lora_b"
PEFT_PREFIX = "base_model.model."


@dataclass
class LoraAdapter:
    name: str
    r: int
    alpha: float
    pairs: Dict[str, Tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)   # base weight name -> (A, B)
    sha256: str = ""

    @property
    def scale(self) -> float:
        return self.alpha / self.r

    def describe(self) -> dict:
        """What the manifest records."""
        return {"name": self.name, "type": "lora", "merged": True, "r": self.r, "alpha": self.alpha,
                "targets": sorted(self.pairs), "sha256": self.sha256}


def adapter_record(source) -> List[dict]:
    """What the manifest records of the export's adapter (read from its configuration and files)."""
    from lite_runtime.contract.hashes import file_sha256
    if source.pet_config:
        pet = source.pet_config
        return [{"name": "pet_config", "type": "lora", "merged": True, "r": pet.get("lora_rank"),
                 "alpha": pet.get("lora_alpha"), "targets": pet.get("target_modules"),
                 "sha256": file_sha256(source.checkpoint) if os.path.isfile(source.checkpoint) else None}]
    if source.adapter:
        adapter = read_peft_adapter(source.adapter)
        return [dict(adapter.describe(), sha256=file_sha256(os.path.join(source.adapter, "adapter_model.safetensors")))]
    if source.slora:
        return source.slora.describe()
    return []


def check_rank_alpha(r, alpha, where: str) -> Tuple[int, float]:
    for key, value in (("r", r), ("alpha", alpha)):
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{where}: LoRA {key} must be a positive number, got {value!r}")
    return int(r), float(alpha)


def split_mindformers_lora(tensors: Dict[str, np.ndarray], r, alpha, where: str):
    """(base tensors, adapter) from a MindFormers LoRA checkpoint."""
    base = {n: v for n, v in tensors.items() if not n.endswith((MF_A, MF_B))}
    adapter = LoraAdapter("pet_config", *check_rank_alpha(r, alpha, f"{where} pet_config"))
    for name in tensors:
        if name.endswith(MF_A):
            stem = name[: -len(MF_A)]
            if stem + MF_B not in tensors:
                raise WeightError(f"{where}: LoRA tensor {name} has no {stem + MF_B}")
            adapter.pairs[stem + ".weight"] = (tensors[name], tensors[stem + MF_B])
        elif name.endswith(MF_B) and name[: -len(MF_B)] + MF_A not in tensors:
            raise WeightError(f"{where}: LoRA tensor {name} has no {name[: -len(MF_B)] + MF_A}")
    adapter.sha256 = _digest(adapter.pairs)
    return base, adapter


def read_peft_adapter(folder: str) -> LoraAdapter:
    """A Hugging Face PEFT LoRA folder."""
    config_path = os.path.join(folder, "adapter_config.json")
    weights_path = os.path.join(folder, "adapter_model.safetensors")
    for path in (config_path, weights_path):
        if not os.path.isfile(path):
            raise ConfigError(f"adapter folder {folder} has no {os.path.basename(path)}")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    if config.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{config_path}: peft_type {config['peft_type']!r} is not supported; allowed: LORA")
    for key in ("use_rslora", "use_dora", "rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise ConfigError(f"{config_path}: {key} {config[key]!r} is not supported; allowed: false or empty")
    adapter = LoraAdapter(os.path.basename(os.path.normpath(folder)),
                          *check_rank_alpha(config.get("r"), config.get("lora_alpha"), config_path))
    tensors = read_safetensors(weights_path)
    for name, value in tensors.items():
        if ".lora_A." not in name:
            if ".lora_B." not in name:
                raise WeightError(f"{weights_path}: tensor {name} is not a LoRA A or B matrix")
            continue
        stem = name.split(".lora_A.")[0]
        b_name = name.replace(".lora_A.", ".lora_B.")
        if b_name not in tensors:
            raise WeightError(f"{weights_path}: LoRA tensor {name} has no {b_name}")
        base = stem[len(PEFT_PREFIX):] if stem.startswith(PEFT_PREFIX) else stem
        adapter.pairs[base + ".weight"] = (value, tensors[b_name])
    for name in tensors:
        if ".lora_B." in name and name.replace(".lora_B.", ".lora_A.") not in tensors:
            raise WeightError(f"{weights_path}: LoRA tensor {name} has no {name.replace('.lora_B.', '.lora_A.')}")
    adapter.sha256 = _digest(adapter.pairs)
    return adapter


def merge_lora(tensors: Dict[str, np.ndarray], adapter: LoraAdapter, plan, where: str) -> Dict[str, np.ndarray]:
    """The base tensors with W += scale · B·A for each adapted layer (in the checkpoint's names and
    layout: a layer the plan stores (in, out) gets the transposed update)."""
    out = dict(tensors)
    for name, (a, b) in adapter.pairs.items():
        if name not in out:
            raise WeightError(f"{where}: adapter {adapter.name} targets {name}, which the base model does not have")
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise WeightError(f"{where}: adapter {adapter.name} tensors for {name} have shapes A {a.shape} and "
                              f"B {b.shape}; expected A (r, in) and B (out, r)")
        delta = adapter.scale * (b.astype(np.float64) @ a.astype(np.float64))
        if plan.stored_transposed(name):
            delta = delta.T
        if delta.shape != out[name].shape:
            raise WeightError(f"{where}: adapter {adapter.name} update for {name} has shape {delta.shape} but the "
                              f"base weight is {out[name].shape}")
        out[name] = (out[name].astype(np.float64) + delta).astype(np.float32)
    return out


def _digest(pairs: Dict[str, Tuple[np.ndarray, np.ndarray]]) -> str:
    h = hashlib.sha256()
    for name in sorted(pairs):
        for array in pairs[name]:
            h.update(name.encode())
            h.update(np.ascontiguousarray(array, np.float32).tobytes())
    return h.hexdigest()
