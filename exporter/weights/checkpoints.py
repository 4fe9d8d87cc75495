"""Reading checkpoints into the network's canonical names, sharding them, loading them with checks.

Sources: a MindSpore `.ckpt` (MindFormers names), a folder of `rank_{i}/*.ckpt` shards (split for
the target model_parallel, or of any layout with the training run's strategy file), or a Hugging
Face folder of `*.safetensors`. The family's
weight plan maps source names; the network's layers say how each tensor splits across ranks.
Nothing is left at its placeholder value: missing, unexpected and misshapen tensors stop the export.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Set, Tuple

import numpy as np

from lite_runtime.contract.errors import WeightError
from exporter.weights.ckpt_io import read_ckpt_file
from exporter.weights.lazy_tensors import LazyTensors
from exporter.weights.safetensors_io import read_safetensors_part

HEAD, EMBEDDING = "head.weight", "embed.weight"
_NOT_WEIGHTS = ("adam_", "moment", "global_step", "learning_rate", "epoch_num", "step_num", "loss_scale")


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


def plan_for(path: str, family):
    """The family's Hugging Face plan for a safetensors folder or a GGUF file (read under Hugging Face
    names), its MindFormers plan otherwise."""
    hf = path.endswith(".gguf") or os.path.isdir(path) and glob.glob(os.path.join(path, "*.safetensors"))
    return family.hf_weights if hf else family.mindformers_weights


def read_source(source, rules: Dict[str, int], rank: int = 0, world_size: int = 1,
                float_dtype=np.float32, finish=None) -> Tuple[Dict[str, np.ndarray], Set[str]]:
    """A model under canonical names, from a .ckpt file or a safetensors folder, with its LoRA adapter
    (if any) merged in; and the names already cut to rank `rank`'s share of `rules`. From safetensors,
    a tensor that maps one to one onto a split tensor is read as this rank's block only; everything
    else is whole (fused tensors, .ckpt files) and is cut by `shard`. bfloat16 tensors are read as
    `float_dtype` (the export's compute dtype). Tensors of safetensors and GGUF files are read one at a
    time as the plan takes them, and each converted tensor goes through `finish(name, array)` (a quantized
    export's kernels quantize theirs there)."""
    path, family, cfg = source.checkpoint, source.family, source.config
    plan = plan_for(path, family)
    done: Set[str] = set()
    if os.path.isfile(path) and path.endswith(".gguf"):
        from exporter.weights.gguf_io import GGUFSource
        tensors = GGUFSource(path).tensors()
    elif os.path.isfile(path):
        if not path.endswith(".ckpt"):
            raise WeightError(f"load_checkpoint {path}: a file must be a MindSpore .ckpt or a .gguf")
        tensors = read_ckpt(path, float_dtype)
    elif glob.glob(os.path.join(path, "*.safetensors")):
        cut = {} if world_size == 1 or source.adapter else _source_axes(plan, rules)
        tensors = LazyTensors()
        for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
            part, cut_here = read_safetensors_part(f, cut, rank, world_size, float_dtype)
            tensors.update(part)
            done |= {plan.target_of(name) for name in cut_here}
    else:
        ckpts = sorted(glob.glob(os.path.join(path, "*.ckpt")))
        if len(ckpts) != 1:
            raise WeightError(f"load_checkpoint {path}: found no weights; allowed: a .ckpt file, a folder with one "
                              ".ckpt, a folder of *.safetensors, or a folder of rank_{i}/*.ckpt shards")
        path = ckpts[0]
        tensors = read_ckpt(path, float_dtype)
    tensors = _with_adapter(tensors, source, plan, path)
    return plan.apply(tensors, cfg, path, family.name, finish), done


def _source_axes(plan, rules: Dict[str, int]) -> Dict[str, int]:
    """{checkpoint name: axis} of the split canonical tensors a rule maps one to one (a transposed
    (in, out) source is cut along the other axis)."""
    axes = {}
    for canonical, axis in rules.items():
        found = plan.source_of(canonical)
        if found:
            name, transposed = found
            axes[name] = 1 - axis if transposed and axis < 2 else axis
    return axes


def _with_adapter(tensors, source, plan, where: str) -> Dict[str, np.ndarray]:
    from exporter.weights.adapters import merge_lora, read_peft_adapter, split_mindformers_lora
    if source.pet_config:
        tensors, adapter = split_mindformers_lora(tensors, source.pet_config.get("lora_rank"),
                                                  source.pet_config.get("lora_alpha"), where)
    elif source.adapter:
        adapter = read_peft_adapter(source.adapter)
    else:
        return tensors
    return merge_lora(tensors, adapter, plan, where)


def read_rank_shard(folder: str, family, cfg) -> Dict[str, np.ndarray]:
    path = _ckpt_in(folder)
    return family.mindformers_weights.apply(read_ckpt(path), cfg, path, family.name)


def merge_shards(folders: List[str], strategy_path: str, family, cfg) -> Dict[str, np.ndarray]:
    """The full model under canonical names from rank_{i} shards cut by any layout, put back together by
    MindSpore's own `merge_sliced_parameter` from the training run's strategy file (or a folder of
    per-stage files, merged first with `merge_pipeline_strategys`)."""
    import tempfile
    import mindspore as ms
    with tempfile.TemporaryDirectory(prefix="strategy-") as tmp:
        path = strategy_path
        if os.path.isdir(path):
            path = os.path.join(tmp, "merged_strategy.ckpt")
            ms.merge_pipeline_strategys(strategy_path, path)
        try:
            strategy = ms.build_searched_strategy(path)
        except (ValueError, RuntimeError, OSError) as e:
            raise WeightError(f"src_strategy_path_or_dir {strategy_path}: not a MindSpore strategy file: "
                              f"{str(e).splitlines()[0]}") from None
    shards = [read_ckpt(_ckpt_in(folder)) for folder in folders]
    full = {}
    for name in shards[0]:
        if name not in strategy:       # not cut by the training run: every rank holds all of it
            full[name] = shards[0][name]
            continue
        layout = strategy[name]
        devices = int(np.prod(list(layout.dev_matrix[0].dim)))
        if devices != len(shards):
            raise WeightError(f"src_strategy_path_or_dir {strategy_path}: {name} is laid out over {devices} devices "
                              f"but load_checkpoint has {len(shards)} rank folders")
        missing = [i for i, s in enumerate(shards) if name not in s]
        if missing:
            raise WeightError(f"{folders[missing[0]]}: the shard has no {name}")
        slices = [ms.Parameter(ms.Tensor(s[name]), name=name) for s in shards]
        try:
            full[name] = ms.merge_sliced_parameter(slices, strategy).asnumpy()
        except (ValueError, TypeError, KeyError, RuntimeError) as e:
            raise WeightError(f"src_strategy_path_or_dir {strategy_path}: cannot merge the shards of {name} "
                              f"{list(shards[0][name].shape)} by its layout: {str(e).splitlines()[0]}") from None
    where = f"{os.path.dirname(folders[0])} (merged by {strategy_path})"
    return family.mindformers_weights.apply(full, cfg, where, family.name)


def _ckpt_in(folder: str) -> str:
    ckpts = sorted(glob.glob(os.path.join(folder, "*.ckpt")))
    if len(ckpts) != 1:
        raise WeightError(f"{folder} must hold exactly one .ckpt, found {len(ckpts)}")
    return ckpts[0]


def read_ckpt(path: str, float_dtype=np.float32) -> Dict[str, np.ndarray]:
    """The weights of a MindSpore .ckpt (optimizer state and counters left out), each a view of the mapped file."""
    return read_ckpt_file(path, skip=_NOT_WEIGHTS, float_dtype=float_dtype)


def shard(full: Dict[str, np.ndarray], rules: Dict[str, int], rank: int, world_size: int,
          done: Set[str] = frozenset()) -> Dict[str, np.ndarray]:
    """This rank's slice of every tensor (Megatron-style contiguous blocks along its rule's axis),
    emptying `full`; `done` names tensors that are this rank's slice already."""
    if world_size == 1:
        return full
    out = {}
    for name in list(full):
        value = full.pop(name)   # emptied as it goes: the whole tensors are freed once cut
        axis = rules.get(name)
        if axis is None or name in done:
            out[name] = value
            continue
        if value.shape[axis] % world_size:
            raise WeightError(f"{name} of shape {value.shape} cannot be split in {world_size} along axis {axis}")
        out[name] = np.split(value, world_size, axis=axis)[rank].copy()   # a view would keep the whole alive
    return out


def tie_head(weights: Dict[str, np.ndarray], expects_head: bool, tied: bool, rank: int,
             world_size: int) -> Dict[str, np.ndarray]:
    """A tied head is the embedding: drop a saved copy the network does not hold, or give the network
    its vocabulary rows of the embedding when it holds its own (tensor parallel)."""
    weights = dict(weights)
    if not tied:
        return weights
    weights.pop(HEAD, None)
    if expects_head and EMBEDDING in weights:
        table = weights[EMBEDDING]
        weights[HEAD] = np.split(table, world_size, axis=0)[rank] if world_size > 1 else table
    return weights


def _loaded_parameters(net) -> Dict[str, object]:
    """The parameters the weights set (not the in-graph KV caches, which stay zeros)."""
    return {name: p for name, p in net.parameters_and_names() if hasattr(p, "full_shape")}


def load_into(net, weights: Dict[str, np.ndarray], where: str, plan=None, kernels=None) -> None:
    """Set every weight of the network (placeholders of `full_shape`, see `weight_param`) from
    `weights` (canonical names), checking names and shapes. `weights` is emptied as it goes and each
    parameter takes its array without a copy where the dtype is already the parameter's, so the
    model is held once. Problems are named as the checkpoint names them, when `plan` knows the
    checkpoint's name."""
    from mindspore import Tensor, dtype_to_nptype
    params = _loaded_parameters(net)
    shapes = {name: p.full_shape for name, p in params.items()}
    def named(n):
        found = plan.source_of(n) if plan is not None else None
        return n if found is None or found[0] == n else f"{found[0]} ({n})"

    missing = sorted(named(n) for n in set(params) - set(weights))
    unexpected = sorted(named(n) for n in set(weights) - set(params))
    wrong = [f"{named(n)}: checkpoint {tuple(weights[n].shape)} vs model {shapes[n]}"
             for n in sorted(set(params) & set(weights)) if tuple(weights[n].shape) != shapes[n]]
    problems = ([f"missing {n}" for n in missing] + [f"unexpected {n}" for n in unexpected]
                + [f"wrong shape {w}" for w in wrong])
    if problems:
        shown = "; ".join(problems[:12]) + (f"; ... {len(problems) - 12} more" if len(problems) > 12 else "")
        raise WeightError(f"weights from {where} do not fit the model ({len(problems)} "
                          f"problem{'s' if len(problems) > 1 else ''}): {shown}")
    for name, p in params.items():
        if kernels is not None and kernels.takes(name):
            kernels.place(name, weights.pop(name))
            continue
        array = np.ascontiguousarray(weights.pop(name), dtype=dtype_to_nptype(p.dtype))
        p.set_data(Tensor.from_numpy(array), slice_shape=True)
