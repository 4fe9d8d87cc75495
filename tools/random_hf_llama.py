"""A random Hugging Face Llama folder of a real shape in float16, for export measurements at the sizes
users ship (a 7B checkpoint is 13.5 GB in float16) without torch and without a copy of the whole model
in memory: each safetensors shard is made and written on its own.

    .venv/bin/python tools/random_hf_llama.py --shape 7b --out DIR [--shard_gb 2] [--seed 0] [--gguf]
    .venv/bin/python tools/bench_export.py --python .venv-ms20/bin/python --config DIR/export.yaml -n 1

Writes config.json (transformers' LlamaForCausalLM), model-0000k-of-0000n.safetensors with their index,
and export.yaml (compute_dtype float16, kv_cache packed, the folder as hf_dir) beside them. Weights are
normal(0, 0.02), norms 1; the folder has no tokenizer (the export warns; measurements need none).

`--gguf` also writes DIR.F16.gguf: the same weights as llama.cpp's converter lays them out (q and k rows
interleaved), with a byte-level vocabulary of the model's size (the 256 byte letters after <unk>, <s>,
</s>, then filler pieces), so that llama.cpp and this project's GGUF reader run the same model
(`tools/bench_quant.py --gguf DIR.F16.gguf`).
"""
from __future__ import annotations

import json
import os
import struct
import sys

import click
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_scale import SHAPES  # noqa: E402
from lite_runtime.contract.command_line import CONTEXT, entry_point  # noqa: E402


