"""Run in its own process (torch and MindSpore are kept apart): make a tiny random Hugging Face model
of one family, save it as an HF folder with a locally trained tokenizer, record transformers' greedy
tokens and logits, and write the same weights under MindFormers' names (converted here, from the
upstream conversion rules, independently of the exporter's weight plans).

usage: python tests/support/hf_models.py FAMILY OUT_DIR STEPS   (FAMILY: a BUILDERS or SHAPES key)
Writes OUT_DIR/hf/ (config.json, model.safetensors, tokenizer files), OUT_DIR/reference.npz
(logits (P, STEPS+1, V), tokens (P, STEPS+1)), OUT_DIR/prompts.json, OUT_DIR/mindformers.npz.
"""
import json
import os
import sys

import numpy as np

PROMPTS = [[1, 15, 27, 3, 9, 44], [1, 8], [1, 60, 61, 5, 33, 70, 71, 12, 13]]
VOCAB = 320   # room for a byte-level BPE: 256 bytes + merges + specials
CORPUS = ["An increasing sequence: one, two, three, four, five, six, seven.",
          "中国的首都是哪个城市？北京是中国的首都。", "The quick brown fox jumps over the lazy dog 🦊."]


def _llama(transformers):
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0))


def _bloom(transformers):   # 6 heads: ALiBi slopes for a head count that is not a power of two
    return transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=48, n_layer=2, n_head=6, bos_token_id=1, eos_token_id=2, pad_token_id=0))


def _gpt2(transformers):
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2))


def _internlm(transformers):
    """InternLM v1: Llama with biases on q, k, v and o (attention_bias puts one on o_proj too), MHA."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=8, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=50000.0,
        attention_bias=True, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0))


def _baichuan2(transformers):
    """Baichuan2-7B's computation: Llama, MHA, rotary theta 10000; the folder fuses q, k, v as W_pack
    (baichuan2_folder) and the reference uses the head with unit rows (NormHead, baichuan2_reference)."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=8, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0))


def _glm2(transformers):
    """ChatGLM2/3's computation as transformers' Glm has it: rotary on half of each head with interleaved
    pairs, bias on q, k, v only, fused [gate; up]; 2 key/value groups. The vocabulary leaves room for
    ChatGLM's 9 special tokens after the tokenizer's pieces (glm2_folder rewrites it as a ChatGLM folder)."""
    return transformers.GlmForCausalLM(transformers.GlmConfig(
        vocab_size=VOCAB + 16, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5, attention_bias=True,
        max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0))


def _qwen(transformers):
    """Qwen v1's computation as transformers' Qwen2 has it (bias on q, k, v only, SwiGLU, rotate-half
    rotary), heads as many as KV heads; qwen_folder rewrites it as a Qwen v1 folder. The vocabulary
    leaves room for the tiktoken file's 208 special tokens after its ranks."""
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
        tie_word_embeddings=False, use_sliding_window=False, bos_token_id=1, eos_token_id=2, pad_token_id=0))


# Every registered family needs a builder here or a numpy reference (tests/test_registry.py checks it).
# torch and transformers are imported only when run as a script: test modules import this for BUILDERS.
BUILDERS = {"llama": _llama, "bloom": _bloom, "gpt2": _gpt2, "internlm": _internlm, "baichuan2": _baichuan2,
            "glm2": _glm2, "qwen": _qwen}


