"""Tracing: build a rank's share of the network, load its weights, write its graphs (or, in the
segment form, every rank's step segments)."""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
from typing import Dict

import numpy as np

from lite_runtime.contract.errors import ConfigError, WeightError
from lite_runtime.contract.families import DYNAMIC, STEP
from lite_runtime.contract.mindir import SPLIT_GRAPH_SUFFIX
from lite_runtime.contract.quant import own_head
from exporter.writing.export_plan import ExportPlan, lora_fields
from exporter.writing.output_folder import check_room
from exporter.writing.progress import stage
from exporter.config.schema import ExportConfig
from exporter.model_source import ModelSource
from exporter.weights import checkpoints as W


def rank_weights(source: ModelSource, rules: Dict[str, int], expects_head: bool, rank: int,
                 world_size: int, float_dtype=np.float32, finish=None) -> Dict[str, np.ndarray]:
    """This rank's weights under canonical names: a pre-sharded rank folder as is, shards of any
    layout merged by their strategy file and cut again, or a slice of the full model cut by the
    network's split rules. `finish` as in `checkpoints.read_source`."""
    shards = W.rank_folders(source.checkpoint)
    if shards and (source.adapter or source.pet_config or source.slora):
        raise WeightError(f"load_checkpoint {source.checkpoint}: LoRA adapters with rank-sharded checkpoints "
                          "are not supported yet; merge the shards first or export from a full checkpoint")
    if shards and not source.strategy:
        if len(shards) != world_size:
            raise WeightError(f"load_checkpoint {source.checkpoint} has {len(shards)} rank folders but "
                              f"parallel.model_parallel is {world_size}; give src_strategy_path_or_dir (the "
                              "training run's strategy file) to re-split them, or export with that model_parallel")
        weights = W.read_rank_shard(shards[rank], source.family, source.config)
        return W.tie_head(weights, expects_head, source.config.tie_word_embeddings, 0, 1)
    done = set()   # tensors read as this rank's slice already
    read_finish = finish
    if finish is not None and world_size > 1 and source.config.tie_word_embeddings and expects_head:
        def read_finish(name, array):     # the head's rows are cut from the float table below; each is
            return array if name == W.EMBEDDING else finish(name, array)     # quantized when loaded
    if shards:
        full = W.merge_shards(shards, source.strategy, source.family, source.config)
    else:
        full, done = W.read_source(source, rules, rank, world_size, float_dtype, read_finish)
    if source.slora:
        from exporter.weights.slora import stacked_weights
        full.update(stacked_weights(source.slora, source.config))
    full = W.tie_head(full, expects_head, source.config.tie_word_embeddings, 0, 1)
    if source.config.tie_word_embeddings:    # a tied head is the whole embedding again: cut below
        done = done - {W.HEAD}
    return W.shard(full, rules, rank, world_size, done)


def _dummy(spec):
    """A tracing input: zeros, or a shape-only tensor where a dimension is chosen per call."""
    import mindspore as ms
    from mindspore import Tensor
    if DYNAMIC in spec.shape:
        dtype = {"int32": ms.int32, "float32": ms.float32}[spec.dtype]
        return Tensor(shape=[None if d == DYNAMIC else d for d in spec.shape], dtype=dtype)
    return Tensor(np.zeros(spec.shape, spec.dtype))


def _build_rank(config: ExportConfig, source: ModelSource, plan: ExportPlan, rank: int,
                graph_collectives: bool = True):
    """Rank `rank`'s network with its weights loaded."""
    import mindspore as ms
    from lite_runtime.contract.mindir import cpu_graph_mode
    from exporter.models.attention import BuildContext
    from exporter.models.decoder import CausalLM
    from exporter.models.linear import split_rules

    cpu_graph_mode(ms)
    dtype = ms.float16 if config.compute_dtype == "float16" else ms.float32
    scheme = config.kernel_quantization
    ctx = BuildContext(config.world_size, rank, plan.kv_cache, config.batch_size, config.seq_length, dtype,
                       **lora_fields(source), graph_collectives=graph_collectives,
                       own_head=own_head(scheme.weights, scheme.head, scheme.embedding),
                       attention_kernel=config.attention_on_kernel, paged_kv=config.attention == "paged")
    where = _where(config, rank)
    with stage(f"built the {source.family.name} network{where}"):
        net = CausalLM(source.config, ctx)
    kernels = None
    if scheme.weights != "none":
        from exporter.models.linear import LinearKernels
        kernels = LinearKernels(net, scheme.weights, scheme.group_size, scheme.head, scheme.embedding)
    loaded = "read and loaded the weights" + (f", the linear layers' as {scheme.weights}" if kernels else "")
    with stage(f"{loaded}{where}"):
        weights = rank_weights(source, split_rules(net), not net.head_is_embedding, rank, config.world_size,
                               np.float16 if config.compute_dtype == "float16" else np.float32,
                               kernels.finish if kernels else None)
        W.load_into(net, weights, source.checkpoint + where, W.plan_for(source.checkpoint, source.family), kernels)
    return net


