"""Baichuan2 (7B, 13B): Llama blocks (RMSNorm, SwiGLU, no biases, MHA) with q, k, v fused as `W_pack`
([q; k; v] rows) and NormHead: the output weight's rows are scaled to unit L2 norm before use, done
here once on the weights (a plan split on `lm_head.weight`). 7B rotates q/k (rotary, theta 10000);
13B has no positions and an ALiBi score bias instead.

Which shape, in this order:
- the export yaml's `model.positions: rotary | alibi`, when given;
- a MindFormers run yaml: its arch type (upstream's research/baichuan2 has one class per shape,
  `Baichuan7BV2ForCausalLM` rotary, `Baichuan13BV2ForCausalLM` ALiBi; both with `type: LlamaConfig`);
- a Hugging Face folder (`model_type: baichuan`, remote code): config.json has no key naming the
  position scheme (upstream tools guess from hidden_size). Each size ships its own
  configuration_baichuan.py: the 7B one defines `max_position_embeddings` (its rotary table), the
  13B one does not (it has `model_max_length` only, the ALiBi mask length). So: rotary when
  config.json has `max_position_embeddings`, ALiBi when it does not.

Baichuan (v1) folders share `model_type: baichuan`; this family computes Baichuan2 (NormHead) and
refuses Baichuan-7B v1 by its architecture name `BaiChuanForCausalLM`.
"""
from __future__ import annotations

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.families import FAMILIES as RUNTIME_FAMILIES

from exporter.weights.layouts import hf_llama_layout, mindformers_llama_layout
from exporter.weights.plan import WeightPlan, unit_rows
from exporter.families.base import register_family
from exporter.families.llama import Llama

POSITIONS = {"rotary": dict(positions="rotary", alibi=False), "alibi": dict(positions="none", alibi=True)}


@register_family
class Baichuan2(Llama):
    spec = RUNTIME_FAMILIES["baichuan2"]
    hf_model_types = ("baichuan",)
    mindformers_types = ("Baichuan7BV2ForCausalLM", "Baichuan13BV2ForCausalLM")
    mindformers_variants = {"Baichuan7BV2ForCausalLM": {"positions": "rotary"},
                            "Baichuan13BV2ForCausalLM": {"positions": "alibi"}}
    features = dict(norm="rms", positions="rotary", mlp="swiglu")
    variants = {"positions": POSITIONS}
    qkv_has_bias_family = None
    mindformers_required = {"qkv_has_bias": (False,)}
    hf_keys = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
               "num_attention_heads": "n_heads", "intermediate_size": "intermediate_size",
               "rms_norm_eps": "norm_eps"}

    hf_weights = WeightPlan(hf_llama_layout(qkv="weight", fused_qkv="self_attn.W_pack", head_split=unit_rows),
                            ignore=[r".*rotary_emb\.inv_freq"])

    # research/baichuan2/convert_weight.py: W_pack cut into wq, wk, wv, then Llama's MindFormers names;
    # NormHead's weight is `lm_head.weight`, stored as trained (normalised by the network on use).
    mindformers_weights = WeightPlan(mindformers_llama_layout(qkv="weight", o="weight", mlp="weight",
                                                              head_split=unit_rows))

    @classmethod
    def from_hf(cls, hf, where):
        cls.check_hf(hf, where)
        sizes = {ours: hf[key] for key, ours in cls.hf_keys.items() if hf.get(key) is not None}
        sizes["positions"] = "rotary" if "max_position_embeddings" in hf else "alibi"
        return sizes

    @classmethod
    def check_hf(cls, hf, where):
        if "BaiChuanForCausalLM" in (hf.get("architectures") or []):
            raise UnsupportedError(f"{where}: architecture 'BaiChuanForCausalLM' (Baichuan-7B, v1) is not "
                                   "supported by the baichuan2 family; allowed: BaichuanForCausalLM (Baichuan2)")
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported by the baichuan2 "
                                   "family; allowed: silu")
        if hf.get("tie_word_embeddings"):
            raise UnsupportedError(f"{where}: tie_word_embeddings true is not supported by the baichuan2 family; "
                                   "allowed: false (NormHead is a weight of its own)")