def _llama_bias(transformers):
    """Llama with transformers' attention_bias (q, k, v, o) and mlp_bias (gate, up, down), GQA."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0,
        attention_bias=True, mlp_bias=True, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0))


# Other shapes of a family, made on request by one test (not in every family's matrix).
SHAPES = {"llama_bias": _llama_bias}
SENTENCEPIECE = ("llama", "internlm", "baichuan2", "glm2")   # folders with a tokenizer.model (others: tokenizer.json)


# Default initialisation is tiny; widen it so logits differ meaningfully between tokens and steps:
# (scale of matrices, of the word embedding, of the noise added to vectors[, of the noise added to
# biases]) per family.
WIDEN = {"llama": (4.0, 4.0, 0.05), "bloom": (12.0, 4.0, 0.5), "gpt2": (4.0, 4.0, 0.05),
         "internlm": (4.0, 4.0, 0.05, 0.2), "baichuan2": (4.0, 4.0, 0.05), "glm2": (4.0, 4.0, 0.05, 0.2),
         "qwen": (4.0, 4.0, 0.05, 0.2), "llama_bias": (4.0, 4.0, 0.05, 0.2)}


def widen(model, family):
    import torch
    matrices, embedding, noise, *bias = WIDEN[family]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_((bias[0] if bias and name.endswith(".bias") else noise) * torch.randn_like(p))
            elif family == "baichuan2" and name == "lm_head.weight":
                # rows of unequal norms, so that NormHead matters
                p.mul_(matrices * (0.25 + 2.5 * torch.rand(p.shape[0], 1)))
            elif "wpe" in name:
                p.mul_(20.0)     # learned positions: make them matter
            else:
                p.mul_(embedding if "word_embeddings" in name else matrices)


def rewrite_config(hf_dir, drop=(), **values):
    """Turn the config.json transformers wrote into the family's own: keys dropped, keys set."""
    path = os.path.join(hf_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    for key in drop:
        config.pop(key, None)
    config.update(values)
    with open(path, "w") as f:
        json.dump(config, f, indent=2)
    return config


def internlm_folder(model, hf_dir):
    """An InternLM v1 (remote code) folder: Llama's tensor names; config.json with InternLM's keys."""
    rewrite_config(hf_dir, drop=LLAMA_ONLY_KEYS[1:], model_type="internlm", architectures=["InternLMForCausalLM"],
                   bias=True, rotary={"base": model.config.rope_parameters["rope_theta"], "type": "dynamic"})


def baichuan_layout(tensors):
    """Llama tensor names -> Baichuan2's (remote code): q, k, v rows stacked as self_attn.W_pack."""
    out = {}
    for name, value in tensors.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            p = name.split("q_proj.")[0]
            value = np.concatenate([tensors[p + "q_proj.weight"], tensors[p + "k_proj.weight"],
                                    tensors[p + "v_proj.weight"]])
            name = p + "W_pack.weight"
        out[name] = value
    return out


# config.json keys of transformers' Llama that Baichuan2's and InternLM's remote-code configs do not have
LLAMA_ONLY_KEYS = ("num_key_value_heads", "attention_bias", "mlp_bias", "rope_parameters", "rope_theta", "head_dim",
                   "pretraining_tp", "attention_dropout")
BAICHUAN_AUTO_MAP = {"AutoConfig": "configuration_baichuan.BaichuanConfig",
                     "AutoModelForCausalLM": "modeling_baichuan.BaichuanForCausalLM"}


def baichuan2_folder(model, hf_dir):
    """A Baichuan2-7B folder: W_pack, NormHead's weight as trained (rows not normalised), the 7B
    config.json (with max_position_embeddings, the rotary table size)."""
    from safetensors.numpy import load_file, save_file
    path = os.path.join(hf_dir, "model.safetensors")
    save_file(baichuan_layout(load_file(path)), path, metadata={"format": "pt"})
    rewrite_config(hf_dir, drop=LLAMA_ONLY_KEYS, model_type="baichuan", architectures=["BaichuanForCausalLM"],
                   auto_map=BAICHUAN_AUTO_MAP, model_max_length=model.config.max_position_embeddings, z_loss_weight=0)


def baichuan2_reference(model):
    """Baichuan2's NormHead in eval: the head's rows normalised (torch's normalize) once, then used."""
    import torch
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.nn.functional.normalize(model.lm_head.weight))


