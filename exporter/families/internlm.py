"""InternLM (v1: InternLM-7B, InternLM-20B): Llama with biases on the q, k, v and o projections.

Hugging Face folders (`model_type: internlm`, remote code) use Llama's tensor names; config.json
says `bias` (q, k, v and o together; default true, InternLM-20B has false) and
`rotary: {base, type}`. `type: dynamic` (dynamic NTK scaling) is plain rotary up to
`max_position_embeddings` and rescales every position past it, so such an export is limited to
seq_length <= max_position_embeddings. MindFormers (research/internlm: `InternLMForCausalLM`,
`InternLMConfig`) stores Llama's MindFormers names plus `.bias` on wq, wk, wv, wo, and says
`has_bias`. Either becomes the model section's `bias` (a yaml may also give `model.bias`).
"""
from __future__ import annotations

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.families import FAMILIES as RUNTIME_FAMILIES

from exporter.weights.layouts import hf_llama_layout, mindformers_llama_layout
from exporter.weights.plan import WeightPlan
from exporter.families.base import register_family
from exporter.families.llama import Llama, check_head_dim

ROTARY_TYPES = ("origin", "dynamic")


@register_family
class InternLM(Llama):
    spec = RUNTIME_FAMILIES["internlm"]
    hf_model_types = ("internlm",)
    mindformers_types = ("InternLMForCausalLM", "InternLMConfig", "InternLMModel")
    features = dict(norm="rms", positions="rotary", mlp="swiglu", qkv_bias=True, o_bias=True)
    variants = {"bias": {True: dict(qkv_bias=True, o_bias=True), False: dict(qkv_bias=False, o_bias=False)}}
    qkv_has_bias_family = None     # its biases: has_bias
    hf_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
               "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
               "intermediate_size": "intermediate_size", "rms_norm_eps": "norm_eps",
               "tie_word_embeddings": "tie_word_embeddings"}
    mindformers_required = {"has_bias": (True, False)}     # read by from_mindformers

    hf_weights = WeightPlan(hf_llama_layout(qkv="{wb}", o="{wb}"), ignore=[r".*rotary_emb\.inv_freq"])

    # research/internlm/convert_weight.py: Llama's renames, the biases keep their suffix.
    mindformers_weights = WeightPlan(mindformers_llama_layout(mlp="weight"))

    @classmethod
    def from_hf(cls, hf, where):
        cls.check_hf(hf, where)
        sizes = {ours: hf[key] for key, ours in cls.hf_keys.items() if hf.get(key) is not None}
        sizes["bias"] = bool(hf.get("bias", True))           # the remote code's default
        rotary = hf.get("rotary") or {}
        if rotary.get("base") is not None:
            sizes["rope_theta"] = rotary["base"]
        if rotary.get("type") == "dynamic" and hf.get("max_position_embeddings"):
            sizes["seq_length_limit"] = hf["max_position_embeddings"]
        return sizes

    @classmethod
    def check_hf(cls, hf, where):
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported by the internlm "
                                   "family; allowed: silu")
        rotary = hf.get("rotary") or {}
        if rotary.get("type", "origin") not in ROTARY_TYPES:
            raise UnsupportedError(f"{where}: rotary type {rotary['type']!r} is not supported by the internlm "
                                   f"family; allowed: {', '.join(ROTARY_TYPES)}")
        if hf.get("rope_scaling"):
            raise UnsupportedError(f"{where}: rope scaling {hf['rope_scaling']!r} is not supported yet; "
                                   "supported: rotary type origin or dynamic (within max_position_embeddings)")
        check_head_dim(hf, where)

    @classmethod
    def from_mindformers(cls, model_config, where):
        sizes = super().from_mindformers(model_config, where)
        sizes["bias"] = bool(model_config.get("has_bias", True))   # InternLMConfig's default
        return sizes
