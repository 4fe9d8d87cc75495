"""Resolve the `model:` section (and an optional Hugging Face folder) into what the export needs."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List, Optional

from lite_runtime.errors import ConfigError, UnsupportedError
from lite_runtime.families import get_family
from .config import ExportConfig
from .models.llama import LlamaConfig

# Hugging Face `model_type` -> family name of the registry.
HF_MODEL_TYPES = {"llama": "llama"}

# Hugging Face config.json key -> LlamaConfig field.
HF_CONFIG_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
                  "num_hidden_layers": "num_layers", "num_attention_heads": "n_heads",
                  "num_key_value_heads": "n_kv_heads", "intermediate_size": "intermediate_size",
                  "rms_norm_eps": "rms_norm_eps", "rope_theta": "rope_theta",
                  "tie_word_embeddings": "tie_word_embeddings"}
_SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass
class ModelSource:
    family: str
    config: LlamaConfig
    bos_token_id: Optional[int]
    eos_token_id: List[int]
    pad_token_id: int
    tokenizer: Optional[str]
    checkpoint: str            # .ckpt file, folder of rank_{i}/ shards, or safetensors folder


def resolve_model(config: ExportConfig) -> ModelSource:
    section = config.model
    values = {}
    family = section.family
    if section.hf_dir:
        hf = _read_hf_config(section.hf_dir)
        model_type = hf.get("model_type")
        if family is None:
            if model_type not in HF_MODEL_TYPES:
                raise UnsupportedError(f"{section.hf_dir}/config.json: model_type {model_type!r} is not supported; "
                                       f"supported: {', '.join(HF_MODEL_TYPES)}")
            family = HF_MODEL_TYPES[model_type]
        values.update({field: hf[key] for key, field in HF_CONFIG_KEYS.items() if hf.get(key) is not None})
        values.update({k: hf[k] for k in _SPECIAL if hf.get(k) is not None})
    get_family(family, source=f"{config.source}: model.family")
    for name in list(HF_CONFIG_KEYS.values()) + list(_SPECIAL):
        if getattr(section, name) is not None:
            values[name] = getattr(section, name)
    special = {k: values.pop(k, None) for k in _SPECIAL}
    required = ("vocab_size", "hidden_size", "num_layers", "n_heads", "intermediate_size")
    missing = [k for k in required if k not in values]
    if missing:
        raise ConfigError(f"{config.source}: missing required key model.{missing[0]} "
                          "(give it in the model section or point model.hf_dir at a folder with config.json)")
    llama = LlamaConfig(**values)
    tokenizer = section.tokenizer or _existing(section.hf_dir, "tokenizer.model")
    if tokenizer is not None and not os.path.isfile(tokenizer):
        raise ConfigError(f"{config.source}: model.tokenizer {tokenizer} does not exist")
    checkpoint = config.load_checkpoint or section.hf_dir
    if checkpoint is None:
        raise ConfigError(f"{config.source}: missing required key load_checkpoint (a .ckpt file, a folder of "
                          "rank_{i}/*.ckpt shards, or a Hugging Face safetensors folder)")
    if not os.path.exists(checkpoint):
        raise ConfigError(f"{config.source}: load_checkpoint {checkpoint} does not exist")
    eos = special["eos_token_id"]
    eos_ids = [] if eos is None else ([int(e) for e in eos] if isinstance(eos, list) else [int(eos)])
    pad = special["pad_token_id"]
    return ModelSource(family, llama, special["bos_token_id"], eos_ids, 0 if pad is None else int(pad),
                       tokenizer, checkpoint)


def _read_hf_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"model.hf_dir {hf_dir} has no config.json")
    try:
        with open(path, encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    # transformers >= 5 writes rope settings as `rope_parameters`; older versions as rope_theta/rope_scaling.
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_theta") is not None:
        hf = dict(hf, rope_theta=rope["rope_theta"])
    scaling = hf.get("rope_scaling") or ({"rope_type": rope["rope_type"]} if rope.get("rope_type", "default") != "default" else None)
    if scaling:
        raise UnsupportedError(f"{path}: rope scaling {scaling!r} is not supported yet; "
                               "supported: plain rotary embeddings with rope_theta (rope_type default)")
    if hf.get("hidden_act", "silu") != "silu":
        raise UnsupportedError(f"{path}: hidden_act {hf['hidden_act']!r} is not supported by the llama family; allowed: silu")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise UnsupportedError(f"{path}: {key} true is not supported by the llama family; allowed: false")
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim * hf.get("num_attention_heads", 0) != hf.get("hidden_size"):
        raise UnsupportedError(f"{path}: head_dim {head_dim} * num_attention_heads != hidden_size is not supported")
    return hf


def _existing(folder: Optional[str], name: str) -> Optional[str]:
    if folder is None:
        return None
    path = os.path.join(folder, name)
    return path if os.path.isfile(path) else None