def chatglm_layout(tensors):
    """transformers' Glm names -> the ChatGLM2/3 remote code's: q, k, v (weights and biases) stacked as
    query_key_value, the rest renamed."""
    out = {}
    for name, value in tensors.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            p, kind = name.split("q_proj.")
            value = np.concatenate([tensors[p + "q_proj." + kind], tensors[p + "k_proj." + kind],
                                    tensors[p + "v_proj." + kind]])
            name = p + "query_key_value." + kind
        for a, b in CHATGLM_NAMES:
            name = name.replace(a, b)
        out[name] = value
    return out


CHATGLM_NAMES = (("model.embed_tokens.weight", "transformer.embedding.word_embeddings.weight"),
                 ("model.norm.weight", "transformer.encoder.final_layernorm.weight"),
                 ("lm_head.weight", "transformer.output_layer.weight"), ("model.layers.", "transformer.encoder.layers."),
                 ("self_attn.query_key_value", "self_attention.query_key_value"),
                 ("self_attn.o_proj", "self_attention.dense"), ("mlp.gate_up_proj", "mlp.dense_h_to_4h"),
                 ("mlp.down_proj", "mlp.dense_4h_to_h"))
CHATGLM_SPECIALS = 9   # [MASK] [gMASK] [sMASK] sop eop <|system|> <|user|> <|assistant|> <|observation|>


def glm2_folder(model, hf_dir):
    """A ChatGLM3 folder (model_type chatglm, remote-code names and config keys, generation_config.json
    stopping at eos, <|user|> and <|observation|>); the folder transformers saved is kept as hf_glm/."""
    import shutil
    from safetensors.numpy import load_file, save_file
    shutil.copytree(hf_dir, os.path.join(os.path.dirname(hf_dir), "hf_glm"))
    path = os.path.join(hf_dir, "model.safetensors")
    save_file(chatglm_layout(load_file(path)), path, metadata={"format": "pt"})
    c = model.config
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump({"model_type": "chatglm", "architectures": ["ChatGLMModel"], "padded_vocab_size": c.vocab_size,
                   "hidden_size": c.hidden_size, "num_layers": c.num_hidden_layers, "ffn_hidden_size": c.intermediate_size,
                   "num_attention_heads": c.num_attention_heads, "kv_channels": c.head_dim,
                   "multi_query_attention": True, "multi_query_group_num": c.num_key_value_heads,
                   "layernorm_epsilon": c.rms_norm_eps, "rmsnorm": True, "add_qkv_bias": True,
                   "add_bias_linear": False, "post_layer_norm": True, "original_rope": True, "rope_ratio": 1,
                   "apply_residual_connection_post_layernorm": False, "seq_length": c.max_position_embeddings,
                   "eos_token_id": 2, "pad_token_id": 0}, f, indent=2)
    with open(os.path.join(hf_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [2, VOCAB + 6, VOCAB + 8], "pad_token_id": 0}, f)


QWEN_NAMES = (("model.embed_tokens", "transformer.wte"), ("model.norm", "transformer.ln_f"),
              ("model.layers.", "transformer.h."), ("input_layernorm", "ln_1"), ("post_attention_layernorm", "ln_2"),
              ("self_attn.o_proj", "attn.c_proj"), ("mlp.gate_proj", "mlp.w2"), ("mlp.up_proj", "mlp.w1"),
              ("mlp.down_proj", "mlp.c_proj"))


def qwen_layout(tensors):
    """transformers' Qwen2 names -> Qwen v1's remote code: q, k, v (weights, biases) stacked as c_attn;
    MLP gate as w2, up as w1 (`c_proj(w1(x) * silu(w2(x)))`), down as c_proj."""
    out = {}
    for name, value in tensors.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            p, kind = name.split("q_proj.")
            value = np.concatenate([tensors[p + "q_proj." + kind], tensors[p + "k_proj." + kind],
                                    tensors[p + "v_proj." + kind]])
            name = p.replace("self_attn.", "attn.") + "c_attn." + kind
        for a, b in QWEN_NAMES:
            name = name.replace(a, b)
        out[name] = value
    return out


