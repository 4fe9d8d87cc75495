"""Llama (Llama 2, CodeLlama, Llama 3 shapes): RMSNorm, rotate-half rotary, GQA, SwiGLU, no biases, or
transformers' LlamaForCausalLM switches: `attention_bias` (q, k, v and o) and `mlp_bias` (gate, up, down),
the model section's `bias` and `mlp_bias`. MindFormers runs Qwen1.5 / Qwen2 as LlamaForCausalLM with
`qkv_has_bias: True` (q, k, v biases, o without, research/qwen1_5 and qwen2): such a run yaml is the qwen
family's, which reads Llama's MindFormers names too (`qkv_has_bias_family`)."""
from __future__ import annotations

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.families import FAMILIES as RUNTIME_FAMILIES

from exporter.weights.layouts import hf_llama_layout, mindformers_llama_layout
from exporter.weights.plan import WeightPlan
from exporter.families.base import Family, register_family


def llama_ffn_size(hidden: int, multiple_of: int = 256, multiplier=None) -> int:
    """Llama's SwiGLU width: 2/3 of 4*hidden, scaled, rounded up to a multiple of `multiple_of`."""
    size = int(2 * (4 * hidden) / 3)
    if multiplier is not None:
        size = int(float(multiplier) * size)
    return multiple_of * ((size + multiple_of - 1) // multiple_of)


def read_rope(hf: dict, where: str) -> dict:
    """rope_theta from config.json (transformers >= 5 nests it in `rope_parameters`); scaling refused."""
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or ({"rope_type": rope["rope_type"]}
                                         if rope.get("rope_type", "default") != "default" else None)
    if scaling:
        raise UnsupportedError(f"{where}: rope scaling {scaling!r} is not supported yet; "
                               "supported: plain rotary embeddings with rope_theta (rope_type default)")
    theta = rope.get("rope_theta", hf.get("rope_theta"))
    return {} if theta is None else {"rope_theta": theta}


def check_head_dim(hf: dict, where: str) -> None:
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim * hf.get("num_attention_heads", 0) != hf.get("hidden_size"):
        raise UnsupportedError(f"{where}: head_dim {head_dim} * num_attention_heads != hidden_size is not supported")


# MindFormers' Llama names (also Qwen1.5 / Qwen2 checkpoints, which MindFormers runs as LlamaForCausalLM).
MINDFORMERS_RULES = mindformers_llama_layout()


@register_family
class Llama(Family):
    spec = RUNTIME_FAMILIES["llama"]
    hf_model_types = ("llama",)
    mindformers_types = ("LlamaForCausalLM", "LlamaConfig", "LlamaModel")
    features = dict(norm="rms", positions="rotary", mlp="swiglu")
    variants = {"bias": {True: dict(qkv_bias=True, o_bias=True), False: dict(qkv_bias=False, o_bias=False)},
                "mlp_bias": {True: dict(mlp_bias=True), False: dict(mlp_bias=False)}}
    qkv_has_bias_family = "qwen"    # the family of a run yaml with qkv_has_bias: True
    hf_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
               "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
               "intermediate_size": "intermediate_size", "rms_norm_eps": "norm_eps",
               "tie_word_embeddings": "tie_word_embeddings"}
    mindformers_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers",
                        "num_heads": "n_heads", "n_kv_heads": "n_kv_heads", "intermediate_size": "intermediate_size",
                        "rms_norm_eps": "norm_eps", "theta": "rope_theta", "tie_word_embeddings": "tie_word_embeddings"}
    mindformers_also_read = ("qkv_has_bias",)

    hf_weights = WeightPlan(hf_llama_layout(qkv="{wb}", o="{wb}", mlp="{wb}"), ignore=[r".*rotary_emb\.inv_freq"])

    mindformers_weights = WeightPlan(MINDFORMERS_RULES)

    @classmethod
    def default_intermediate_size(cls, hidden: int) -> int:
        return llama_ffn_size(hidden)

    @classmethod
    def from_hf(cls, hf, where):
        switches = {ours: True for key, ours in (("attention_bias", "bias"), ("mlp_bias", "mlp_bias")) if hf.get(key)}
        return dict(super().from_hf(hf, where), **read_rope(hf, where), **switches)

    @classmethod
    def check_hf(cls, hf, where):
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported by the llama "
                                   "family; allowed: silu")
        check_head_dim(hf, where)

    @classmethod
    def from_mindformers(cls, model_config, where):
        sizes = super().from_mindformers(model_config, where)
        if "intermediate_size" not in sizes and "hidden_size" in sizes:
            sizes["intermediate_size"] = llama_ffn_size(int(sizes["hidden_size"]),
                                                        int(model_config.get("multiple_of") or 256),
                                                        model_config.get("ffn_dim_multiplier"))
        if model_config.get("qkv_has_bias") and cls.qkv_has_bias_family:
            sizes["family"] = cls.qkv_has_bias_family
        return sizes
