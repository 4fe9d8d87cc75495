"""Tiny GGUF files written as llama.cpp's converter writes them, from a random transformers model:
python tests/support/gguf_models.py ARCH OUT_DIR [UNSUPPORTED_TYPE | linear=TYPE]

ARCH is llama or qwen2. Writes OUT_DIR/model.gguf: the hyper-parameters under llama.cpp's keys, a
byte-level BPE tokenizer trained here (tokens, types, merges, special ids, pre-tokenizer name), a
ChatML chat template, and the tensors under llama.cpp's names (Llama's q and k rows interleaved as
its converter does), each linear layer in another type: F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
(quantized by the gguf package) and Q4_K, Q6_K (blocks of random bits with small scales: the package
cannot quantize to them). With UNSUPPORTED_TYPE (e.g. IQ4_NL), one tensor is written in that type; with
linear=TYPE (e.g. linear=Q8_0) every linear layer is.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the support package
from support.hf_models import CORPUS  # noqa: E402

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 320
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Linear layers in turn; norms stay F32, the embedding Q8_0.
LINEAR_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K", "F16", "BF16", "Q8_0"]
LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def model(arch):
    import torch
    import transformers
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=arch == "llama")
    cls = transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen2ForCausalLM
    net = cls(getattr(transformers, "LlamaConfig" if arch == "llama" else "Qwen2Config")(**common)).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.08)
    return net


def _interleave(weight, heads):
    """llama.cpp's order of a head's rotary rows (pairs), from transformers' (halves)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def k_blocks(kind, shape, rng):
    """Random Q4_K / Q6_K blocks (bytes) for a float tensor of `shape`, with small scales."""
    import gguf
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    rows, cols = shape
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.0004).tobytes(), np.uint8)
    if kind == "Q4_K":          # d and dmin first
        data[..., 0:2] = scale
        data[..., 2:4] = scale
    else:                       # Q6_K: d last
        data[..., -2:] = scale
    return data.reshape(rows, -1)


def gguf_tensors(arch, net, unsupported=None, linear=None):
    """(llama.cpp name, array, type name) of every tensor."""
    import gguf
    rng = np.random.default_rng(0)
    out, turn = [], 0
    for name, tensor in net.state_dict().items():
        value = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            out.append(("token_embd.weight", value, "Q8_0"))
            continue
        if name == "model.norm.weight":
            out.append(("output_norm.weight", value, "F32"))
            continue
        if name == "lm_head.weight":
            if arch != "llama":
                out.append(("output.weight", value, "Q8_0"))
            continue
        parts = name.split(".")         # model.layers.N.<module>.<param>
        layer, module, param = parts[2], ".".join(parts[3:-1]), parts[-1]
        gname = f"blk.{layer}.{LAYER_NAMES[module]}.{param}"
        if arch == "llama" and module in ("self_attn.q_proj", "self_attn.k_proj"):
            value = _interleave(value, HEADS if "q_proj" in module else KV_HEADS)
        if value.ndim == 1:
            out.append((gname, value, "F32"))
            continue
        kind = linear or LINEAR_TYPES[turn % len(LINEAR_TYPES)]
        turn += 1
        out.append((gname, value, kind))
    if unsupported:         # the last matrix
        last = max(i for i, (_, value, _) in enumerate(out) if value.ndim == 2)
        out[last] = (out[last][0], out[last][1], unsupported)
    encoded = []
    for name, value, kind in out:
        qtype = gguf.GGMLQuantizationType[kind]
        if kind in ("Q4_K", "Q6_K") or kind == unsupported:
            data = k_blocks(kind, value.shape, rng) if kind != unsupported else _raw(kind, value.shape, rng)
        elif kind == "F32":
            data = value.astype(np.float32)
        elif kind == "F16":
            data = value.astype(np.float16)
        else:
            data = gguf.quants.quantize(value, qtype)
        encoded.append((name, data, qtype))
    return encoded


def _raw(kind, shape, rng):
    import gguf
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    return rng.integers(0, 256, size=(shape[0], shape[1] // block * size), dtype=np.uint8)


def write(arch, path, unsupported=None, linear=None):
    import gguf
    net, tok = model(arch), tokenizer()
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
    assert [i for _, i in vocab] == list(range(VOCAB))
    data = __import__("json").loads(tok.to_str())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([3 if t in SPECIALS else 1 for t, _ in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]])
    writer.add_bos_token_id(tok.token_to_id("<|im_start|>"))
    writer.add_eos_token_id(tok.token_to_id("<|im_end|>"))
    writer.add_pad_token_id(tok.token_to_id("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    for name, array, qtype in gguf_tensors(arch, net, unsupported, linear):
        writer.add_tensor(name, array, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":
    import os
    arch, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    option = sys.argv[3] if len(sys.argv) > 3 else ""
    write(arch, os.path.join(out, "model.gguf"), None if option.startswith("linear=") else option or None,
          option[len("linear="):] if option.startswith("linear=") else None)
