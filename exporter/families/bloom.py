"""Bloom: ALiBi instead of positions, LayerNorm after the word embedding, LayerNorm blocks with
biases everywhere, fused per-head-interleaved query_key_value, GELU (tanh), tied head."""
from __future__ import annotations

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.families import FAMILIES as RUNTIME_FAMILIES

from exporter.weights.layouts import mindformers_gpt_block
from exporter.weights.plan import WeightPlan, qkv_per_head, rule
from exporter.families.base import Family, refuse_true, register_family

_QKV = ("layers.{L}.attn.q.{wb}", "layers.{L}.attn.k.{wb}", "layers.{L}.attn.v.{wb}")


@register_family
class Bloom(Family):
    spec = RUNTIME_FAMILIES["bloom"]
    hf_model_types = ("bloom",)
    mindformers_types = ("BloomLMHeadModel", "BloomConfig", "BloomModel")
    features = dict(norm="layer", positions="none", alibi=True, mlp="gelu_tanh", qkv_bias=True, o_bias=True,
                    mlp_bias=True, embed_norm=True, tie_word_embeddings=True)
    hf_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "n_layer": "num_layers",
               "num_hidden_layers": "num_layers", "n_head": "n_heads", "num_attention_heads": "n_heads",
               "layer_norm_epsilon": "norm_eps"}
    mindformers_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers",
                        "num_heads": "n_heads", "layernorm_epsilon": "norm_eps"}
    mindformers_required = {"hidden_act": ("gelu",), "expand_ratio": (4,)}

    hf_weights = WeightPlan([
        rule("transformer.word_embeddings.weight", "embed.weight"),
        rule("transformer.word_embeddings_layernorm.{wb}", "embed_norm.{wb}"),
        rule("transformer.h.{L}.input_layernorm.{wb}", "layers.{L}.attn_norm.{wb}"),
        rule("transformer.h.{L}.self_attention.query_key_value.{wb}", *_QKV, split=qkv_per_head),
        rule("transformer.h.{L}.self_attention.dense.{wb}", "layers.{L}.attn.o.{wb}"),
        rule("transformer.h.{L}.post_attention_layernorm.{wb}", "layers.{L}.mlp_norm.{wb}"),
        rule("transformer.h.{L}.mlp.dense_h_to_4h.{wb}", "layers.{L}.mlp.up.{wb}"),
        rule("transformer.h.{L}.mlp.dense_4h_to_h.{wb}", "layers.{L}.mlp.down.{wb}"),
        rule("transformer.ln_f.{wb}", "final_norm.{wb}"),
        rule("lm_head.weight", "head.weight"),
    ], optional_prefix="transformer.")

    # MindFormers keeps q, k, v apart (dense1..3, stored (out, in)) and stores its projection and
    # mapping layers (in, out).
    mindformers_weights = WeightPlan([
        rule("transformer.embedding.word_embedding.embedding_table", "embed.weight"),
        rule("transformer.embedding.norm.gamma", "embed_norm.weight"),
        rule("transformer.embedding.norm.beta", "embed_norm.bias"),
        *mindformers_gpt_block("transformer.blocks.{L}"),
        rule("transformer.ln_f.gamma", "final_norm.weight"),
        rule("transformer.ln_f.beta", "final_norm.bias"),
        rule("head.weight", "head.weight"),
    ])

    @classmethod
    def check_hf(cls, hf, where):
        refuse_true(hf, ("apply_residual_connection_post_layernorm",), where, cls.name)
        if hf.get("tie_word_embeddings") is False:
            raise UnsupportedError(f"{where}: tie_word_embeddings false is not supported by the bloom family; "
                                   "allowed: true (the head is the word embedding)")
