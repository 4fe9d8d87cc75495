"""Independent numpy references for model shapes transformers has no class for, written from the
published formulas (never from the project's model code), in float64.

Run as a script it does for a case what tests/hf_models.py does for a builder:
  python tests/numpy_references.py CASE OUT_DIR STEPS
writes OUT_DIR/hf/ (the family's own config.json, model.safetensors, tokenizer), reference.npz (logits
(P, STEPS+1, V), tokens (P, STEPS+1)), prompts.json and mindformers.npz (the upstream conversion).

Cases (CASES: case -> family):
- baichuan2_13b: Baichuan2-13B's computation (modeling_baichuan.py of the 13B folders, and the
  Baichuan 2 report): RMSNorm blocks, q, k, v from W_pack, no positions but an ALiBi bias on the
  attention scores (Press et al., slopes as in Bloom's `build_alibi_tensor`), SwiGLU, NormHead
  (the head's rows divided by their L2 norm).
"""
import json
import math
import os
import sys

import numpy as np

from hf_models import PROMPTS, VOCAB, baichuan2_mindformers, save_tokenizer

CASES = {"baichuan2_13b": "baichuan2"}

# 6 heads: the ALiBi slopes of a head count that is not a power of two (Baichuan2-13B has 40).
BAICHUAN2_13B = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=6, rms_norm_eps=1e-6, model_max_length=64)


def rms_norm(x, weight, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def alibi_slopes(n_heads):
    """Bloom's slopes: a geometric series 2^(-8/n)^k for the largest power of two n <= n_heads, then
    the odd terms of the series for 2n for the heads left."""
    closest = 2 ** math.floor(math.log2(n_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** k for k in range(1, closest + 1)]
    if closest != n_heads:
        extra = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** k for k in range(1, 1 + 2 * min(closest, n_heads - closest), 2)]
    return np.array(slopes, np.float64)


def norm_head(weight):
    return weight / np.maximum(np.linalg.norm(weight, axis=-1, keepdims=True), 1e-12)


def baichuan2_13b_logits(w, cfg, ids):
    """Logits (V,) of the last position of `ids` (a full causal forward over all of them)."""
    t, hidden, n = len(ids), cfg["hidden_size"], cfg["num_attention_heads"]
    hd, eps = hidden // n, cfg["rms_norm_eps"]
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    # ALiBi: query i, key j <= i gets -m_h * (i - j) added to its score; later keys are masked.
    bias = np.where(j <= i, -alibi_slopes(n)[:, None, None] * (i - j), -np.inf)        # (n, t, t)
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = np.split(h @ w[p + "self_attn.W_pack.weight"].T, 3, axis=-1)
        q, k, v = (a.reshape(t, n, hd).transpose(1, 0, 2) for a in (q, k, v))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + bias
        attn = (softmax(scores) @ v).transpose(1, 0, 2).reshape(t, hidden)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x[-1] @ norm_head(w["lm_head.weight"]).T


def baichuan2_13b_weights(cfg, rng):
    """Random weights in Baichuan2's tensor names, large enough that tokens differ step to step;
    head rows of unequal norms so that NormHead matters."""
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]

    def matrix(rows, cols, gain=1.5):
        return rng.standard_normal((rows, cols)) * gain / math.sqrt(cols)

    w = {"model.embed_tokens.weight": rng.standard_normal((vocab, hidden)),
         "model.norm.weight": 1.0 + 0.1 * rng.standard_normal(hidden),
         "lm_head.weight": matrix(vocab, hidden) * rng.uniform(0.25, 2.75, (vocab, 1))}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        w.update({p + "input_layernorm.weight": 1.0 + 0.1 * rng.standard_normal(hidden),
                  p + "post_attention_layernorm.weight": 1.0 + 0.1 * rng.standard_normal(hidden),
                  p + "self_attn.W_pack.weight": matrix(3 * hidden, hidden, 3.0),
                  p + "self_attn.o_proj.weight": matrix(hidden, hidden),
                  p + "mlp.gate_proj.weight": matrix(inter, hidden),
                  p + "mlp.up_proj.weight": matrix(inter, hidden),
                  p + "mlp.down_proj.weight": matrix(hidden, inter)})
    return {k: v.astype(np.float32) for k, v in w.items()}


def baichuan2_13b_config(cfg):
    """config.json of a Baichuan2-13B folder (its configuration_baichuan.py: model_max_length, no
    max_position_embeddings)."""
    return dict(cfg, architectures=["BaichuanForCausalLM"], model_type="baichuan", hidden_act="silu",
                auto_map={"AutoConfig": "configuration_baichuan.BaichuanConfig",
                          "AutoModelForCausalLM": "modeling_baichuan.BaichuanForCausalLM"},
                initializer_range=0.02, tie_word_embeddings=False, use_cache=True, torch_dtype="float32",
                z_loss_weight=0, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def greedy(forward, steps):
    logits_all, tokens_all = [], []
    for prompt in PROMPTS:
        ids, step_logits = list(prompt), []
        for _ in range(steps + 1):
            step_logits.append(forward(ids))
            ids.append(int(step_logits[-1].argmax()))
        logits_all.append(np.stack(step_logits))
        tokens_all.append(ids[len(prompt):])
    return np.stack(logits_all).astype(np.float32), np.array(tokens_all)


def main(case, out_dir, steps):
    from safetensors.numpy import save_file
    assert case == "baichuan2_13b", f"unknown case {case!r}; cases: {', '.join(CASES)}"
    cfg = BAICHUAN2_13B
    weights = baichuan2_13b_weights(cfg, np.random.default_rng(0))
    hf_dir = os.path.join(out_dir, "hf")
    os.makedirs(hf_dir)
    save_file(weights, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(baichuan2_13b_config(cfg), f, indent=2)
    save_tokenizer(CASES[case], hf_dir)
    wide = {k: v.astype(np.float64) for k, v in weights.items()}
    logits, tokens = greedy(lambda ids: baichuan2_13b_logits(wide, cfg, ids), steps)
    np.savez(os.path.join(out_dir, "reference.npz"), logits=logits, tokens=tokens)
    np.savez(os.path.join(out_dir, "mindformers.npz"), **baichuan2_mindformers(weights, cfg["hidden_size"]))
    with open(os.path.join(out_dir, "prompts.json"), "w") as f:
        json.dump(PROMPTS, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
