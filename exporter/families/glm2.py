"""ChatGLM2 / ChatGLM3 (`glm2`, `glm3`; GLM-4-shaped `GlmForCausalLM` folders are the same computation).

RMSNorm, grouped/multi-query attention (`multi_query_group_num` key/value heads) with bias on the
fused q|k|v projection only, rotary on the first half of each head with interleaved pairs
(base 10000 x rope_ratio), SwiGLU over a fused [gate; up] projection, untied output layer.
Prompts start with `[gMASK]` `sop`; the tokenizer is sentencepiece plus ChatGLM's specials, which
take the ids after the model's own pieces in this order (ChatGLM3 adds the role tokens; a ChatGLM3
folder's generation_config.json makes `<|user|>` and `<|observation|>` stop generation).

Accepted: ChatGLM folders (`model_type: chatglm`, remote code: `transformer.encoder.layers.N...`),
transformers' `glm` folders (`GlmForCausalLM`, `partial_rotary_factor: 0.5`), and MindFormers
`ChatGLM2ForConditionalGeneration` checkpoints (the ChatGLM names, `embedding_weight`, q/k/v and
gate/up fused or not: `qkv_concat`, `mlp_concat`; `use_rearrange_rope` checkpoints are refused).
ChatGLM-6B v1 folders (also `model_type: chatglm`, with position_encoding_2d) are the glm family's.
"""
from __future__ import annotations

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.families import FAMILIES as RUNTIME_FAMILIES

from exporter.weights.layouts import hf_llama_layout
from exporter.weights.plan import WeightPlan, halves, qkv_sections, rule
from exporter.families.base import Family, refuse_true, register_family
from exporter.families.glm import Glm
from exporter.families.llama import check_head_dim, read_rope

