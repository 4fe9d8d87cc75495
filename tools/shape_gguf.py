"""A GGUF of random weights in a published model's shape, for measuring cost (speed, memory) where no weights
of that size can be fetched: `python tools/shape_gguf.py --shape qwen2-0.5b --out build/models/X.F16.gguf`.

The tokenizer is a real one's (SmolLM2's, from the GGUF `make setup` fetches), its vocabulary padded with
control tokens to the shape's, so that prompts cut from text tokenize as they do for that model, and both
sides (ours, llama.cpp) read one file. Weights are float16 (norms float32), drawn from N(0, 0.02): the answers
mean nothing, but a step costs what the real model's does, and our greedy tokens must still equal llama.cpp's.
"""
from __future__ import annotations

import os
import sys

import click
import numpy as np

# Published configurations (the model's config.json): only what sets a step's cost.
SHAPES = {
    "qwen2-0.5b": dict(arch="qwen2", hidden=896, ffn=4864, layers=24, heads=14, kv_heads=2, vocab=151936,
                       context=32768, rope_base=1e6, eps=1e-6, qkv_bias=True),
    "qwen2-1.5b": dict(arch="qwen2", hidden=1536, ffn=8960, layers=28, heads=12, kv_heads=2, vocab=151936,
                       context=32768, rope_base=1e6, eps=1e-6, qkv_bias=True),
}
TOKENIZER_FIELDS = ("pre", "merges", "bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")


def _field(reader, key):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def write_shape_gguf(shape: str, out: str, tokenizer_gguf: str, seed: int = 0) -> None:
    import gguf
    s = SHAPES[shape]
    reader = gguf.GGUFReader(tokenizer_gguf)
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type"))
    if len(tokens) > s["vocab"]:
        raise click.UsageError(f"--tokenizer_gguf {tokenizer_gguf}: {len(tokens)} tokens, more than {shape}'s "
                               f"vocabulary of {s['vocab']}")
    pad = s["vocab"] - len(tokens)
    tokens += [f"<|shape_pad_{i}|>" for i in range(pad)]
    types += [int(gguf.TokenType.CONTROL)] * pad

    w = gguf.GGUFWriter(out + ".part", s["arch"])
    w.add_name(f"random weights in {shape}'s shape")
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model(str(_field(reader, "tokenizer.ggml.model")))
    w.add_tokenizer_pre(str(_field(reader, "tokenizer.ggml.pre")))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(_field(reader, "tokenizer.ggml.merges")))
    w.add_bos_token_id(int(_field(reader, "tokenizer.ggml.bos_token_id")))
    w.add_eos_token_id(int(_field(reader, "tokenizer.ggml.eos_token_id")))
    w.add_pad_token_id(int(_field(reader, "tokenizer.ggml.padding_token_id")))
    w.add_add_bos_token(bool(_field(reader, "tokenizer.ggml.add_bos_token")))
    template = _field(reader, "tokenizer.chat_template")
    if template:
        w.add_chat_template(str(template))

    rng = np.random.default_rng(seed)
    hd = s["hidden"] // s["heads"]

    def weight(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    h, kv = s["hidden"], s["kv_heads"] * hd
    w.add_tensor("token_embd.weight", weight(s["vocab"], h))      # tied: the head reads it too
    for i in range(s["layers"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(h, np.float32))
        for name, rows in (("attn_q", h), ("attn_k", kv), ("attn_v", kv)):
            w.add_tensor(b + name + ".weight", weight(rows, h))
            if s["qkv_bias"]:
                w.add_tensor(b + name + ".bias", rng.standard_normal(rows, dtype=np.float32) * 0.02)
        w.add_tensor(b + "attn_output.weight", weight(h, h))
        w.add_tensor(b + "ffn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(b + "ffn_gate.weight", weight(s["ffn"], h))
        w.add_tensor(b + "ffn_up.weight", weight(s["ffn"], h))
        w.add_tensor(b + "ffn_down.weight", weight(h, s["ffn"]))
    w.add_tensor("output_norm.weight", np.ones(h, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(out + ".part", out)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--shape", type=click.Choice(sorted(SHAPES)), default="qwen2-0.5b", show_default=True)
@click.option("--out", required=True, help="the GGUF to write (name it *.F16.gguf: tools/bench_quant.py reads "
              "the type from the name)")
@click.option("--tokenizer_gguf", default="build/models/SmolLM2-135M-Instruct.Q4_1.gguf", show_default=True,
              help="the GGUF whose tokenizer the file takes")
@click.option("--seed", type=int, default=0, show_default=True)
def main(shape, out, tokenizer_gguf, seed):
    if not os.path.isfile(tokenizer_gguf):
        raise click.UsageError(f"--tokenizer_gguf {tokenizer_gguf}: no such file (`make setup` fetches SmolLM2's)")
    write_shape_gguf(shape, out, tokenizer_gguf, seed)
    print(f"wrote {out}: random float16 weights in {shape}'s shape", file=sys.stderr)


if __name__ == "__main__":
    main()
