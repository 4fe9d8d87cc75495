"""Checkpoint layouts several families share, as weight-plan rules: transformers' Llama layout (Llama,
Qwen2, InternLM, Baichuan2, GLM-4), MindFormers' Llama layout (Llama, Qwen1.5/2, InternLM, Baichuan2)
and MindFormers' GPT block (BLOOM, GPT-2, PanGu-α).

Where a family's linears carry biases the suffix is "{wb}" (weight and bias), else "weight": a bias
the family has no place for then stays unmatched and is reported by name.
"""
from __future__ import annotations

from typing import List, Optional

from exporter.weights.plan import Rule, Split, halves, qkv_sections, rule


def qkv_targets(suffix: str):
    return tuple(f"layers.{{L}}.attn.{p}.{suffix}" for p in "qkv")


def hf_llama_layout(qkv: str = "{wb}", o: str = "weight", mlp: str = "weight", fused_qkv: Optional[str] = None,
                    fused_gate_up: Optional[str] = None, head_split: Optional[Split] = None) -> List[Rule]:
    """`model.layers.{L}.self_attn.q_proj`, `mlp.gate_proj`, ...; `fused_qkv` / `fused_gate_up`: the name
    (under `model.layers.{L}.`) of a tensor holding q, k, v (sections) or gate and up (halves) instead."""
    layer = "model.layers.{L}."
    rules = [rule("model.embed_tokens.weight", "embed.weight"),
             rule(layer + "input_layernorm.weight", "layers.{L}.attn_norm.weight")]
    if fused_qkv:
        rules.append(rule(layer + fused_qkv + "." + qkv, *qkv_targets(qkv), split=qkv_sections))
    else:
        rules += [rule(f"{layer}self_attn.{p}_proj.{qkv}", f"layers.{{L}}.attn.{p}.{qkv}") for p in "qkv"]
    rules += [rule(f"{layer}self_attn.o_proj.{o}", f"layers.{{L}}.attn.o.{o}"),
              rule(layer + "post_attention_layernorm.weight", "layers.{L}.mlp_norm.weight")]
    if fused_gate_up:
        rules.append(rule(f"{layer}{fused_gate_up}.{mlp}", f"layers.{{L}}.mlp.gate.{mlp}", f"layers.{{L}}.mlp.up.{mlp}",
                          split=halves))
    else:
        rules += [rule(f"{layer}mlp.{p}_proj.{mlp}", f"layers.{{L}}.mlp.{p}.{mlp}") for p in ("gate", "up")]
    return rules + [rule(f"{layer}mlp.down_proj.{mlp}", f"layers.{{L}}.mlp.down.{mlp}"),
                    rule("model.norm.weight", "final_norm.weight"),
                    rule("lm_head.weight", "head.weight", split=head_split)]


def mindformers_llama_layout(qkv: str = "{wb}", o: str = "{wb}", mlp: str = "{wb}",
                             head_split: Optional[Split] = None) -> List[Rule]:
    """MindFormers' LlamaForCausalLM names (`model.layers.{L}.attention.wq`, `feed_forward.w1`, ...), with
    the fused `w_qkv` (qkv_concat: True) and `w_gate_hidden` forms."""
    layer = "model.layers.{L}."
    return [
        rule("model.tok_embeddings.embedding_weight", "embed.weight"),
        rule(layer + "attention_norm.weight", "layers.{L}.attn_norm.weight"),
        *(rule(f"{layer}attention.w{p}.{qkv}", f"layers.{{L}}.attn.{p}.{qkv}") for p in "qkv"),
        rule(f"{layer}attention.w_qkv.{qkv}", *qkv_targets(qkv), split=qkv_sections),
        rule(f"{layer}attention.wo.{o}", f"layers.{{L}}.attn.o.{o}"),
        rule(layer + "ffn_norm.weight", "layers.{L}.mlp_norm.weight"),
        rule(f"{layer}feed_forward.w1.{mlp}", f"layers.{{L}}.mlp.gate.{mlp}"),
        rule(f"{layer}feed_forward.w3.{mlp}", f"layers.{{L}}.mlp.up.{mlp}"),
        rule(f"{layer}feed_forward.w_gate_hidden.{mlp}", f"layers.{{L}}.mlp.gate.{mlp}", f"layers.{{L}}.mlp.up.{mlp}",
             split=halves),
        rule(f"{layer}feed_forward.w2.{mlp}", f"layers.{{L}}.mlp.down.{mlp}"),
        rule("model.norm_out.weight", "final_norm.weight"),
        rule("lm_head.weight", "head.weight", split=head_split),
    ]


# MindFormers' GPT block (layernorm1, attention.dense1..3, projection, layernorm2, output.mapping/projection);
# its Linear with transpose_b=False stores the projection and mapping weights (in, out).
_GPT_BLOCK = (("layernorm1.gamma", "attn_norm.weight"), ("layernorm1.beta", "attn_norm.bias"),
              ("attention.dense1.{wb}", "attn.q.{wb}"), ("attention.dense2.{wb}", "attn.k.{wb}"),
              ("attention.dense3.{wb}", "attn.v.{wb}"), ("attention.projection.bias", "attn.o.bias"),
              ("layernorm2.gamma", "mlp_norm.weight"), ("layernorm2.beta", "mlp_norm.bias"),
              ("output.mapping.bias", "mlp.up.bias"), ("output.projection.bias", "mlp.down.bias"))
_GPT_BLOCK_IN_OUT = (("attention.projection.weight", "attn.o.weight"), ("output.mapping.weight", "mlp.up.weight"),
                     ("output.projection.weight", "mlp.down.weight"))


def mindformers_gpt_block(source: str, target: str = "layers.{L}") -> List[Rule]:
    """The rules of one MindFormers GPT block named `source` (e.g. `backbone.blocks.{L}`)."""
    return [rule(f"{source}.{a}", f"{target}.{b}") for a, b in _GPT_BLOCK] + \
        [rule(f"{source}.{a}", f"{target}.{b}", transpose=True) for a, b in _GPT_BLOCK_IN_OUT]
