"""GPT-2: learned absolute positions, LayerNorm blocks with biases, Conv1D weights stored (in, out),
fused c_attn (q, k, v one after another), GELU (tanh), tied head."""
from __future__ import annotations

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.families import FAMILIES as RUNTIME_FAMILIES

from exporter.weights.layouts import mindformers_gpt_block
from exporter.weights.plan import WeightPlan, qkv_sections, rule
from exporter.families.base import Family, refuse_true, register_family

_QKV = ("layers.{L}.attn.q.%s", "layers.{L}.attn.k.%s", "layers.{L}.attn.v.%s")


@register_family
class GPT2(Family):
    spec = RUNTIME_FAMILIES["gpt2"]
    hf_model_types = ("gpt2",)
    mindformers_types = ("GPT2LMHeadModel", "GPT2Config", "GPT2Model")
    features = dict(norm="layer", positions="learned", mlp="gelu_tanh", qkv_bias=True, o_bias=True,
                    mlp_bias=True, tie_word_embeddings=True)
    hf_keys = {"vocab_size": "vocab_size", "n_embd": "hidden_size", "n_layer": "num_layers", "n_head": "n_heads",
               "n_inner": "intermediate_size", "layer_norm_epsilon": "norm_eps",
               "n_positions": "max_position_embeddings"}
    mindformers_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers",
                        "num_heads": "n_heads", "layernorm_epsilon": "norm_eps",
                        "max_position_embeddings": "max_position_embeddings"}
    mindformers_required = {"hidden_act": ("gelu",), "expand_ratio": (4,), "post_layernorm_residual": (False,)}

    hf_weights = WeightPlan([
        rule("transformer.wte.weight", "embed.weight"),
        rule("transformer.wpe.weight", "pos_embed.weight"),
        rule("transformer.h.{L}.ln_1.{wb}", "layers.{L}.attn_norm.{wb}"),
        rule("transformer.h.{L}.attn.c_attn.weight", *(t % "weight" for t in _QKV), split=qkv_sections, transpose=True),
        rule("transformer.h.{L}.attn.c_attn.bias", *(t % "bias" for t in _QKV), split=qkv_sections),
        rule("transformer.h.{L}.attn.c_proj.weight", "layers.{L}.attn.o.weight", transpose=True),
        rule("transformer.h.{L}.attn.c_proj.bias", "layers.{L}.attn.o.bias"),
        rule("transformer.h.{L}.ln_2.{wb}", "layers.{L}.mlp_norm.{wb}"),
        rule("transformer.h.{L}.mlp.c_fc.weight", "layers.{L}.mlp.up.weight", transpose=True),
        rule("transformer.h.{L}.mlp.c_fc.bias", "layers.{L}.mlp.up.bias"),
        rule("transformer.h.{L}.mlp.c_proj.weight", "layers.{L}.mlp.down.weight", transpose=True),
        rule("transformer.h.{L}.mlp.c_proj.bias", "layers.{L}.mlp.down.bias"),
        rule("transformer.ln_f.{wb}", "final_norm.{wb}"),
        rule("lm_head.weight", "head.weight"),
    ], ignore=[r".*\.attn\.(masked_)?bias"], optional_prefix="transformer.")

    # MindFormers: q, k, v apart (dense1..3, stored (out, in)); projection and mapping stored (in, out).
    mindformers_weights = WeightPlan([
        rule("backbone.embedding.word_embedding.embedding_table", "embed.weight"),
        rule("backbone.embedding.position_embedding.embedding_table", "pos_embed.weight"),
        *mindformers_gpt_block("backbone.blocks.{L}"),
        rule("backbone.layernorm.gamma", "final_norm.weight"),
        rule("backbone.layernorm.beta", "final_norm.bias"),
        rule("head.weight", "head.weight"),
    ])

    @classmethod
    def check_hf(cls, hf, where):
        act = hf.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise UnsupportedError(f"{where}: activation_function {act!r} is not supported by the gpt2 family; "
                                   "allowed: gelu_new, gelu_pytorch_tanh")
        refuse_true(hf, ("scale_attn_by_inverse_layer_idx", "add_cross_attention"),
                    where, cls.name)
        if hf.get("scale_attn_weights") is False:
            raise UnsupportedError(f"{where}: scale_attn_weights false is not supported by the gpt2 family; allowed: true")

    @classmethod
    def from_mindformers(cls, model_config, where):
        sizes = super().from_mindformers(model_config, where)
        if "max_position_embeddings" not in sizes and model_config.get("seq_length"):
            sizes["max_position_embeddings"] = model_config["seq_length"]   # MindFormers' default
        return sizes
