"""MindFormers run yamls (`model.model_config` / `model.arch`, `parallel_config`, `processor`)
translated into this exporter's schema, so users can export with the yaml they trained with.

Training-only sections are skipped (and listed in the log); model_config keys that would change
the network in ways this exporter does not build are refused by name.
"""
from __future__ import annotations

import logging
from typing import Dict

from lite_runtime.errors import ConfigError, UnsupportedError

log = logging.getLogger("exporter")

# MindFormers model/config class names -> family of the registry.
MF_TYPES = {"LlamaForCausalLM": "llama", "LlamaConfig": "llama", "LlamaModel": "llama"}

MF_MODEL_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers",
                 "num_heads": "n_heads", "n_kv_heads": "n_kv_heads", "intermediate_size": "intermediate_size",
                 "rms_norm_eps": "rms_norm_eps", "theta": "rope_theta", "tie_word_embeddings": "tie_word_embeddings",
                 "bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "pad_token_id"}
MF_EXPORT_KEYS = ("seq_length", "batch_size", "use_past", "compute_dtype")
# Keys of training, of other executors, or of upstream's own kernels: no effect on the exported math.
MF_IGNORED_MODEL_KEYS = {
    "type", "ignore_token_id", "layernorm_compute_type", "softmax_compute_type", "rotary_dtype", "param_init_type",
    "embedding_init_type", "parallel_config", "moe_config", "is_dynamic", "use_rope_slice", "use_flash_attention",
    "use_ring_attention", "use_attn_mask_compression", "parallel_optimizer", "fine_grain_interleave",
    "pp_interleave_num", "offset", "checkpoint_name_or_path", "repetition_penalty", "max_decode_length",
    "block_size", "num_blocks", "top_k", "top_p", "do_sample", "llm_backend", "fused_rms_norm",
    "max_position_embedding", "use_kvcache_op", "is_flexible_shape", "use_paged_attention", "multiple_of",
    "ffn_dim_multiplier", "scaling_factor", "batch_valid_length", "dropout_prob"}
# Keys that are fine at these values only.
MF_REQUIRED_VALUES = {"qkv_has_bias": (False,), "qkv_concat": (False,), "quant_config": (None,),
                      "extend_method": ("None", None)}
MF_TOP_USED = {"model", "processor", "parallel_config", "load_checkpoint", "output_dir", "infer"}


def is_mindformers_yaml(data: dict) -> bool:
    model = data.get("model")
    return isinstance(model, dict) and ("model_config" in model or "arch" in model)


def from_mindformers(data: dict, source: str) -> Dict[str, object]:
    model = data["model"]
    mc = model.get("model_config") or {}
    if not isinstance(mc, dict):
        raise ConfigError(f"{source}: model.model_config must be a mapping of keys")
    arch = (model.get("arch") or {}).get("type") or mc.get("type")
    if arch not in MF_TYPES:
        raise UnsupportedError(f"{source}: model type {arch!r} is not supported; supported: {', '.join(MF_TYPES)}")
    for key, allowed in MF_REQUIRED_VALUES.items():
        if key in mc and mc[key] not in allowed:
            raise UnsupportedError(f"{source}: model.model_config.{key} {mc[key]!r} is not supported; allowed: "
                                   f"{', '.join(repr(a) for a in allowed)}")
    known = set(MF_MODEL_KEYS) | set(MF_EXPORT_KEYS) | MF_IGNORED_MODEL_KEYS | set(MF_REQUIRED_VALUES)
    unknown = sorted(set(mc) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown key model.model_config.{unknown[0]} for a MindFormers Llama config; "
                          f"understood: {', '.join(sorted(set(MF_MODEL_KEYS) | set(MF_EXPORT_KEYS)))}")
    ours = {"family": MF_TYPES[arch]}
    ours.update({target: mc[key] for key, target in MF_MODEL_KEYS.items() if mc.get(key) is not None})
    if "intermediate_size" not in ours and "hidden_size" in ours:
        ours["intermediate_size"] = llama_ffn_size(int(ours["hidden_size"]), int(mc.get("multiple_of") or 256),
                                                   mc.get("ffn_dim_multiplier"))
    tokenizer = ((data.get("processor") or {}).get("tokenizer") or {}).get("vocab_file")
    if tokenizer:
        ours["tokenizer"] = tokenizer
    config = {"model": ours, "output_dir": data.get("output_dir") or "./output"}
    config.update({k: mc[k] for k in MF_EXPORT_KEYS if mc.get(k) is not None})
    for key in ("load_checkpoint", "infer"):
        if data.get(key):
            config[key] = data[key]
    parallel = data.get("parallel_config") or {}
    if parallel.get("model_parallel"):
        config["parallel"] = {"model_parallel": parallel["model_parallel"]}
    skipped = sorted(set(data) - MF_TOP_USED)
    if skipped:
        log.info("%s: MindFormers sections not used by export: %s", source, ", ".join(skipped))
    return config


def llama_ffn_size(hidden: int, multiple_of: int, multiplier) -> int:
    """Llama's SwiGLU width: 2/3 of 4*hidden, scaled, rounded up to a multiple of `multiple_of`."""
    size = int(2 * (4 * hidden) / 3)
    if multiplier is not None:
        size = int(float(multiplier) * size)
    return multiple_of * ((size + multiple_of - 1) // multiple_of)
