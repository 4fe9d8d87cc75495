"""Weights: read checkpoints, map names, shard for tensor parallelism, load with checks.

Canonical names are MindFormers' Llama names (the network's parameter paths). Sources:
- a MindSpore `.ckpt` file with those names (full model);
- a folder of `rank_{i}/*.ckpt` shards, one per rank, already split (loaded as is);
- a Hugging Face folder of `*.safetensors`, renamed through `HF_TO_MINDFORMERS`.
Nothing is left at its placeholder value: missing, unexpected and misshapen tensors stop the export.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Dict, List

import numpy as np

from lite_runtime.errors import WeightError
from .safetensors_io import load_safetensors

HF_TO_MINDFORMERS = [
    (r"model\.embed_tokens\.weight", "model.tok_embeddings.embedding_weight"),
    (r"model\.layers\.(\d+)\.self_attn\.q_proj\.weight", r"model.layers.\1.attention.wq.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.k_proj\.weight", r"model.layers.\1.attention.wk.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.v_proj\.weight", r"model.layers.\1.attention.wv.weight"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"model.layers.\1.attention.wo.weight"),
    (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"model.layers.\1.feed_forward.w1.weight"),
    (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"model.layers.\1.feed_forward.w2.weight"),
    (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"model.layers.\1.feed_forward.w3.weight"),
    (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"model.layers.\1.attention_norm.weight"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"model.layers.\1.ffn_norm.weight"),
    (r"model\.norm\.weight", "model.norm_out.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
]
# HF tensors with no learned content (rotary buffers saved by old versions).
_HF_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")

# Tensor-parallel split axis by parameter suffix: column-parallel layers split their output rows,
# row-parallel layers their input columns; everything else is replicated.
_SPLIT_AXIS = {"attention.wq.weight": 0, "attention.wk.weight": 0, "attention.wv.weight": 0,
               "feed_forward.w1.weight": 0, "feed_forward.w3.weight": 0, "lm_head.weight": 0,
               "attention.wo.weight": 1, "feed_forward.w2.weight": 1}
EMBEDDING = "model.tok_embeddings.embedding_weight"


def rank_folders(path: str) -> List[str]:
    """`rank_0`, `rank_1`, ... inside `path`, or [] when `path` is not a sharded checkpoint folder."""
    if not os.path.isdir(path):
        return []
    found = sorted((int(m.group(1)), os.path.join(path, n))
                   for n in os.listdir(path) for m in [re.fullmatch(r"rank_(\d+)", n)] if m)
    if found and [i for i, _ in found] != list(range(len(found))):
        raise WeightError(f"{path}: rank folders must be rank_0 .. rank_{{N-1}}; found "
                          f"{', '.join(os.path.basename(p) for _, p in found)}")
    return [p for _, p in found]


def read_full_weights(path: str) -> Dict[str, np.ndarray]:
    """A full (unsharded) model under canonical names, from a .ckpt file or a safetensors folder."""
    if os.path.isfile(path):
        if not path.endswith(".ckpt"):
            raise WeightError(f"load_checkpoint {path}: a file must be a MindSpore .ckpt")
        return read_ckpt(path)
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        tensors = {}
        for f in files:
            tensors.update(load_safetensors(f))
        return rename_hf(tensors, path)
    ckpts = sorted(glob.glob(os.path.join(path, "*.ckpt")))
    if len(ckpts) == 1:
        return read_ckpt(ckpts[0])
    raise WeightError(f"load_checkpoint {path}: found no weights; allowed: a .ckpt file, a folder with one "
                      ".ckpt, a folder of *.safetensors, or a folder of rank_{i}/*.ckpt shards")


def read_rank_shard(folder: str) -> Dict[str, np.ndarray]:
    ckpts = sorted(glob.glob(os.path.join(folder, "*.ckpt")))
    if len(ckpts) != 1:
        raise WeightError(f"{folder} must hold exactly one .ckpt, found {len(ckpts)}")
    return read_ckpt(ckpts[0])


def read_ckpt(path: str) -> Dict[str, np.ndarray]:
    import mindspore as ms
    try:
        params = ms.load_checkpoint(path)
    except (RuntimeError, ValueError, OSError) as e:
        raise WeightError(f"cannot read checkpoint {path}: {str(e).splitlines()[0]}") from None
    return {name: p.asnumpy() for name, p in params.items() if not name.startswith(("adam_", "moment", "global_step"))}


def rename_hf(tensors: Dict[str, np.ndarray], where: str) -> Dict[str, np.ndarray]:
    out, unknown = {}, []
    for name, value in tensors.items():
        if _HF_IGNORED.fullmatch(name):
            continue
        for pattern, target in HF_TO_MINDFORMERS:
            if re.fullmatch(pattern, name):
                out[re.sub(pattern, target, name)] = value
                break
        else:
            unknown.append(name)
    if unknown:
        raise WeightError(f"{where}: unexpected tensors with no Llama meaning: {', '.join(sorted(unknown)[:10])}")
    return out


def shard(full: Dict[str, np.ndarray], rank: int, world_size: int) -> Dict[str, np.ndarray]:
    """This rank's slice of every tensor (Megatron-style contiguous blocks)."""
    if world_size == 1:
        return full
    out = {}
    for name, value in full.items():
        axis = next((a for suffix, a in _SPLIT_AXIS.items() if name.endswith(suffix)), None)
        if axis is None:
            out[name] = value
            continue
        if value.shape[axis] % world_size:
            raise WeightError(f"{name} of shape {value.shape} cannot be split in {world_size} along axis {axis}")
        out[name] = np.split(value, world_size, axis=axis)[rank]
    return out


def tie_embeddings(weights: Dict[str, np.ndarray], tied: bool, rank: int, world_size: int,
                   sharded: bool) -> Dict[str, np.ndarray]:
    """Give `lm_head.weight` the (vocab-sharded) embedding when the model ties them."""
    if not tied or "lm_head.weight" in weights or EMBEDDING not in weights:
        return weights
    head = weights[EMBEDDING]
    if not sharded and world_size > 1:
        head = np.split(head, world_size, axis=0)[rank]
    return dict(weights, **{"lm_head.weight": head})


def load_into(net, weights: Dict[str, np.ndarray], where: str) -> None:
    """Set every network parameter from `weights` (canonical names), checking names and shapes."""
    from mindspore import Tensor
    params = {name: p for name, p in net.parameters_and_names() if not name.endswith(("key_cache", "value_cache"))}
    missing = sorted(set(params) - set(weights))
    unexpected = sorted(set(weights) - set(params))
    wrong = [f"{n}: checkpoint {tuple(weights[n].shape)} vs model {tuple(params[n].shape)}"
             for n in sorted(set(params) & set(weights)) if tuple(weights[n].shape) != tuple(params[n].shape)]
    problems = ([f"missing {n}" for n in missing] + [f"unexpected {n}" for n in unexpected]
                + [f"wrong shape {w}" for w in wrong])
    if problems:
        shown = "; ".join(problems[:12]) + (f"; ... {len(problems) - 12} more" if len(problems) > 12 else "")
        raise WeightError(f"weights from {where} do not fit the model ({len(problems)} "
                          f"problem{'s' if len(problems) > 1 else ''}): {shown}")
    for name, p in params.items():
        p.set_data(Tensor(np.ascontiguousarray(weights[name]).astype(np.float32), p.dtype))