def _check_room(config: ExportConfig, plan: ExportPlan, net, folder: str, rank: int, copies: int) -> None:
    """Room for `copies` of the network's weights as MindIR, and as much again for the .ms they convert to."""
    from mindspore import dtype_to_nptype
    weights = sum(int(np.prod(p.shape)) * np.dtype(dtype_to_nptype(p.dtype)).itemsize
                  for p in net.get_parameters())
    what = "writing the graphs" + (" (MindIR, then .ms)" if plan.lite_ms else "") + _where(config, rank)
    check_room(folder, weights * copies * (2 if plan.lite_ms else 1), what, config.source)


def _where(config: ExportConfig, rank: int) -> str:
    return f" (rank {rank})" if config.world_size > 1 else ""


def _export(cell, specs, path: str, split: bool = False) -> None:
    """Write `cell` to `path` (`<stem>.mindir`, or `<stem>_graph.mindir` for the main graphs).

    MindSpore writes a net whose parameters exceed 1 GiB (`TOTAL_SAVE` in
    mindspore/train/serialization.py) as `<file_name>_graph.mindir` plus `<file_name>_variables/data_N`,
    the weights as external data located relative to the graph's folder. The main graphs are exported
    as `rank_{r}`, so a large rank's files get upstream's names (`rank_{r}_graph.mindir`,
    `rank_{r}_variables/`); whichever form was written, the graph ends up at `path`. `split` writes
    that form whatever the size (`_weights_as_external_data`)."""
    import mindspore as ms
    os.makedirs(os.path.dirname(path), exist_ok=True)
    stem = path[: -len(".mindir")]
    if stem.endswith(SPLIT_GRAPH_SUFFIX):
        stem = stem[: -len(SPLIT_GRAPH_SUFFIX)]
    with _weights_as_external_data() if split else contextlib.nullcontext():
        ms.export(cell, *[_dummy(t) for t in specs], file_name=stem, file_format="MINDIR")
    written = stem + ".mindir" if os.path.isfile(stem + ".mindir") else stem + SPLIT_GRAPH_SUFFIX + ".mindir"
    if written != path:
        os.replace(written, path)


@contextlib.contextmanager
def _weights_as_external_data():
    """MindSpore's split form for a graph of any size. Below `TOTAL_SAVE` MindSpore puts every weight
    into the graph's protobuf and serializes that whole: two copies of the weights beside the network's
    (the 135M model's exporter peaked at 2386 MiB for 514 MiB of weights, at 1468 MiB so); the split form writes
    them tensor by tensor. For a MindIR that is only the converter's input (Lite writes the same `.ms`
    from either form, byte for byte)."""
    import mindspore.train.serialization as serialization
    saved = serialization.TOTAL_SAVE
    serialization.TOTAL_SAVE = 0     # KiB; above it the weights go to external data
    try:
        yield
    finally:
        serialization.TOTAL_SAVE = saved


def release_traced() -> None:
    """Give back the memory of the networks traced so far, before the next rank is built or Lite's
    converter runs beside this process. MindSpore 2.0's graph executor keeps the parameters of the last
    net it compiled (`set_weights_values(obj.parameters_dict())` in `_CellGraphExecutor.compile`) until
    the next compile, so a traced rank's weights outlived it (1352 MiB held during the 135M model's
    conversion instead of 475 MiB); glibc keeps what the tensors freed until trimmed."""
    from mindspore.common.api import _cell_graph_executor
    executor = getattr(_cell_graph_executor, "_graph_executor", None)
    if hasattr(executor, "set_weights_values"):
        executor.set_weights_values({})
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):     # not glibc
        pass


def trace_rank(config: ExportConfig, source: ModelSource, plan: ExportPlan, rank: int, folder: str,
               split: bool = False) -> None:
    """Build rank `rank`'s network, load its weights and write its graphs into `folder` (`split`: with
    the weights as external data), then give back its memory."""
    from exporter.models.decoder import Graph, PackedGraph

    net = _build_rank(config, source, plan, rank)
    _check_room(config, plan, net, folder, rank, copies=len(plan.graphs))     # each graph holds the weights
    for kind, entry in plan.graphs.items():
        with stage(f"traced the {kind} graph{_where(config, rank)}"):
            cls = PackedGraph if kind == STEP else Graph
            _export(cls(net, kind, [t.name for t in entry.inputs]), entry.inputs,
                    os.path.join(folder, entry.files[rank]), split)
    del net
    release_traced()


def trace_segments(config: ExportConfig, source: ModelSource, plan: ExportPlan, folder: str,
                   split: bool = False) -> None:
    """Every rank's step as segments without collectives (`parallel.collectives: host`), traced
    rank after rank in this process: no distributed job is needed; each rank's memory is given back
    before the next is built. `split` as in `trace_rank`."""
    from exporter.models.segments import keep_row_biases_on_rank0, segment_cells

    for rank in range(config.world_size):
        net = _build_rank(config, source, plan, rank, graph_collectives=False)
        _check_room(config, plan, net, folder, rank, copies=1)
        keep_row_biases_on_rank0(net, rank)
        with stage(f"traced {len(plan.graphs)} step segments{_where(config, rank)}"):
            for name, cell in segment_cells(net, plan.layout).items():
                entry = plan.graphs[name]
                _export(cell, entry.inputs, os.path.join(folder, entry.files[rank]), split)
        net = cell = None
        release_traced()
