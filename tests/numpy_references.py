"""Independent numpy references for model shapes transformers has no class for, written from the
published formulas (never from the project's model code), in float64.

Run as a script it does for a case what tests/hf_models.py does for a builder:
  python tests/numpy_references.py CASE OUT_DIR STEPS
writes OUT_DIR/hf/ (the family's own config.json, model.safetensors, tokenizer), reference.npz (logits
(P, STEPS+1, V), tokens (P, STEPS+1)), prompts.json and mindformers.npz (the upstream conversion).
A family with no Hugging Face layout (PanguAlpha) gets no hf/: mindformers.npz holds its weights
under MindFormers' names, and OUT_DIR/model.json (the export yaml's `model:` section: family, sizes,
tokenizer) and OUT_DIR/mindformers.json (a MindFormers run yaml's `model` and `processor` sections)
describe it; the tokenizer is OUT_DIR/vocab.model.

Cases (CASES: case -> family):
- baichuan2_13b: Baichuan2-13B's computation (modeling_baichuan.py of the 13B folders, and the
  Baichuan 2 report): RMSNorm blocks, q, k, v from W_pack, no positions but an ALiBi bias on the
  attention scores (Press et al., slopes as in Bloom's `build_alibi_tensor`), SwiGLU, NormHead
  (the head's rows divided by their L2 norm).
- pangualpha: PanGu-α (Zeng et al. 2021, "PanGu-α: Large-scale Autoregressive Pretrained Chinese
  Language Models ..."; MindFormers' PanguAlphaModel, the path without pipeline stages): word +
  learned position embedding, num_layers - 1 pre-LayerNorm blocks (eps 1e-5, biases everywhere,
  FastGeLU), the final LayerNorm, then the top query layer: a block whose attention query is the
  projection of a learned per-position vector (top_query_embedding) instead of the normed hidden
  state; logits are its output times the word embedding (no norm after it).
"""
import json
import math
import os
import sys

import numpy as np

from hf_models import CORPUS, PROMPTS, VOCAB, baichuan2_mindformers, save_tokenizer

CASES = {"baichuan2_13b": "baichuan2", "pangualpha": "pangualpha"}

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


# MindFormers' PanguAlphaConfig names. num_layers counts the top query layer (2 blocks + it); ffn not
# 4 x hidden, so that ffn_hidden_size is read; both position tables have seq_length rows, which is
# also the export's seq_length in tests/test_families.py (a MindFormers run yaml has one seq_length).
PANGUALPHA = dict(vocab_size=VOCAB, hidden_size=64, ffn_hidden_size=96, num_layers=3, num_heads=4, seq_length=48)
PANGU_SPECIALS = ["<eod>", "<eot>", "<pad>"]   # named pieces of PanguAlpha's vocab.model
COUPLETS = ["上联：欢天喜地度佳节 下联：笑逐颜开迎佳期 横批：幸福快乐",
            "上联：春风得意花千树 下联：秋月扬辉水一方 横批：春意盎然"]


def layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def fast_gelu(x):
    """MindSpore's FastGeLU, the form its documentation gives."""
    return x / (1.0 + np.exp(-1.702 * np.abs(x))) * np.exp(0.851 * (x - np.abs(x)))


def pangu_block(w, p, x, n_heads, query=None):
    """One pre-LN block of MindFormers' TransformerEncoderLayer / QueryLayer (p: its name prefix).
    dense1..3 (q, k, v) are stored (out, in); projection and mapping (in, out). `query`: the vectors
    the query projection reads (the top query layer), else the normed x."""
    t, hidden = x.shape
    hd = hidden // n_heads
    h = layer_norm(x, w[p + "layernorm1.gamma"], w[p + "layernorm1.beta"])
    src = h if query is None else query
    q = src @ w[p + "attention.dense1.weight"].T + w[p + "attention.dense1.bias"]
    k = h @ w[p + "attention.dense2.weight"].T + w[p + "attention.dense2.bias"]
    v = h @ w[p + "attention.dense3.weight"].T + w[p + "attention.dense3.bias"]
    q, k, v = (a.reshape(t, n_heads, hd).transpose(1, 0, 2) for a in (q, k, v))
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd) + np.where(j <= i, 0.0, -np.inf)
    attn = (softmax(scores) @ v).transpose(1, 0, 2).reshape(t, hidden)
    x = x + attn @ w[p + "attention.projection.weight"] + w[p + "attention.projection.bias"]
    h = layer_norm(x, w[p + "layernorm2.gamma"], w[p + "layernorm2.beta"])
    up = fast_gelu(h @ w[p + "output.mapping.weight"] + w[p + "output.mapping.bias"])
    return x + up @ w[p + "output.projection.weight"] + w[p + "output.projection.bias"]


