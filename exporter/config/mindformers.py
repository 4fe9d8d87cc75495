"""MindFormers run yamls (`model.model_config` / `model.arch`, `parallel_config`, `processor`)
translated into this exporter's schema, so users can export with the yaml they trained with.

Training-only sections are skipped (and listed in the log); model_config keys that would change
the network in ways this exporter does not build are refused by name.
"""
from __future__ import annotations

import logging
from typing import Dict

from lite_runtime.contract.errors import ConfigError, UnsupportedError

log = logging.getLogger("exporter")

MF_EXPORT_KEYS = ("seq_length", "batch_size", "use_past", "compute_dtype")
MF_SPECIAL_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
MF_PET_KEY = "pet_config"
# Keys of training, of other executors, or of upstream's own kernels: no effect on the exported math.
MF_IGNORED_MODEL_KEYS = {
    "type", "ignore_token_id", "layernorm_compute_type", "softmax_compute_type", "rotary_dtype", "param_init_type",
    "embedding_init_type", "parallel_config", "moe_config", "is_dynamic", "use_rope_slice", "use_flash_attention",
    "use_ring_attention", "use_attn_mask_compression", "parallel_optimizer", "fine_grain_interleave",
    "pp_interleave_num", "offset", "checkpoint_name_or_path", "repetition_penalty", "max_decode_length",
    "block_size", "num_blocks", "top_k", "top_p", "do_sample", "llm_backend", "fused_rms_norm",
    "max_position_embedding", "use_kvcache_op", "is_flexible_shape", "use_paged_attention", "multiple_of",
    "ffn_dim_multiplier", "scaling_factor", "batch_valid_length", "dropout_prob", "qkv_concat",
    "embedding_dropout_prob", "hidden_dropout_rate", "attention_dropout_rate", "expand_ratio", "hidden_act",
    "use_seq_parallel", "use_select_recompute", "unk_token_id", "is_sample_acceleration", "num_labels",
    "post_layernorm_residual", "qkv_has_bias", "pretrain_seqlen", "compute_in_2d", "use_past_shard", "temperature",
    "hidden_dropout", "attention_dropout", "bias_dropout_fusion", "apply_query_key_layer_scaling",
    "attention_softmax_in_fp32", "fp32_residual_connection", "prefix_projection", "residual_dtype",
    "enable_high_performance", "mlp_concat", "gmask_token_id", "mask_generate", "emb_dropout_prob"}
# Keys that are fine at these values only (any family); each family adds its own.
MF_REQUIRED_VALUES = {"quant_config": (None,), "extend_method": ("None", None)}
MF_DEFAULT_OUTPUT_DIR = "./output"   # upstream's default, taken from the working directory
# This exporter's own top-level keys a run yaml may carry too (upstream has no such choices).
MF_OWN_TOP_KEYS = ("target", "kv_cache", "lite_ms")
MF_TOP_USED = {"model", "processor", "parallel_config", "load_checkpoint", "output_dir", "infer",
               "src_strategy_path_or_dir", "auto_trans_ckpt", *MF_OWN_TOP_KEYS}


def is_mindformers_yaml(data: dict) -> bool:
    model = data.get("model")
    return isinstance(model, dict) and ("model_config" in model or "arch" in model)


def from_mindformers(data: dict, source: str) -> Dict[str, object]:
    from exporter.families import family_by_mindformers_type
    model = data["model"]
    mc = model.get("model_config") or {}
    if not isinstance(mc, dict):
        raise ConfigError(f"{source}: model.model_config must be a mapping of keys")
    arch = (model.get("arch") or {}).get("type") or mc.get("type")
    family = family_by_mindformers_type(arch, source)
    for key, allowed in MF_REQUIRED_VALUES.items():
        if key in mc and mc[key] not in allowed:
            raise UnsupportedError(f"{source}: model.model_config.{key} {mc[key]!r} is not supported; allowed: "
                                   f"{', '.join(repr(a) for a in allowed)}")
    understood = (set(family.mindformers_keys) | set(family.mindformers_also_read) | set(MF_SPECIAL_KEYS)
                  | set(MF_EXPORT_KEYS) | {MF_PET_KEY})
    unknown = sorted(set(mc) - understood - MF_IGNORED_MODEL_KEYS - set(MF_REQUIRED_VALUES)
                     - set(family.mindformers_required))
    if unknown:
        raise ConfigError(f"{source}: unknown key model.model_config.{unknown[0]} for a MindFormers {family.name} "
                          f"config; understood: {', '.join(sorted(understood))}")
    ours = dict({"family": family.name}, **family.from_mindformers(mc, source))   # it may name another
    ours.update(family.mindformers_variants.get(arch, {}))     # e.g. Baichuan2's 7B / 13B classes
    pet = mc.get("pet_config")
    if pet:
        if not isinstance(pet, dict) or pet.get("pet_type") not in ("lora", "slora"):
            kind = pet.get("pet_type") if isinstance(pet, dict) else pet
            raise UnsupportedError(f"{source}: model.model_config.pet_config pet_type {kind!r} is not supported; "
                                   "allowed: lora (merged into the weights at export), slora (adapters chosen per "
                                   "request)")
        ours["pet_config"] = pet
    ours.update({k: mc[k] for k in MF_SPECIAL_KEYS if mc.get(k) is not None})
    tokenizer = ((data.get("processor") or {}).get("tokenizer") or {}).get("vocab_file")
    if tokenizer:
        ours["tokenizer"] = tokenizer
    config = {"model": ours, "output_dir": data.get("output_dir") or MF_DEFAULT_OUTPUT_DIR}
    config.update({k: mc[k] for k in MF_EXPORT_KEYS if mc.get(k) is not None})
    if mc.get("use_past") is False:     # upstream's switch for its own predict network (PanguAlpha's yamls)
        log.info("%s: model.model_config.use_past False: the export writes the incremental (KV cache) graphs "
                 "anyway, because the runtime needs them", source)
        del config["use_past"]
    for key in ("load_checkpoint", "infer", "src_strategy_path_or_dir", "auto_trans_ckpt"):
        if data.get(key):
            config[key] = data[key]
    config.update({k: data[k] for k in MF_OWN_TOP_KEYS if k in data})
    parallel = data.get("parallel_config") or {}
    if parallel.get("model_parallel"):
        config["parallel"] = {"model_parallel": parallel["model_parallel"]}
    data_parallel = parallel.get("data_parallel")
    if isinstance(data_parallel, int) and not isinstance(data_parallel, bool) and data_parallel > 1:
        log.warning("%s: parallel_config.data_parallel %d: data parallel is a runtime concern (start that many "
                    "copies of the export); the export holds the model_parallel rank(s) only (%s)", source,
                    data_parallel, parallel.get("model_parallel") or 1)
    skipped = sorted(set(data) - MF_TOP_USED)
    if skipped:
        log.info("%s: MindFormers sections not used by export: %s", source, ", ".join(skipped))
    return config
