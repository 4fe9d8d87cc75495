"""Qwen (v1: Qwen-7B/14B/72B) and Qwen1.5 / Qwen2 folders.

Qwen v1 (`model_type: qwen`, remote code): RMSNorm, full rotate-half rotary (`rotary_emb_base`),
fused `c_attn` (q|k|v rows) with bias, `c_proj` without, MLP `c_proj(w1(x) * silu(w2(x)))` whose
width is half of config.json's `intermediate_size`, untied head, no BOS; tokenizer `qwen.tiktoken`.
`use_dynamic_ntk` and `use_logn_attn` change nothing up to config.json's `seq_length` (the remote
code's NTK alpha is 1 and its log-n query scale applies only past it), so an export with either is
limited to that length; `use_cache_quantization` (int8 KV cache) is refused.
Qwen1.5 / Qwen2 (`model_type: qwen2`, transformers' Qwen2ForCausalLM): Llama's names with bias on
q, k, v only, GQA, `rope_theta`; sliding-window attention is refused. MindFormers research/qwen
(`QwenForCausalLM`, `QwenConfig`): `transformer.wte.embedding_weight`, `attention.wq/wk/wv` (+bias),
`wo`, `feed_forward.w1` (up) / `w3` (gate) / `w2` (down), `ln_f`; its `intermediate_size` is the
MLP width itself, and its rotary base is LlamaConfig's `theta` (the yaml's `rotary_emb_base` is a
copied Qwen item upstream's model does not read). MindFormers' research/qwen1_5 and qwen2 run Qwen1.5 / Qwen2
as `LlamaForCausalLM` with `qkv_has_bias: True`: such a run yaml comes here (llama.py), with Llama's
MindFormers names.
"""
from __future__ import annotations

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.families import FAMILIES as RUNTIME_FAMILIES

from exporter.weights.layouts import hf_llama_layout
from exporter.weights.plan import WeightPlan, qkv_sections, rule
from exporter.families.base import Family, refuse_true, register_family
from exporter.families.llama import MINDFORMERS_RULES as LLAMA_MINDFORMERS_RULES, check_head_dim, read_rope