def pangualpha_logits(w, cfg, ids):
    """Logits (V,) of the last position of `ids` (a full forward over all of them)."""
    pos = np.arange(len(ids))
    word = w["backbone.embedding.word_embedding.embedding_table"]
    x = word[ids] + w["backbone.embedding.position_embedding.embedding_table"][pos]
    for layer in range(cfg["num_layers"] - 1):
        x = pangu_block(w, f"backbone.blocks.{layer}.", x, cfg["num_heads"])
    x = layer_norm(x, w["backbone.layernorm.gamma"], w["backbone.layernorm.beta"])
    query = w["backbone.top_query_embedding.embedding_table"][pos]
    x = pangu_block(w, "backbone.top_query_layer.", x, cfg["num_heads"], query)
    return x[-1] @ word.T


def pangualpha_weights(cfg, rng):
    """Random weights under MindFormers' names."""
    hidden, ffn, vocab, seq = cfg["hidden_size"], cfg["ffn_hidden_size"], cfg["vocab_size"], cfg["seq_length"]

    def matrix(rows, cols, gain=1.5):
        return rng.standard_normal((rows, cols)) * gain / math.sqrt(cols)

    def vector(n, around=0.0, scale=0.1):
        return around + scale * rng.standard_normal(n)

    # tables of a trained model's scale (the word table is also the head: logits of a few units); q, k
    # gains that keep float32's error in the logits well inside the tests' 1e-4
    w = {"backbone.embedding.word_embedding.embedding_table": 0.12 * rng.standard_normal((vocab, hidden)),
         "backbone.embedding.position_embedding.embedding_table": 0.12 * rng.standard_normal((seq, hidden)),
         "backbone.top_query_embedding.embedding_table": rng.standard_normal((seq, hidden)),
         "backbone.layernorm.gamma": vector(hidden, 1.0), "backbone.layernorm.beta": vector(hidden)}
    prefixes = [f"backbone.blocks.{layer}." for layer in range(cfg["num_layers"] - 1)] + ["backbone.top_query_layer."]
    for p in prefixes:
        for norm in ("layernorm1", "layernorm2"):
            w.update({p + norm + ".gamma": vector(hidden, 1.0), p + norm + ".beta": vector(hidden)})
        for dense, gain in (("dense1", 2.0), ("dense2", 2.0), ("dense3", 3.0)):
            w.update({p + f"attention.{dense}.weight": matrix(hidden, hidden, gain),
                      p + f"attention.{dense}.bias": vector(hidden, scale=0.2)})
        w.update({p + "attention.projection.weight": matrix(hidden, hidden).T,      # stored (in, out)
                  p + "attention.projection.bias": vector(hidden, scale=0.2),
                  p + "output.mapping.weight": matrix(ffn, hidden, 2.0).T,
                  p + "output.mapping.bias": vector(ffn, scale=0.2),
                  p + "output.projection.weight": matrix(hidden, ffn).T,
                  p + "output.projection.bias": vector(hidden, scale=0.2)})
    return {k: np.ascontiguousarray(v, np.float32) for k, v in w.items()}


