"""`export(config)`: decide the export plan, trace every rank's graphs, check and convert them,
write the manifest; all into a temporary folder moved into place at the end (exporter/writing/output_folder.py).
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from typing import Dict, List

from lite_runtime.ascend import weight_quant
from lite_runtime.contract.errors import ArtifactError, ConfigError
from lite_runtime.contract.families import STEP, get_family
from lite_runtime.contract.graph_check import check_graph_inputs
from lite_runtime.contract.hashes import file_sha256
from lite_runtime.contract.mindir import FIRST_UNREADABLE_MINDSPORE
from lite_runtime.contract.quant import (PER_CHANNEL, head_reads_embedding, kernels_for, layer_kernels, own_head,
                                         quantization_record)
from lite_runtime.contract.manifest import GraphEntry, Manifest
from exporter.config.schema import ExportConfig
from exporter.writing.export_plan import ExportPlan, plan_export
from exporter.writing.forms import mindspore_version
from exporter.writing.lite_convert import convert_graphs, converter_python, lite_weights_name
from exporter.writing.output_folder import (check_infer_copies, check_output_dir, default_output_note, export_folder,
                                            write_infer_copies)
from exporter.writing.progress import deferred_interrupts, stage
from exporter.writing.trace import trace_rank, trace_segments
from exporter.model_source import ModelSource, resolve_model
from exporter.weights.adapters import adapter_record

log = logging.getLogger("exporter")
GE_CONFIG_NAME = "config.ini"


def export(config: ExportConfig) -> str:
    """Write the export described by `config`; returns its folder."""
    source = resolve_model(config)
    try:
        source.config.check_world_size(config.world_size)
    except ConfigError as e:
        raise ConfigError(f"{config.source}: {e}") from None
    plan = plan_export(config, source)
    check_output_dir(config)
    check_infer_copies(config)
    if config.infer.ge_config_path and not os.path.isfile(config.infer.ge_config_path):
        raise ConfigError(f"{config.source}: infer.ge_config_path {config.infer.ge_config_path} does not exist")
    converter = _lite_converter(config, plan)
    special_ids = _special_ids(config, source)
    start = time.perf_counter()
    with deferred_interrupts():
        with export_folder(config) as tmp:
            _trace_all(config, source, plan, tmp)
            with stage("checked the graphs' inputs"):
                mindir_version, data_files = _check_graphs(plan, tmp)
            if config.converter_quantizes:
                with stage(f"wrote Lite's weight quantization for GE ({weight_quant.CONFIG_NAME})"):
                    _write_ascend_quant(plan, tmp)
            lite_files = {}
            if converter:
                with stage("converted the graphs to MindSpore Lite's .ms format"
                           + (", removed their MindIR (the converter's input only)" if plan.removes_mindir else "")):
                    lite_files = convert_graphs(tmp, plan.graph_files, converter)
                    if plan.removes_mindir:
                        _remove_graphs(tmp, data_files)
                        data_files = {}
            with stage("hashed the files and wrote the manifest"):
                manifest = _write_side_files(config, source, plan, tmp, lite_files, special_ids, mindir_version,
                                             data_files)
        write_infer_copies(config, manifest)
    if not source.tokenizer:
        where = f"model.hf_dir {config.model.hf_dir} has none and " if config.model.hf_dir else ""
        log.warning("the export has no tokenizer (%sno model.tokenizer is given): every run needs one, given with "
                    "--tokenizer_path (tokenizer_path= in Python)", where)
    log.info("exported %s to %s (%d rank(s), %s; %s; %.1f s%s)", source.family.name, config.output_dir,
             config.world_size, plan.describe(manifest), stored_as(manifest.quantization), time.perf_counter() - start,
             f"; {default_output_note(config)}" if config.output_dir_default else "")
    return config.output_dir


def stored_as(quantization: dict) -> str:
    """What the export's last line says the weights are stored as (the manifest's `quantization`)."""
    if not quantization or quantization["weights"] == quantization["head"] == quantization["embedding"] == "float32":
        return "weights float32"
    if quantization.get("by") == "lite_converter":
        return "weights int8 by Lite's converter for GE, head and embedding float32"
    weights = quantization["weights"]
    group = quantization.get("group_size")
    if weights in ("int8", "int4"):
        weights += " per output channel" if group == PER_CHANNEL else f" in groups of {group}"
    return f"weights {weights}, head {quantization['head']}, embedding {quantization['embedding']}"


def _trace_all(config: ExportConfig, source: ModelSource, plan: ExportPlan, tmp: str) -> None:
    """Every rank's graphs into `tmp`, rank after rank in this process (no distributed job: the
    collectives of rank graphs are built without a communication group, see `exporter.models.linear.world_group`).
    Each rank's memory is given back before the next rank is built, and before Lite's converter runs
    beside this process. A MindIR that only the converter reads has its weights as external data,
    written tensor by tensor."""
    if plan.segmented:
        trace_segments(config, source, plan, tmp, plan.removes_mindir)
        return
    for rank in range(config.world_size):
        trace_rank(config, source, plan, rank, tmp, plan.removes_mindir)


def _lite_converter(config: ExportConfig, plan: ExportPlan):
    """The converter's Python when the plan has .ms models (checked before any tracing)."""
    if not plan.lite_ms:
        return None
    if mindspore_version() >= FIRST_UNREADABLE_MINDSPORE:
        import mindspore as ms
        raise ConfigError(f"{config.source}: lite_ms: true converts MindIR for MindSpore Lite 2.0, which reads only "
                          f"MindIR of MindSpore 2.0; this is MindSpore {ms.__version__}: export with "
                          "the Lite-compatible environment (`make export-lite CONFIG=...`)")
    return converter_python(config.source)