SPECIAL_TOKENS = ("[MASK]", "[gMASK]", "[sMASK]", "sop", "eop",
                  "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
# config.json keys of a ChatGLM folder that must keep these values (anything else is another network).
CHATGLM_FIXED = {"rmsnorm": True, "apply_residual_connection_post_layernorm": False, "post_layer_norm": True,
                 "add_bias_linear": False, "add_qkv_bias": True, "original_rope": True, "quantization_bit": 0}


def _layers(prefix: str, names: dict) -> list:
    """The per-layer rules of the ChatGLM names under `prefix` (HF remote code and MindFormers alike)."""
    p = prefix + ".encoder.layers.{L}."
    return [
        rule(p + "input_layernorm.weight", "layers.{L}.attn_norm.weight"),
        rule(p + "self_attention.query_key_value.{wb}",
             "layers.{L}.attn.q.{wb}", "layers.{L}.attn.k.{wb}", "layers.{L}.attn.v.{wb}", split=qkv_sections),
        rule(p + "self_attention.dense.weight", "layers.{L}.attn.o.weight"),
        rule(p + "post_attention_layernorm.weight", "layers.{L}.mlp_norm.weight"),
        rule(p + "mlp.dense_h_to_4h.weight", "layers.{L}.mlp.gate.weight", "layers.{L}.mlp.up.weight", split=halves),
        rule(p + "mlp.dense_4h_to_h.weight", "layers.{L}.mlp.down.weight"),
        rule(prefix + ".encoder.final_layernorm.weight", "final_norm.weight"),
        rule(prefix + ".output_layer.weight", "head.weight"),
        rule(prefix + ".embedding." + names["embedding"], "embed.weight"),
    ]


@register_family
class Glm2(Family):
    spec = RUNTIME_FAMILIES["glm2"]
    hf_model_types = ("chatglm", "glm")
    mindformers_types = ("ChatGLM2ForConditionalGeneration", "ChatGLM2Config", "ChatGLM2Model")
    features = dict(norm="rms", positions="rotary", rotary_fraction=0.5, rotary_interleaved=True, mlp="swiglu",
                    qkv_bias=True)
    tokenizer_special_tokens = SPECIAL_TOKENS
    tokenizer_prefix = ("[gMASK]", "sop")
    mindformers_keys = {"padded_vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers",
                        "num_attention_heads": "n_heads", "ffn_hidden_size": "intermediate_size",
                        "layernorm_epsilon": "norm_eps"}
    mindformers_required = {"use_rearrange_rope": (False,), "rmsnorm": (True,), "add_bias_linear": (False,),
                            "add_qkv_bias": (True,), "post_layer_norm": (True,), "quantization_bit": (0,),
                            "apply_residual_connection_post_layernorm": (False,), "pre_seq_len": (None, "None"),
                            "post_self_attn_layernorm": (False,), "post_mlp_layernorm": (False,)}
    mindformers_also_read = ("kv_channels", "multi_query_attention", "multi_query_group_num", "rope_ratio")

    hf_weights = WeightPlan(_layers("transformer", {"embedding": "word_embeddings.weight"}) + [
        *hf_llama_layout(qkv="{wb}", fused_gate_up="mlp.gate_up_proj"),     # transformers' glm layout
    ], ignore=[r".*rotary_pos_emb\.inv_freq", r".*rotary_emb\.inv_freq"])

    # mindformers/models/glm2/convert_weight.py: the ChatGLM names, word_embeddings.weight -> embedding_weight;
    # qkv_concat False stores wq/wk/wv, mlp_concat False dense_left (gate) / dense_right (up).
    mindformers_weights = WeightPlan(_layers("transformer", {"embedding": "embedding_weight"}) + [
        rule("transformer.encoder.layers.{L}.self_attention.wq.{wb}", "layers.{L}.attn.q.{wb}"),
        rule("transformer.encoder.layers.{L}.self_attention.wk.{wb}", "layers.{L}.attn.k.{wb}"),
        rule("transformer.encoder.layers.{L}.self_attention.wv.{wb}", "layers.{L}.attn.v.{wb}"),
        rule("transformer.encoder.layers.{L}.mlp.dense_left.weight", "layers.{L}.mlp.gate.weight"),
        rule("transformer.encoder.layers.{L}.mlp.dense_right.weight", "layers.{L}.mlp.up.weight"),
    ])

    @classmethod
    def claims_hf(cls, hf):
        return not Glm.claims_hf(hf)      # ChatGLM-6B (v1) folders are the glm family's

    @classmethod
    def from_hf(cls, hf, where):
        if hf.get("model_type") == "glm":
            return cls._from_glm(hf, where)
        if "position_encoding_2d" in hf or "inner_hidden_size" in hf:
            raise UnsupportedError(f"{where}: this is a ChatGLM-6B (v1) folder (position_encoding_2d), read by the glm "
                                   "family; the glm2 family reads ChatGLM2/ChatGLM3 folders (multi_query_group_num, "
                                   "padded_vocab_size)")
        for key, value in CHATGLM_FIXED.items():
            if key in hf and hf[key] != value:
                raise UnsupportedError(f"{where}: {key} {hf[key]!r} is not supported by the glm2 family; allowed: "
                                       f"{str(value).lower() if isinstance(value, bool) else value}")
        if hf.get("pre_seq_len"):
            raise UnsupportedError(f"{where}: pre_seq_len {hf['pre_seq_len']!r} (P-tuning v2 prefixes) is not "
                                   "supported; export the model without its prefix encoder")
        sizes = {ours: hf[key] for key, ours in cls.mindformers_keys.items() if hf.get(key) is not None}
        return dict(sizes, **_kv_and_rope(hf, where, mqa_default=False))   # ChatGLMConfig's default

    @classmethod
    def _from_glm(cls, hf, where):
        if hf.get("partial_rotary_factor", 0.5) != 0.5:
            raise UnsupportedError(f"{where}: partial_rotary_factor {hf['partial_rotary_factor']!r} is not "
                                   "supported by the glm2 family; allowed: 0.5")
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported; allowed: silu")
        if not hf.get("attention_bias", True):
            raise UnsupportedError(f"{where}: attention_bias false is not supported by the glm2 family; allowed: true")
        refuse_true(hf, ("tie_word_embeddings",), where, cls.name)
        check_head_dim(hf, where)
        keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
                "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
                "intermediate_size": "intermediate_size", "rms_norm_eps": "norm_eps"}
        return dict({ours: hf[key] for key, ours in keys.items() if hf.get(key) is not None}, **read_rope(hf, where))

    @classmethod
    def from_mindformers(cls, model_config, where):
        return dict(super().from_mindformers(model_config, where),
                    **_kv_and_rope(model_config, where, mqa_default=True))   # ChatGLM2Config's default


def _kv_and_rope(config: dict, where: str, mqa_default: bool) -> dict:
    """Key/value heads and the rotary base of a ChatGLM config.json or MindFormers ChatGLM2Config."""
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    kv_channels = config.get("kv_channels")
    if kv_channels is not None and heads and hidden and kv_channels * heads != hidden:
        raise UnsupportedError(f"{where}: kv_channels {kv_channels} * num_attention_heads != hidden_size is not "
                               "supported")
    out = {"rope_theta": 10000.0 * float(config.get("rope_ratio") or 1)}
    if config.get("multi_query_attention", mqa_default):
        out["n_kv_heads"] = config.get("multi_query_group_num") or 2
    return out
