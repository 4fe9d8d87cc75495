"""Tiny random Llama models, checkpoints and export configs made locally for the tests."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Dict

import numpy as np
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_MS20_PYTHON = os.path.join(REPO, ".venv-ms20", "bin", "python")

# GQA on (4 query heads share 2 KV heads); small enough to export in a few seconds.
TINY = dict(family="llama", vocab_size=96, hidden_size=32, num_layers=2, n_heads=4, n_kv_heads=2,
            intermediate_size=64, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)


def llama_config(**overrides) -> dict:
    """The tiny model's sizes (TINY with overrides), without the family and special ids."""
    return {k: v for k, v in dict(TINY, **overrides).items()
            if k not in ("family", "bos_token_id", "eos_token_id", "pad_token_id")}


def mindformers_llama_shapes(sizes: dict) -> Dict[str, tuple]:
    """Parameter names and shapes of a MindFormers Llama checkpoint (written out here, independently
    of the exporter's weight plan)."""
    h, inter, vocab = sizes["hidden_size"], sizes["intermediate_size"], sizes["vocab_size"]
    kv = sizes["n_kv_heads"] * (h // sizes["n_heads"])
    shapes = {"model.tok_embeddings.embedding_weight": (vocab, h), "model.norm_out.weight": (h,),
              "lm_head.weight": (vocab, h)}
    for i in range(sizes["num_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "attention.wq.weight": (h, h), p + "attention.wk.weight": (kv, h),
                       p + "attention.wv.weight": (kv, h), p + "attention.wo.weight": (h, h),
                       p + "feed_forward.w1.weight": (inter, h), p + "feed_forward.w3.weight": (inter, h),
                       p + "feed_forward.w2.weight": (h, inter), p + "attention_norm.weight": (h,),
                       p + "ffn_norm.weight": (h,)})
    return shapes


def random_weights(sizes: dict, seed: int = 0, scale: float = 0.3) -> Dict[str, np.ndarray]:
    """MindFormers Llama names -> random float32 arrays, norms around 1."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in mindformers_llama_shapes(sizes).items():
        if name.endswith("norm.weight") or name.endswith("norm_out.weight"):
            weights[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            weights[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return weights


# Megatron-style split of MindFormers Llama tensors: column-parallel rows, row-parallel columns.
_SPLIT_AXIS = {"attention.wq.weight": 0, "attention.wk.weight": 0, "attention.wv.weight": 0,
               "feed_forward.w1.weight": 0, "feed_forward.w3.weight": 0, "lm_head.weight": 0,
               "attention.wo.weight": 1, "feed_forward.w2.weight": 1}


def shard_mindformers_llama(weights: Dict[str, np.ndarray], rank: int, world_size: int) -> Dict[str, np.ndarray]:
    out = {}
    for name, value in weights.items():
        axis = next((a for suffix, a in _SPLIT_AXIS.items() if name.endswith(suffix)), None)
        out[name] = value if axis is None else np.split(value, world_size, axis=axis)[rank]
    return out


def write_strategy(path: str, shapes: Dict[str, tuple], devices: int, split_axis=None) -> str:
    """A MindSpore strategy file for `devices`-way model parallel shards: each tensor cut along
    `split_axis(name)` (default: the Megatron layout of shard_mindformers_llama), or whole."""
    from mindspore.train import node_strategy_pb2 as pb
    split_axis = split_axis or (lambda n: next((a for s, a in _SPLIT_AXIS.items() if n.endswith(s)), None))
    strategy = pb.ParallelStrategyMap()
    strategy.current_stage = 0
    for name, shape in shapes.items():
        item = strategy.parallel_layout_item.add()
        item.param_name = name
        layouts = item.parallel_layouts
        layouts.dev_matrix.add().dim.extend([devices])
        axis = split_axis(name)
        layouts.tensor_map.add().dim.extend([0 if d == axis else -1 for d in range(len(shape))])
        layouts.param_split_shape.add()
        layouts.indices_offset.add()
        layouts.field, layouts.opt_weight_shard_step, layouts.opt_weight_shard_size = 0, 0, 0
    with open(path, "wb") as f:
        f.write(strategy.SerializeToString())
    return path


def save_ckpt(weights: Dict[str, np.ndarray], path: str) -> str:
    import mindspore as ms
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(v)} for n, v in weights.items()], path)
    return path


# How unknown-family errors list the families (one place for the tests that check those messages).
KNOWN_FAMILIES = ("known families: baichuan2, bloom, glm (chatglm), glm2 (glm3, chatglm2, chatglm3), gpt2, internlm, "
                  "llama (llama2, llama3, codellama), pangualpha, qwen (qwen1.5, qwen1, qwen2)")


def write_yaml(path: str, data: dict) -> str:
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return path


def tiny_export_config(ckpt: str, output_dir: str, **overrides) -> dict:
    model = {k: v for k, v in TINY.items()}
    model.update(overrides.pop("model", {}))
    config = {"model": model, "load_checkpoint": ckpt, "seq_length": 48, "batch_size": 3,
              "kv_cache": "io", "output_dir": output_dir}
    config.update(overrides)
    return config


def run_cli(args, python: str = sys.executable, cwd: str = REPO, stdin: str = None, timeout: int = 300):
    """Run `python ARGS` in the repo; returns CompletedProcess with text output."""
    env = dict(os.environ, PYTHONPATH=REPO, GLOG_v="3")
    return subprocess.run([python] + list(args), cwd=cwd, env=env, input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def export_in_subprocess(yaml_path: str, python: str = sys.executable) -> str:
    """`python -m exporter --config YAML` run by `python` (in its export worker: support/export_worker.py);
    returns the export folder."""
    from support.export_worker import export
    result = export(yaml_path, str(python), REPO, dict(os.environ, PYTHONPATH=REPO, GLOG_v="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def make_tokenizer(folder: str, vocab_size: int = 96) -> str:
    """A sentencepiece tokenizer.model whose vocabulary has exactly `vocab_size` pieces
    (padded with user-defined symbols), so every id a tiny random model emits decodes."""
    import sentencepiece as spm
    words = "one two three four five six seven eight nine ten alpha beta gamma delta".split()
    sentences = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    prefix = os.path.join(folder, "tokenizer")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_prefix=prefix, vocab_size=vocab_size,
                                   unk_id=3, bos_id=1, eos_id=2, pad_id=0, hard_vocab_limit=False,
                                   user_defined_symbols=[f"<t{i}>" for i in range(vocab_size - 39)],
                                   minloglevel=2)
    return prefix + ".model"


def train_byte_bpe_tokenizer(folder, corpus, vocab_size: int = 400) -> str:
    """A Llama-style sentencepiece BPE with byte fallback (CJK, emoji) trained on `corpus`."""
    import sentencepiece as spm
    text = os.path.join(str(folder), "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(list(corpus) * 20))
    prefix = os.path.join(str(folder), "tokenizer")
    spm.SentencePieceTrainer.train(input=text, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
                                   byte_fallback=True, character_coverage=0.98, unk_id=0, bos_id=1, eos_id=2,
                                   pad_id=-1, minloglevel=2)
    return prefix + ".model"


_PROGRESS = re.compile(r"exporter: .* \(\d+\.\d s\)")


def rank_table(path, n, server_id="127.0.0.1"):
    """A one-server HCCL rank table of `n` devices at `path` (a pathlib.Path); returns its path."""
    import json
    devices = [{"device_id": str(i), "device_ip": f"192.98.92.{100 + i}", "rank_id": str(i)} for i in range(n)]
    data = {"version": "1.0", "server_count": "1", "status": "completed",
            "server_list": [{"server_id": server_id, "device": devices, "host_nic_ip": "reserve"}]}
    path.write_text(json.dumps(data))
    return str(path)


def error_lines(stderr: str):
    """stderr without the exporter's stage lines ('exporter: traced the prefill graph (1.0 s)')."""
    return [ln for ln in stderr.strip("\n").splitlines() if ln.strip() and not _PROGRESS.fullmatch(ln)]