def hf_tensors(shape: dict):
    """(name, shape) of every tensor of a transformers Llama, in file order."""
    h, inter, vocab, layers = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"], shape["num_layers"]
    kv = shape["n_kv_heads"] * (h // shape["n_heads"])
    yield "model.embed_tokens.weight", (vocab, h)
    for i in range(layers):
        p = f"model.layers.{i}."
        yield from ((p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (h, h)),
                    (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.v_proj.weight", (kv, h)),
                    (p + "self_attn.o_proj.weight", (h, h)), (p + "post_attention_layernorm.weight", (h,)),
                    (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                    (p + "mlp.down_proj.weight", (h, inter)))
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (vocab, h)


def write_shards(out: str, shape: dict, shard_bytes: int, seed: int) -> int:
    """The shards and their index; returns the weights' bytes."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    groups, current, size = [], [], 0
    for name, dims in hf_tensors(shape):
        nbytes = 2 * int(np.prod(dims))
        if current and size + nbytes > shard_bytes:
            groups.append(current)
            current, size = [], 0
        current.append((name, dims))
        size += nbytes
    groups.append(current)
    weight_map, total = {}, 0
    for k, group in enumerate(groups, 1):
        file = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: (np.ones(dims, np.float16) if name.endswith("norm.weight") else
                          (0.02 * rng.standard_normal(dims, dtype=np.float32)).astype(np.float16))
                   for name, dims in group}
        save_file(tensors, os.path.join(out, file), metadata={"format": "pt"})
        total += sum(t.nbytes for t in tensors.values())
        weight_map.update({name: file for name, _ in group})
        print(f"wrote {file} ({sum(t.nbytes for t in tensors.values()) / 2**30:.2f} GiB)", file=sys.stderr, flush=True)
        del tensors
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    return total


def _mapped(path: str, name: str) -> np.ndarray:
    """Tensor `name` of a float16 / float32 safetensors file, mapped rather than read."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        info = json.loads(f.read(size))[name]
    start, end = info["data_offsets"]
    dtype = {"F16": np.float16, "F32": np.float32}[info["dtype"]]
    return np.memmap(path, dtype, "r", offset=8 + size + start, shape=tuple(info["shape"]))


def write_gguf(folder: str, shape: dict, path: str) -> None:
    """The folder's weights as a float16 GGUF (norms float32), tensor after tensor from the shards."""
    import gguf
    heads, kv_heads = shape["n_heads"], shape["n_kv_heads"]
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        files = json.load(f)["weight_map"]
    writer = gguf.GGUFWriter(path + ".part", "llama")
    writer.add_block_count(shape["num_layers"])
    writer.add_context_length(4096)
    writer.add_embedding_length(shape["hidden_size"])
    writer.add_feed_forward_length(shape["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(shape["norm_eps"])
    writer.add_rope_freq_base(shape["rope_theta"])
    writer.add_rope_dimension_count(shape["hidden_size"] // heads)
    writer.add_vocab_size(shape["vocab_size"])
    letters = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + [chr(c) for c in range(174, 256)]
    letters += [chr(256 + i) for i in range(256 - len(letters))]      # GPT-2's byte alphabet
    tokens = ["<unk>", "<s>", "</s>"] + letters
    tokens += [f"x{i}" for i in range(shape["vocab_size"] - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(["x 0", "x 1"])
    writer.add_bos_token_id(shape["bos_token_id"])
    writer.add_eos_token_id(shape["eos_token_id"])
    writer.add_add_bos_token(False)
    for name, _ in hf_tensors(shape):
        value = _mapped(os.path.join(folder, files[name]), name)     # pages read as the writer copies them
        if name.endswith("norm.weight"):
            value = value.astype(np.float32)
        parts = name.split(".")
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            module = ".".join(parts[3:-1])
            gname = f"blk.{parts[2]}.{names[module]}.weight"
            if module in ("self_attn.q_proj", "self_attn.k_proj"):   # llama.cpp's rotary order: pairs
                n = heads if module == "self_attn.q_proj" else kv_heads
                value = np.ascontiguousarray(value.reshape(n, 2, value.shape[0] // n // 2, -1)
                                             .swapaxes(1, 2).reshape(value.shape))
        writer.add_tensor(gname, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(path + ".part", path)


@click.command(context_settings=CONTEXT, help=__doc__.split("\n\n")[0])
@click.option("--shape", type=click.Choice(list(SHAPES)), default="7b", show_default=True)
@click.option("--out", required=True, help="the folder to write (created)")
@click.option("--shard_gb", type=float, default=2.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--seq_length", type=int, default=256, show_default=True, help="the export's seq_length")
@click.option("--gguf", is_flag=True, help="also write OUT.F16.gguf (the same weights, for llama.cpp)")
def command(shape, out, shard_gb, seed, seq_length, gguf):
    sizes = SHAPES[shape]
    os.makedirs(out, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float16",
              "vocab_size": sizes["vocab_size"], "hidden_size": sizes["hidden_size"],
              "intermediate_size": sizes["intermediate_size"], "num_hidden_layers": sizes["num_layers"],
              "num_attention_heads": sizes["n_heads"], "num_key_value_heads": sizes["n_kv_heads"],
              "rms_norm_eps": sizes["norm_eps"], "rope_theta": sizes["rope_theta"], "hidden_act": "silu",
              "max_position_embeddings": 4096, "tie_word_embeddings": False, "bos_token_id": sizes["bos_token_id"],
              "eos_token_id": sizes["eos_token_id"], "pad_token_id": sizes["pad_token_id"]}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    total = write_shards(out, sizes, int(shard_gb * 2**30), seed)
    with open(os.path.join(out, "export.yaml"), "w") as f:
        f.write(f"model:\n  hf_dir: {os.path.abspath(out)}\nseq_length: {seq_length}\nbatch_size: 1\n"
                f"kv_cache: packed\ncompute_dtype: float16\noutput_dir: {os.path.abspath(out)}_export\n")
    print(f"{out}: a random {shape} Llama, {total / 2**30:.2f} GiB of float16 weights; export.yaml beside them")
    if gguf:
        write_gguf(out, sizes, out.rstrip("/") + ".F16.gguf")
        print(f"{out.rstrip('/')}.F16.gguf: the same model for llama.cpp")
    return 0


main = entry_point(command, "python tools/random_hf_llama.py")


if __name__ == "__main__":
    sys.exit(main())