def _check_graphs(plan: ExportPlan, tmp: str):
    """Check every MindIR's inputs against the contract; returns (their MindIR version, {graph: the
    files holding its weights as external data, [] for none}), paths relative to `tmp`."""
    from lite_runtime.contract.mindir import read_mindir
    version, data_files = "", {}
    for entry in plan.graphs.values():
        for rel in entry.files:
            graph = read_mindir(os.path.join(tmp, rel))
            version = graph.version
            check_graph_inputs(graph.inputs, entry.inputs, f"exported {rel}")
            data_files[rel] = [os.path.normpath(os.path.join(os.path.dirname(rel), d)) for d in graph.data_files]
    return version, data_files


def _write_ascend_quant(plan: ExportPlan, tmp: str) -> None:
    """The converter's configuration, naming the nodes of every graph that read the head's or the
    embedding's table (kept float32; a tied head reads the embedding's)."""
    from lite_runtime.contract.mindir import nodes_reading
    heads = [name for entry in plan.graphs.values() for rel in entry.files
             for name in nodes_reading(os.path.join(tmp, rel), ("head.weight", "embed.weight"), ("MatMul", "Gather"))]
    with open(os.path.join(tmp, weight_quant.CONFIG_NAME), "w", encoding="utf-8") as f:
        f.write(weight_quant.config_text(sorted(set(heads))))


def _remove_graphs(tmp: str, data_files: Dict[str, List[str]]) -> None:
    """Remove the MindIR graphs (and their external data, and its emptied folders) once converted."""
    for rel, data in data_files.items():
        for name in [rel] + data:
            os.remove(os.path.join(tmp, name))
        for folder in sorted({os.path.dirname(d) for d in data}, reverse=True):
            if folder != os.path.dirname(rel):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(tmp, folder))