def qwen_folder(model, hf_dir):
    """A Qwen v1 folder (remote-code names and config.json, intermediate_size twice the MLP width, NTK
    and logn switches on) with a qwen.tiktoken; the folder transformers saved is kept as hf_qwen2/."""
    import shutil
    from safetensors.numpy import load_file, save_file
    shutil.copytree(hf_dir, os.path.join(os.path.dirname(hf_dir), "hf_qwen2"))
    path = os.path.join(hf_dir, "model.safetensors")
    save_file(qwen_layout(load_file(path)), path, metadata={"format": "pt"})
    c = model.config
    endoftext = 256 + len(QWEN_MERGES)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump({"model_type": "qwen", "architectures": ["QWenLMHeadModel"], "vocab_size": c.vocab_size,
                   "hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers,
                   "num_attention_heads": c.num_attention_heads, "kv_channels": c.hidden_size // c.num_attention_heads,
                   "intermediate_size": 2 * c.intermediate_size, "layer_norm_epsilon": c.rms_norm_eps,
                   "rotary_emb_base": 10000, "rotary_pct": 1.0, "seq_length": c.max_position_embeddings,
                   "max_position_embeddings": c.max_position_embeddings, "use_dynamic_ntk": True,
                   "use_logn_attn": True, "no_bias": True, "tie_word_embeddings": False}, f, indent=2)
    with open(os.path.join(hf_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": endoftext, "pad_token_id": endoftext}, f)


# A tiny qwen.tiktoken: every byte, then these tokens, each after its prefixes (so BPE can build it).
QWEN_MERGES = list(dict.fromkeys(w.encode()[:i] for w in (" one", " two", " three", "中国", "首都")
                                 for i in range(2, len(w.encode()) + 1)))


def save_tiktoken(folder):
    import base64
    ranks = [bytes([b]) for b in range(256)] + QWEN_MERGES
    with open(os.path.join(folder, "qwen.tiktoken"), "w") as f:
        f.writelines(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(ranks))


# Families whose folder is not the one transformers saved: family -> rewrite(model, hf_dir).
FOLDERS = {"internlm": internlm_folder, "baichuan2": baichuan2_folder, "glm2": glm2_folder, "qwen": qwen_folder}
# Families whose computation is transformers' model changed after saving: family -> change(model).
REFERENCES = {"baichuan2": baichuan2_reference}


def save_tokenizer(family, folder):
    if family == "qwen":
        save_tiktoken(folder)
        return
    if family in SENTENCEPIECE:
        import sentencepiece as spm
        text = os.path.join(folder, "corpus.txt")
        with open(text, "w", encoding="utf-8") as f:
            f.write("\n".join(CORPUS * 20))
        spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(folder, "tokenizer"), vocab_size=VOCAB,
                                       model_type="bpe", byte_fallback=True, character_coverage=0.98, unk_id=0,
                                       bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
        os.remove(text)
        os.remove(os.path.join(folder, "tokenizer.vocab"))
        return
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, f)


def greedy_continuation(model, ids, steps, stop=None):
    """transformers' greedy continuation of `ids` with its cache: (new tokens, the float32 logits of each step);
    it ends early at `stop`."""
    import torch
    new, logits, past, feed = [], [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(steps):
            out = model(feed, past_key_values=past, use_cache=True)
            past, step = out.past_key_values, out.logits[0, -1].float().numpy()
            logits.append(step)
            new.append(int(step.argmax()))
            if new[-1] == stop:
                break
            feed = torch.tensor([[new[-1]]])
    return new, np.stack(logits)


def write_model_folder(model, family, out_dir):
    """The model (its weights widened as the family's test needs) as a Hugging Face folder out_dir/hf with the
    family's side files and tokenizer; returns the folder."""
    widen(model, family)
    hf_dir = os.path.join(out_dir, "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    if family in FOLDERS:
        FOLDERS[family](model, hf_dir)
    save_tokenizer(family, hf_dir)
    return hf_dir


def greedy_reference(model, steps):
    import torch
    logits_all, tokens_all = [], []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        step_logits, tokens = [], []
        with torch.no_grad():
            for _ in range(steps + 1):
                last = model(ids).logits[0, -1].float().numpy()
                step_logits.append(last)
                tokens.append(int(last.argmax()))
                ids = torch.cat([ids, torch.tensor([[tokens[-1]]])], dim=1)
        logits_all.append(np.stack(step_logits))
        tokens_all.append(tokens)
    return np.stack(logits_all), np.array(tokens_all)


LLAMA_MF_NAMES = {"embed_tokens.weight": "tok_embeddings.embedding_weight",
                  "model.norm.weight": "model.norm_out.weight",
                  "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
                  "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
                  "mlp.gate_proj": "feed_forward.w1", "mlp.down_proj": "feed_forward.w2",
                  "mlp.up_proj": "feed_forward.w3", "input_layernorm": "attention_norm",
                  "post_attention_layernorm": "ffn_norm"}


def llama_mf_name(name):
    for a, b in LLAMA_MF_NAMES.items():
        name = name.replace(a, b)
    return name


def baichuan2_mindformers(tensors, hidden):
    """research/baichuan2/convert_weight.py on a Baichuan2 folder's tensors: W_pack split in three
    blocks of hidden_size rows (wq, wk, wv), Llama's renames, lm_head.weight kept as it is."""
    out = {}
    for k, v in tensors.items():
        if ".self_attn.W_pack." in k:
            for i, part in enumerate(("wq", "wk", "wv")):
                out[k.replace(".self_attn.W_pack.", f".attention.{part}.")] = v[i * hidden:(i + 1) * hidden]
            continue
        out[llama_mf_name(k)] = v
    return out


def mindformers_names(family, sd, cfg):
    """The state dict under MindFormers' parameter names, converted as its conversion scripts do."""
    t = {k: v.numpy() for k, v in sd.items()}
    out = {}
    if family in ("llama", "internlm", "llama_bias"):   # Llama's renames, biases kept (as research/internlm's)
        return {llama_mf_name(k): v for k, v in t.items()}
    if family == "baichuan2":
        return baichuan2_mindformers(baichuan_layout(t), cfg.hidden_size)
    if family == "qwen":   # research/qwen/convert_weight.py on the Qwen v1 names
        mf = (("transformer.h.", "transformer.layers."), (".wte.weight", ".wte.embedding_weight"),
              ("attn.c_proj.", "attention.wo."), ("ln_1.", "attention_norm."), ("ln_2.", "ffn_norm."),
              ("mlp.w1.", "feed_forward.w1."), ("mlp.w2.", "feed_forward.w3."), ("mlp.c_proj.", "feed_forward.w2."))
        for k, v in qwen_layout(t).items():
            for a, b in mf:
                k = k.replace(a, b)
            if "attn.c_attn." in k:
                for part, rows in zip(("wq", "wk", "wv"), np.split(v, 3)):
                    out[k.replace("attn.c_attn.", f"attention.{part}.")] = rows
            else:
                out[k] = v
        return out
    if family == "glm2":   # models/glm2/convert_weight.py with qkv_concat and mlp_concat false
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        for k, v in chatglm_layout(t).items():
            k = k.replace("word_embeddings.weight", "embedding_weight")
            if "query_key_value" in k:
                for part, rows in zip(("wq", "wk", "wv"), np.split(v, [q, q + kv])):
                    out[k.replace("query_key_value", part)] = rows
            elif "dense_h_to_4h" in k:
                out[k.replace("dense_h_to_4h", "dense_left")], out[k.replace("dense_h_to_4h", "dense_right")] = \
                    np.split(v, 2)
            else:
                out[k] = v
        return out
    if family == "bloom":
        n, hd = cfg.n_head, cfg.hidden_size // cfg.n_head
        for k, v in t.items():
            k = k.replace("transformer.", "")
            if k == "lm_head.weight":
                continue
            top = {"word_embeddings.weight": "embedding.word_embedding.embedding_table",
                   "word_embeddings_layernorm.weight": "embedding.norm.gamma",
                   "word_embeddings_layernorm.bias": "embedding.norm.beta",
                   "ln_f.weight": "ln_f.gamma", "ln_f.bias": "ln_f.beta"}
            if k in top:
                out["transformer." + top[k]] = v
                continue
            _, layer, rest = k.split(".", 2)
            p = f"transformer.blocks.{layer}."
            if rest.startswith("self_attention.query_key_value"):
                kind = rest.rsplit(".", 1)[1]
                split = v.reshape((n, 3, hd) + v.shape[1:])
                for i in range(3):
                    out[p + f"attention.dense{i + 1}.{kind}"] = split[:, i].reshape((n * hd,) + v.shape[1:])
                continue
            mapping = {"input_layernorm.weight": "layernorm1.gamma", "input_layernorm.bias": "layernorm1.beta",
                       "post_attention_layernorm.weight": "layernorm2.gamma",
                       "post_attention_layernorm.bias": "layernorm2.beta",
                       "self_attention.dense.weight": "attention.projection.weight",
                       "self_attention.dense.bias": "attention.projection.bias",
                       "mlp.dense_h_to_4h.weight": "output.mapping.weight", "mlp.dense_h_to_4h.bias": "output.mapping.bias",
                       "mlp.dense_4h_to_h.weight": "output.projection.weight",
                       "mlp.dense_4h_to_h.bias": "output.projection.bias"}
            name = mapping[rest]
            out[p + name] = v.T if name.endswith(("projection.weight", "mapping.weight")) else v
        return out
    # gpt2: q, k, v cut from c_attn (Conv1D, (in, 3H)) and stored (out, in); other Conv1D kept (in, out)
    for k, v in t.items():
        k = k.replace("transformer.", "")
        if k == "lm_head.weight" or k.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        top = {"wte.weight": "backbone.embedding.word_embedding.embedding_table",
               "wpe.weight": "backbone.embedding.position_embedding.embedding_table",
               "ln_f.weight": "backbone.layernorm.gamma", "ln_f.bias": "backbone.layernorm.beta"}
        if k in top:
            out[top[k]] = v
            continue
        _, layer, rest = k.split(".", 2)
        p = f"backbone.blocks.{layer}."
        if rest.startswith("attn.c_attn"):
            kind = rest.rsplit(".", 1)[1]
            for i, part in enumerate(np.split(v, 3, axis=-1)):
                out[p + f"attention.dense{i + 1}.{kind}"] = part.T if kind == "weight" else part
            continue
        mapping = {"ln_1.weight": "layernorm1.gamma", "ln_1.bias": "layernorm1.beta", "ln_2.weight": "layernorm2.gamma",
                   "ln_2.bias": "layernorm2.beta", "attn.c_proj.weight": "attention.projection.weight",
                   "attn.c_proj.bias": "attention.projection.bias", "mlp.c_fc.weight": "output.mapping.weight",
                   "mlp.c_fc.bias": "output.mapping.bias", "mlp.c_proj.weight": "output.projection.weight",
                   "mlp.c_proj.bias": "output.projection.bias"}
        out[p + mapping[rest]] = v
    return out


def main(family, out_dir, steps):
    import torch
    import transformers
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = dict(BUILDERS, **SHAPES)[family](transformers).eval()
    write_model_folder(model, family, out_dir)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if family in REFERENCES:
        REFERENCES[family](model)
    logits, tokens = greedy_reference(model, steps)
    np.savez(os.path.join(out_dir, "reference.npz"), logits=logits, tokens=tokens)
    np.savez(os.path.join(out_dir, "mindformers.npz"), **mindformers_names(family, saved, model.config))
    with open(os.path.join(out_dir, "prompts.json"), "w") as f:
        json.dump(PROMPTS, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