@register_family
class Qwen(Family):
    spec = RUNTIME_FAMILIES["qwen"]
    hf_model_types = ("qwen", "qwen2")
    mindformers_types = ("QwenForCausalLM", "QwenConfig", "QwenModel")
    features = dict(norm="rms", positions="rotary", mlp="swiglu", qkv_bias=True)
    mindformers_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_layers",
                        "num_heads": "n_heads", "intermediate_size": "intermediate_size",
                        "rms_norm_eps": "norm_eps", "theta": "rope_theta"}
    mindformers_required = {"rotary_pct": (1.0, 1)}
    mindformers_also_read = ("kv_channels", "rotary_emb_base")

    hf_weights = WeightPlan([
        # Qwen v1
        rule("transformer.wte.weight", "embed.weight"),
        rule("transformer.h.{L}.ln_1.weight", "layers.{L}.attn_norm.weight"),
        rule("transformer.h.{L}.attn.c_attn.{wb}",
             "layers.{L}.attn.q.{wb}", "layers.{L}.attn.k.{wb}", "layers.{L}.attn.v.{wb}", split=qkv_sections),
        rule("transformer.h.{L}.attn.c_proj.weight", "layers.{L}.attn.o.weight"),
        rule("transformer.h.{L}.ln_2.weight", "layers.{L}.mlp_norm.weight"),
        rule("transformer.h.{L}.mlp.w2.weight", "layers.{L}.mlp.gate.weight"),
        rule("transformer.h.{L}.mlp.w1.weight", "layers.{L}.mlp.up.weight"),
        rule("transformer.h.{L}.mlp.c_proj.weight", "layers.{L}.mlp.down.weight"),
        rule("transformer.ln_f.weight", "final_norm.weight"),
        *hf_llama_layout(qkv="{wb}"),    # Qwen1.5 / Qwen2
    ], ignore=[r".*rotary_emb\.inv_freq"])

    # research/qwen/convert_weight.py: c_attn cut in three (wq, wk, wv), HF w2 -> w3, c_proj -> w2.
    mindformers_weights = WeightPlan([
        rule("transformer.wte.embedding_weight", "embed.weight"),
        rule("transformer.layers.{L}.attention_norm.weight", "layers.{L}.attn_norm.weight"),
        rule("transformer.layers.{L}.attention.wq.{wb}", "layers.{L}.attn.q.{wb}"),
        rule("transformer.layers.{L}.attention.wk.{wb}", "layers.{L}.attn.k.{wb}"),
        rule("transformer.layers.{L}.attention.wv.{wb}", "layers.{L}.attn.v.{wb}"),
        rule("transformer.layers.{L}.attention.wo.weight", "layers.{L}.attn.o.weight"),
        rule("transformer.layers.{L}.ffn_norm.weight", "layers.{L}.mlp_norm.weight"),
        rule("transformer.layers.{L}.feed_forward.w3.weight", "layers.{L}.mlp.gate.weight"),
        rule("transformer.layers.{L}.feed_forward.w1.weight", "layers.{L}.mlp.up.weight"),
        rule("transformer.layers.{L}.feed_forward.w2.weight", "layers.{L}.mlp.down.weight"),
        rule("transformer.ln_f.weight", "final_norm.weight"),
        *LLAMA_MINDFORMERS_RULES,   # Qwen1.5 / Qwen2: a LlamaForCausalLM run yaml with qkv_has_bias: True
    ])

    @classmethod
    def from_hf(cls, hf, where):
        if hf.get("model_type") == "qwen2":
            return cls._from_qwen2(hf, where)
        if hf.get("rotary_pct", 1.0) != 1.0:
            raise UnsupportedError(f"{where}: rotary_pct {hf['rotary_pct']!r} is not supported by the qwen family; "
                                   "allowed: 1.0")
        if hf.get("no_bias", True) is not True:
            raise UnsupportedError(f"{where}: no_bias false is not supported by the qwen family; allowed: true")
        refuse_true(hf, ("use_cache_quantization",), where, cls.name)
        if hf.get("rope_scaling"):
            raise UnsupportedError(f"{where}: rope scaling {hf['rope_scaling']!r} is not supported yet")
        check_qwen_head_dim(hf, where)
        keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
                "num_attention_heads": "n_heads", "layer_norm_epsilon": "norm_eps", "rotary_emb_base": "rope_theta",
                "tie_word_embeddings": "tie_word_embeddings"}
        sizes = {ours: hf[key] for key, ours in keys.items() if hf.get(key) is not None}
        if hf.get("intermediate_size") is not None:
            sizes["intermediate_size"] = hf["intermediate_size"] // 2     # w1 and w2 are each half of it
        switches = [key for key in ("use_dynamic_ntk", "use_logn_attn") if hf.get(key, True)]  # upstream: on
        if switches:
            if not hf.get("seq_length"):
                raise UnsupportedError(f"{where}: {' and '.join(switches)} need seq_length (the trained length "
                                       "past which they rescale the attention); add it to config.json")
            sizes["seq_length_limit"] = hf["seq_length"]
            sizes["seq_length_limit_by"] = (f"{' and '.join(switches)} (on in {where}) "
                                            f"{'change' if len(switches) > 1 else 'changes'} the attention, "
                                            "which is not built here")
        return sizes

    @classmethod
    def _from_qwen2(cls, hf, where):
        refuse_true(hf, ("use_sliding_window",), where, cls.name)
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported; allowed: silu")
        check_head_dim(hf, where)
        keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
                "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
                "intermediate_size": "intermediate_size", "rms_norm_eps": "norm_eps",
                "tie_word_embeddings": "tie_word_embeddings"}
        return dict({ours: hf[key] for key, ours in keys.items() if hf.get(key) is not None}, **read_rope(hf, where))

    @classmethod
    def from_mindformers(cls, model_config, where):
        check_qwen_head_dim({"kv_channels": model_config.get("kv_channels"), "hidden_size":
                             model_config.get("hidden_size"), "num_attention_heads": model_config.get("num_heads")},
                            where)
        return super().from_mindformers(model_config, where)


def check_qwen_head_dim(config: dict, where: str) -> None:
    kv, heads, hidden = config.get("kv_channels"), config.get("num_attention_heads"), config.get("hidden_size")
    if kv is not None and heads and hidden and kv * heads != hidden:
        raise UnsupportedError(f"{where}: kv_channels {kv} * attention heads != hidden_size {hidden} is not supported")