def pangu_vocab(folder):
    """vocab.model as PanguAlpha's: sentencepiece trained on jieba-segmented text (spaces and newlines
    inside words as U+2582 / U+2583, words joined by spaces), <eod> <eot> <pad> named pieces, exactly
    VOCAB pieces so every id the model emits decodes. Returns the <eot> and <pad> ids."""
    import logging
    import jieba
    import sentencepiece as spm
    jieba.setLogLevel(logging.WARNING)
    marks = str.maketrans(" \n", "\u2582\u2583")
    text = os.path.join(folder, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join([" ".join(word.translate(marks) for word in jieba.cut(line, cut_all=False))
                            for line in CORPUS + COUPLETS] * 20))
    padding = []
    while True:
        spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(folder, "vocab"), vocab_size=VOCAB,
                                       model_type="bpe", character_coverage=1.0, normalization_rule_name="identity",
                                       user_defined_symbols=PANGU_SPECIALS + padding, unk_id=0, bos_id=1, eos_id=2,
                                       pad_id=-1, hard_vocab_limit=False, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "vocab.model"))
        if sp.get_piece_size() >= VOCAB:
            break
        padding += [f"<p{i}>" for i in range(len(padding), len(padding) + VOCAB - sp.get_piece_size())]
    assert sp.get_piece_size() == VOCAB, sp.get_piece_size()
    os.remove(text)
    os.remove(os.path.join(folder, "vocab.vocab"))
    return sp.piece_to_id("<eot>"), sp.piece_to_id("<pad>")


def pangualpha_case(out_dir):
    """Weights (MindFormers' names), model.json, mindformers.json, vocab.model; the reference forward."""
    cfg = PANGUALPHA
    weights = pangualpha_weights(cfg, np.random.default_rng(0))
    eot, pad = pangu_vocab(out_dir)
    vocab = os.path.join(out_dir, "vocab.model")
    model = dict(family="pangualpha", vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                 num_layers=cfg["num_layers"], n_heads=cfg["num_heads"], intermediate_size=cfg["ffn_hidden_size"],
                 max_position_embeddings=cfg["seq_length"], tokenizer=vocab)
    # configs/pangualpha/run_pangualpha_2_6b.yaml's model section at the tiny sizes (eos: this vocab's <eot>)
    model_config = dict(cfg, type="PanguAlphaConfig", batch_size=1, pad_token_id=pad, eod_token_id=pad,
                        eos_token_id=eot, post_layernorm_residual=False, param_init_type="float32",
                        compute_dtype="float32", softmax_compute_type="float32", embedding_dropout_prob=0.1,
                        hidden_dropout_rate=0.1, attention_dropout_rate=0.1, hidden_act="fast_gelu", use_past=True,
                        use_moe=False, expert_num=1, per_token_num_experts_chosen=1,
                        checkpoint_name_or_path="pangualpha_2_6b", repetition_penalty=1, max_decode_length=1024,
                        top_k=5, top_p=1, do_sample=False)
    run = {"model": {"model_config": model_config, "arch": {"type": "PanguAlphaHeadModel"}},
           "processor": {"return_tensors": "ms", "tokenizer": {"type": "PanguAlphaTokenizer", "vocab_file": vocab},
                         "type": "PanguAlphaProcessor"}}
    for name, data in (("model.json", model), ("mindformers.json", run)):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
    wide = {k: v.astype(np.float64) for k, v in weights.items()}
    return weights, lambda ids: pangualpha_logits(wide, cfg, ids)


def baichuan2_13b_case(out_dir):
    """The HF folder (hf/), MindFormers' names of its weights; the reference forward."""
    from safetensors.numpy import save_file
    cfg = BAICHUAN2_13B
    weights = baichuan2_13b_weights(cfg, np.random.default_rng(0))
    hf_dir = os.path.join(out_dir, "hf")
    os.makedirs(hf_dir)
    save_file(weights, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(baichuan2_13b_config(cfg), f, indent=2)
    save_tokenizer(CASES["baichuan2_13b"], hf_dir)
    wide = {k: v.astype(np.float64) for k, v in weights.items()}
    return baichuan2_mindformers(weights, cfg["hidden_size"]), lambda ids: baichuan2_13b_logits(wide, cfg, ids)


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


WRITERS = {"baichuan2_13b": baichuan2_13b_case, "pangualpha": pangualpha_case}


def main(case, out_dir, steps):
    assert case in WRITERS, f"unknown case {case!r}; cases: {', '.join(CASES)}"
    mindformers, forward = WRITERS[case](out_dir)
    logits, tokens = greedy(forward, steps)
    np.savez(os.path.join(out_dir, "reference.npz"), logits=logits, tokens=tokens)
    np.savez(os.path.join(out_dir, "mindformers.npz"), **mindformers)
    with open(os.path.join(out_dir, "prompts.json"), "w") as f:
        json.dump(PROMPTS, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