def _write_side_files(config: ExportConfig, source: ModelSource, plan: ExportPlan, tmp: str, lite_files,
                      special_ids, mindir_version: str, data_files: Dict[str, List[str]]) -> Manifest:
    """The tokenizer and GE config copies and the manifest. `data_files`: the MindIR graphs the export
    keeps ({} when they were removed after their conversion), with their external data."""
    import mindspore as ms

    hashes, external = {}, {}
    for kind, entry in plan.graphs.items():
        kept = [rel for rel in entry.files if rel in data_files]
        for rel in kept:
            if data_files[rel]:
                external[rel] = data_files[rel]
        for rel in lite_files.get(kind, []):
            weights = lite_weights_name(rel)
            if os.path.isfile(os.path.join(tmp, weights)):
                external[rel] = [weights]
        for rel in kept + lite_files.get(kind, []):
            for name in [rel] + external.get(rel, []):
                hashes[name] = file_sha256(os.path.join(tmp, name))
    # The segment form's step has no file of its own: the decode loop's contract, run as segments.
    graphs = plan.graphs
    if plan.segmented:
        spec, kv, dims = get_family(source.family.name), plan.kv_cache, plan.dims
        graphs = {STEP: GraphEntry([], spec.inputs(STEP, kv, dims), spec.outputs(STEP, kv, dims))}
    tokenizer = None
    bos, eos = special_ids
    if source.tokenizer:
        tokenizer = os.path.basename(source.tokenizer)
        for path in [source.tokenizer] + source.tokenizer_side_files:
            shutil.copyfile(path, os.path.join(tmp, os.path.basename(path)))
    ge_config = None
    if config.infer.ge_config_path:
        ge_config = GE_CONFIG_NAME
        shutil.copyfile(config.infer.ge_config_path, os.path.join(tmp, ge_config))
    model_config = dict(source.config.to_json(), **source.token_ids)     # the runtime's feed builder reads the ids
    quant, cfg = config.kernel_quantization, source.config
    manifest = Manifest(family=source.family.name, model_config=model_config, graph_dims=plan.dims.to_json(),
                        kv_cache=plan.kv_cache, seq_length=config.seq_length, batch_size=config.batch_size,
                        world_size=config.world_size, compute_dtype=config.compute_dtype, graphs=graphs,
                        bos_token_id=bos, eos_token_id=eos, pad_token_id=source.pad_token_id, tokenizer=tokenizer,
                        tokenizer_files=[os.path.basename(p) for p in source.tokenizer_side_files],
                        tokenizer_options=source.family.tokenizer_options() if tokenizer else {},
                        adapters=adapter_record(source), lite_files=lite_files, external_data=external,
                        collectives=plan.collectives, segments=plan.graphs if plan.segmented else {},
                        mindspore_version=ms.__version__, mindir_version=mindir_version, sha256=hashes,
                        ge_config=ge_config, mindir_kept=plan.mindir_kept,
                        quantization=weight_quant.record() if config.converter_quantizes else
                        quantization_record(quant.weights, quant.group_size, quant.head, quant.embedding),
                        kernels=kernels_for(quant.weights, quant.head, quant.embedding, head_reads_embedding(
                            bool(cfg.tie_word_embeddings), config.world_size,
                            own_head(quant.weights, quant.head, quant.embedding)))
                        + (layer_kernels(cfg.norm, cfg.mlp, cfg.positions, config.attention == "paged")
                           if config.attention_on_kernel else []))
    manifest.save(tmp)
    return manifest


def _special_ids(config: ExportConfig, source: ModelSource):
    """(bos, eos): the config's, else the tokenizer's. The tokenizer is read here, before any tracing, so
    a damaged one stops the export early, named by its own path."""
    bos, eos = source.bos_token_id, list(source.eos_token_id)
    if source.tokenizer:
        from lite_runtime.tokenizers import load_tokenizer
        try:
            tok = load_tokenizer(source.tokenizer, **source.family.tokenizer_options())
        except ArtifactError as e:
            raise ArtifactError(f"{config.source}: {e}") from None
        if tok.vocab_size > source.config.vocab_size:   # the runtime would refuse every run
            raise ConfigError(f"{config.source}: the tokenizer {source.tokenizer} has {tok.vocab_size} pieces (with "
                              f"the {source.family.name} family's special tokens) but the model's vocabulary is "
                              f"{source.config.vocab_size}: they belong to different models; give the model's own "
                              "tokenizer (model.tokenizer), whose pieces and special tokens fit its vocabulary")
        bos = tok.bos_token_id if bos is None else bos
        eos = eos or list(tok.eos_token_ids)
    if not eos:
        raise ConfigError(f"{config.source}: no eos_token_id: give model.eos_token_id or a tokenizer")
    return bos, eos
