"""Independent numpy references for model shapes transformers has no class for, written from the
published formulas (never from the project's model code), in float64.

Run as a script it does for a case what tests/support/hf_models.py does for a builder:
  python tests/support/numpy_references.py CASE OUT_DIR STEPS [SCALE]
writes OUT_DIR/hf/ (the family's own config.json, model.safetensors, tokenizer), reference.npz (logits
(P, STEPS+1, V), tokens (P, STEPS+1)), prompts.json and mindformers.npz (the upstream conversion);
SCALE (glm only) multiplies the weight matrices.
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
- glm: GLM v1 in ChatGLM-6B's shape (Du et al. 2022, "GLM: General Language Model Pretraining with
  Autoregressive Blank Infilling"; MindFormers' GLMForPreTraining and THUDM's modeling_chatglm.py):
  LayerNorm blocks with DeepNorm residuals (normed input times alpha = sqrt(2·layers)), fused per-head
  qkv with biases, 2-D rotary (first half of each head by the position id, second half by the block
  position id, rotate-half, tables rounded to float16 as upstream makes them), attention scaled by
  1/(sqrt(hd)·(layer+1)) and back by (layer+1), bidirectional over the prompt before <sop>, a GELU
  MLP in the tanh form (upstream's P.GeLU: MindSpore's GeLU primitive computes the tanh form, whatever
  its docstring's formula says; THUDM's gelu_impl is the same), final LayerNorm, untied head. Its
  prompts end with [gMASK] <sop> (one has [MASK] inside instead); the special ids sit inside the tiny
  vocabulary and are in its config.json / run yaml.
  Written as hf/ (the Hugging Face ChatGLM-6B layout) and mindformers.npz / mindformers.json.
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the support package
from support.hf_models import CORPUS, PROMPTS, VOCAB, baichuan2_mindformers, save_tokenizer  # noqa: E402

CASES = {"baichuan2_13b": "baichuan2", "glm": "glm", "pangualpha": "pangualpha"}

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
    # configs/pangualpha/run_pangualpha_2_6b.yaml's model section at the tiny sizes (eos: this vocab's <eot>;
    # use_past False as in every upstream PanguAlpha run yaml)
    model_config = dict(cfg, type="PanguAlphaConfig", batch_size=1, pad_token_id=pad, eod_token_id=pad,
                        eos_token_id=eot, post_layernorm_residual=False, param_init_type="float32",
                        compute_dtype="float32", softmax_compute_type="float32", embedding_dropout_prob=0.1,
                        hidden_dropout_rate=0.1, attention_dropout_rate=0.1, hidden_act="fast_gelu", use_past=False,
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


# ChatGLM-6B's config.json at tiny sizes; the special ids (130000 [MASK], 130001 [gMASK], 130004 <sop>,
# 130005 <eop> upstream) put inside the tiny vocabulary. 4 heads of 16: each rotary half has 8 dims.
GLM = dict(vocab_size=VOCAB, hidden_size=64, inner_hidden_size=96, num_layers=2, num_attention_heads=4,
           layernorm_epsilon=1e-5, max_sequence_length=48, mask_token_id=300, gmask_token_id=301,
           bos_token_id=304, eos_token_id=305, pad_token_id=3)
# prompts ending with [gMASK] <sop> as ChatGLM-6B's tokenizer makes them; the last with [MASK] inside
GLM_PROMPTS = [PROMPTS[0] + [301, 304], PROMPTS[1] + [301, 304], PROMPTS[2][:3] + [300] + PROMPTS[2][3:] + [304]]


def glm_rotary_tables(dim, positions):
    """ChatGLM-6B's RotaryEmbedding tables over `dim` dims: inverse frequencies computed in float32 and
    rounded to float16, angles t·f in float16, cos/sin of them in float16 (as upstream's numpy does)."""
    inv_freq = (1.0 / (10000 ** (np.arange(0, dim, 2).astype(np.float32) / dim))).astype(np.float16)
    freqs = np.outer(np.arange(positions, dtype=np.float16), inv_freq)
    emb = np.concatenate((freqs, freqs), axis=-1)
    return np.cos(emb).astype(np.float64), np.sin(emb).astype(np.float64)


def gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in float64."""
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)))


def glm_positions(ids, prompt_len, cfg, block_shift=0):
    """(position ids, block position ids, context length) of a row whose prompt is ids[:prompt_len]:
    MindFormers' get_position_ids_np (context = index of <sop>; from it on the position is the index of
    [gMASK], else [MASK], and the block position counts 1, 2, ...)."""
    prompt = list(ids[:prompt_len])
    context = prompt.index(cfg["bos_token_id"])
    mask = cfg["gmask_token_id"] if cfg["gmask_token_id"] in prompt else cfg["mask_token_id"]
    mask_position = prompt.index(mask)
    t = np.arange(len(ids))
    position = np.where(t < context, t, mask_position)
    block = np.where(t < context, 0, t - context + 1 + block_shift)
    return position, block, context


def glm_logits(w, cfg, ids, prompt_len, causal=False, block_shift=0):
    """Logits (V,) of the last position of `ids` (prompt ids[:prompt_len], then generated tokens).
    `causal`, `block_shift`: the wrong variants the tests show to change the output."""
    t, hidden, n, layers = len(ids), cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_layers"]
    hd, eps = hidden // n, cfg["layernorm_epsilon"]
    alpha = math.sqrt(2 * layers)
    position, block, context = glm_positions(ids, prompt_len, cfg, block_shift)
    cos, sin = glm_rotary_tables(hd // 2, cfg["max_sequence_length"] + 2)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    visible = (j <= i) if causal else ((j <= i) | (j < context))

    def rotate(x, ids_):           # x (n, t, hd/2), rotate-half by the tables' rows ids_
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos[ids_] + rotated * sin[ids_]

    x = w["transformer.word_embeddings.weight"][ids]
    for layer in range(layers):
        p = f"transformer.layers.{layer}."
        h = layer_norm(x, w[p + "input_layernorm.weight"], w[p + "input_layernorm.bias"], eps)
        qkv = h @ w[p + "attention.query_key_value.weight"].T + w[p + "attention.query_key_value.bias"]
        qkv = qkv.reshape(t, n, 3 * hd).transpose(1, 0, 2)                    # per head [q; k; v]
        q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
        q = np.concatenate([rotate(q[..., :hd // 2], position), rotate(q[..., hd // 2:], block)], -1)
        k = np.concatenate([rotate(k[..., :hd // 2], position), rotate(k[..., hd // 2:], block)], -1)
        coeff = layer + 1                                                      # query_key_layer_scaling_coeff
        scores = (q / (math.sqrt(hd) * coeff)) @ k.transpose(0, 2, 1)
        scores = np.where(visible, scores, -10000.0) * coeff
        attn = (softmax(scores) @ v).transpose(1, 0, 2).reshape(t, hidden)
        attn = attn @ w[p + "attention.dense.weight"].T + w[p + "attention.dense.bias"]
        x = h * alpha + attn                                                   # DeepNorm
        m = layer_norm(x, w[p + "post_attention_layernorm.weight"], w[p + "post_attention_layernorm.bias"], eps)
        up = gelu_tanh(m @ w[p + "mlp.dense_h_to_4h.weight"].T + w[p + "mlp.dense_h_to_4h.bias"])
        x = m * alpha + up @ w[p + "mlp.dense_4h_to_h.weight"].T + w[p + "mlp.dense_4h_to_h.bias"]
    x = layer_norm(x, w["transformer.final_layernorm.weight"], w["transformer.final_layernorm.bias"], eps)
    return x[-1] @ w["lm_head.weight"].T


def glm_weights(cfg, rng, scale=1.0):
    """Random weights under the Hugging Face ChatGLM-6B names (Linear weights (out, in)); `scale`
    multiplies every matrix (larger activations: the GELU's inputs reach its curved range)."""
    hidden, inner, vocab = cfg["hidden_size"], cfg["inner_hidden_size"], cfg["vocab_size"]

    def matrix(rows, cols, gain=1.0):
        return rng.standard_normal((rows, cols)) * gain * scale / math.sqrt(cols)

    def vector(size, around=0.0, scale=0.1):
        return around + scale * rng.standard_normal(size)

    # gains that keep float32's error in the logits well inside the tests' 1e-4 (DeepNorm's alpha scales
    # every residual) while greedy tokens still change step to step
    w = {"transformer.word_embeddings.weight": 0.5 * rng.standard_normal((vocab, hidden)),
         "transformer.final_layernorm.weight": vector(hidden, 1.0), "transformer.final_layernorm.bias": vector(hidden),
         "lm_head.weight": matrix(vocab, hidden, 1.5)}
    for layer in range(cfg["num_layers"]):
        p = f"transformer.layers.{layer}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            w.update({p + norm + ".weight": vector(hidden, 1.0), p + norm + ".bias": vector(hidden)})
        w.update({p + "attention.query_key_value.weight": matrix(3 * hidden, hidden, 1.5),
                  p + "attention.query_key_value.bias": vector(3 * hidden, scale=0.2),
                  p + "attention.dense.weight": matrix(hidden, hidden, 1.0),
                  p + "attention.dense.bias": vector(hidden, scale=0.2),
                  p + "mlp.dense_h_to_4h.weight": matrix(inner, hidden, 1.0),
                  p + "mlp.dense_h_to_4h.bias": vector(inner, scale=0.2),
                  p + "mlp.dense_4h_to_h.weight": matrix(hidden, inner, 1.0),
                  p + "mlp.dense_4h_to_h.bias": vector(hidden, scale=0.2)})
    return {k: np.ascontiguousarray(v, np.float32) for k, v in w.items()}


def glm_mindformers_names(weights):
    """convert_weight.py's renaming: word_embeddings.weight -> embedding_table, layernorm weight/bias ->
    gamma/beta; everything else keeps the Hugging Face name."""
    out = {}
    for name, value in weights.items():
        if "word_embeddings.weight" in name:
            name = name.replace("weight", "embedding_table")
        if "layernorm" in name:
            name = name.replace("weight", "gamma").replace("bias", "beta")
        out[name] = value
    return out


def glm_case(out_dir, scale=1.0):
    """hf/ (config.json, model.safetensors), mindformers.json (run_glm_6b_infer.yaml's model section at
    the tiny sizes); MindFormers' names of the weights; the reference forward. `scale`: glm_weights'."""
    from safetensors.numpy import save_file
    cfg = GLM
    weights = glm_weights(cfg, np.random.default_rng(0), scale)
    hf_dir = os.path.join(out_dir, "hf")
    os.makedirs(hf_dir)
    save_file(weights, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    config = dict(cfg, architectures=["ChatGLMModel"], model_type="chatglm", position_encoding_2d=True,
                  auto_map={"AutoConfig": "configuration_chatglm.ChatGLMConfig",
                            "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration"},
                  torch_dtype="float32", use_cache=True)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    model_config = dict(type="GLMConfig", vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                        num_layers=cfg["num_layers"], num_heads=cfg["num_attention_heads"],
                        inner_hidden_size=cfg["inner_hidden_size"], seq_length=cfg["max_sequence_length"],
                        embedding_dropout_prob=0.0, attention_dropout_rate=0.0, hidden_dropout_rate=0.0,
                        hidden_size_per_attention_head=None, layernorm_order="post",
                        layernorm_epsilon=cfg["layernorm_epsilon"], use_final_layernorm=True, use_past=True,
                        activation_func="GELU", position_encoding_2d=True, param_init_type="float32",
                        layernorm_compute_type="float32", softmax_compute_type="float32", compute_dtype="float32",
                        bos_token_id=cfg["bos_token_id"], eos_token_id=cfg["eos_token_id"],
                        mask_token_id=cfg["mask_token_id"], gmask_token_id=cfg["gmask_token_id"],
                        pad_token_id=cfg["pad_token_id"], max_decode_length=2048, is_enhanced_encoder=True,
                        is_sample_acceleration=False, checkpoint_name_or_path="glm_6b_chat", top_k=1, top_p=1,
                        repetition_penalty=1, do_sample=False)
    run = {"model": {"model_config": model_config, "arch": {"type": "GLMChatModel"}}}
    with open(os.path.join(out_dir, "mindformers.json"), "w", encoding="utf-8") as f:
        json.dump(run, f, indent=2)
    wide = {k: v.astype(np.float64) for k, v in weights.items()}
    return glm_mindformers_names(weights), lambda ids, n: glm_logits(wide, cfg, ids, n)


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


def greedy(forward, steps, prompts=PROMPTS):
    """`forward(ids)`, or `forward(ids, prompt_len)` for a case with prompts of its own (GLM)."""
    logits_all, tokens_all = [], []
    for prompt in prompts:
        ids, step_logits = list(prompt), []
        for _ in range(steps + 1):
            step_logits.append(forward(ids) if prompts is PROMPTS else forward(ids, len(prompt)))
            ids.append(int(step_logits[-1].argmax()))
        logits_all.append(np.stack(step_logits))
        tokens_all.append(ids[len(prompt):])
    return np.stack(logits_all).astype(np.float32), np.array(tokens_all)


WRITERS = {"baichuan2_13b": baichuan2_13b_case, "glm": glm_case, "pangualpha": pangualpha_case}
CASE_PROMPTS = {"glm": GLM_PROMPTS}


def main(case, out_dir, steps, *options):
    """`options`: the case writer's own arguments (glm: the weight scale)."""
    assert case in WRITERS, f"unknown case {case!r}; cases: {', '.join(CASES)}"
    mindformers, forward = WRITERS[case](out_dir, *(float(o) for o in options))
    prompts = CASE_PROMPTS.get(case, PROMPTS)
    logits, tokens = greedy(forward, steps, prompts)
    np.savez(os.path.join(out_dir, "reference.npz"), logits=logits, tokens=tokens)
    np.savez(os.path.join(out_dir, "mindformers.npz"), **mindformers)
    with open(os.path.join(out_dir, "prompts.json"), "w") as f:
        json.dump(prompts, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:])
