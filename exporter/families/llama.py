"""Llama (Llama 2, CodeLlama, Llama 3 shapes): RMSNorm, rotate-half rotary, GQA, SwiGLU, no biases."""
from __future__ import annotations

from lite_runtime.contract.errors import UnsupportedError

from exporter.weights.plan import WeightPlan, halves, qkv_sections, rule
from exporter.families.base import Family, refuse_true, register_family


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


@register_family
class Llama(Family):
    name = "llama"
    aliases = ("llama2", "llama3", "codellama")
    hf_model_types = ("llama",)
    mindformers_types = ("LlamaForCausalLM", "LlamaConfig", "LlamaModel")
    features = dict(norm="rms", positions="rotary", mlp="swiglu")
    hf_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
               "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
               "intermediate_size": "intermediate_size", "rms_norm_eps": "norm_eps",
               "tie_word_embeddings": "tie_word_embeddings"}
    mindformers_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers",
                        "num_heads": "n_heads", "n_kv_heads": "n_kv_heads", "intermediate_size": "intermediate_size",
                        "rms_norm_eps": "norm_eps", "theta": "rope_theta", "tie_word_embeddings": "tie_word_embeddings"}
    mindformers_required = {"qkv_has_bias": (False,)}

    hf_weights = WeightPlan([
        rule("model.embed_tokens.weight", "embed.weight"),
        rule("model.layers.{L}.input_layernorm.weight", "layers.{L}.attn_norm.weight"),
        rule("model.layers.{L}.self_attn.q_proj.weight", "layers.{L}.attn.q.weight"),
        rule("model.layers.{L}.self_attn.k_proj.weight", "layers.{L}.attn.k.weight"),
        rule("model.layers.{L}.self_attn.v_proj.weight", "layers.{L}.attn.v.weight"),
        rule("model.layers.{L}.self_attn.o_proj.weight", "layers.{L}.attn.o.weight"),
        rule("model.layers.{L}.post_attention_layernorm.weight", "layers.{L}.mlp_norm.weight"),
        rule("model.layers.{L}.mlp.gate_proj.weight", "layers.{L}.mlp.gate.weight"),
        rule("model.layers.{L}.mlp.up_proj.weight", "layers.{L}.mlp.up.weight"),
        rule("model.layers.{L}.mlp.down_proj.weight", "layers.{L}.mlp.down.weight"),
        rule("model.norm.weight", "final_norm.weight"),
        rule("lm_head.weight", "head.weight"),
    ], ignore=[r".*rotary_emb\.inv_freq"])

    mindformers_weights = WeightPlan([
        rule("model.tok_embeddings.embedding_weight", "embed.weight"),
        rule("model.layers.{L}.attention_norm.weight", "layers.{L}.attn_norm.weight"),
        rule("model.layers.{L}.attention.wq.weight", "layers.{L}.attn.q.weight"),
        rule("model.layers.{L}.attention.wk.weight", "layers.{L}.attn.k.weight"),
        rule("model.layers.{L}.attention.wv.weight", "layers.{L}.attn.v.weight"),
        rule("model.layers.{L}.attention.w_qkv.weight",     # qkv_concat: True
             "layers.{L}.attn.q.weight", "layers.{L}.attn.k.weight", "layers.{L}.attn.v.weight", split=qkv_sections),
        rule("model.layers.{L}.attention.wo.weight", "layers.{L}.attn.o.weight"),
        rule("model.layers.{L}.ffn_norm.weight", "layers.{L}.mlp_norm.weight"),
        rule("model.layers.{L}.feed_forward.w1.weight", "layers.{L}.mlp.gate.weight"),
        rule("model.layers.{L}.feed_forward.w3.weight", "layers.{L}.mlp.up.weight"),
        rule("model.layers.{L}.feed_forward.w_gate_hidden.weight",
             "layers.{L}.mlp.gate.weight", "layers.{L}.mlp.up.weight", split=halves),
        rule("model.layers.{L}.feed_forward.w2.weight", "layers.{L}.mlp.down.weight"),
        rule("model.norm_out.weight", "final_norm.weight"),
        rule("lm_head.weight", "head.weight"),
    ])

    @classmethod
    def default_intermediate_size(cls, hidden: int) -> int:
        return llama_ffn_size(hidden)

    @classmethod
    def from_hf(cls, hf, where):
        return dict(super().from_hf(hf, where), **read_rope(hf, where))

    @classmethod
    def check_hf(cls, hf, where):
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported by the llama "
                                   "family; allowed: silu")
        refuse_true(hf, ("attention_bias", "mlp_bias"), where, cls.name)
        check_head_dim(hf, where)

    @classmethod
    def from_mindformers(cls, model_config, where):
        sizes = super().from_mindformers(model_config, where)
        if "intermediate_size" not in sizes and "hidden_size" in sizes:
            sizes["intermediate_size"] = llama_ffn_size(int(sizes["hidden_size"]),
                                                        int(model_config.get("multiple_of") or 256),
                                                        model_config.get("ffn_dim_multiplier"))
        return sizes
