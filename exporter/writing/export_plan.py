"""The export plan: what an export writes, decided once from the validated config and the model.

The yaml alone decides what it can (`ExportConfig._choose_form`: the kv mode, the collectives, the
`.ms` conversion, from `target`); the plan settles the rest once the model's sizes are known (whether
`target: cpu` writes one rank's step as segments because it would not fit one `.ms`, with the sizes
in exporter/writing/forms.py) and derives from both the graph dimensions, the segment layout and every
graph's files and I/O. Tracing, the .ms conversion and the manifest read the plan; the config is left
as the yaml gave it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from lite_runtime.contract.errors import ConfigError
from lite_runtime.contract.families import KV_BLOCK, GraphDims, get_family, graph_kinds
from lite_runtime.contract.manifest import GraphEntry, Manifest, graph_relpath
from lite_runtime.contract.mindir import FIRST_UNREADABLE_MINDSPORE
from lite_runtime.contract.segments import SegmentLayout, segment_relpath, segment_specs
from exporter.config.schema import ExportConfig
from exporter.model_source import ModelSource
from exporter.writing import forms

_KV_WORDS = {"io": "kv_cache io: prefill + increment graphs, each with its own copy of the weights",
             "in_graph": "kv_cache in_graph: prefill + increment graphs holding the cache",
             "packed": "kv_cache packed: one step graph over a list of tokens of any rows"}


@dataclass(frozen=True)
class ExportPlan:
    target: Optional[str]           # cpu | ascend; None: the yaml gives none
    kv_cache: str                   # io | in_graph | packed
    collectives: str                # graph: in each rank's graphs; host: each rank's step as segments
    lite_ms: bool                   # every graph converted to Lite's .ms
    removes_mindir: bool            # the MindIR is only the converter's input, removed once converted
    mindir_kept: str                # why the MindIR stays beside its .ms (the manifest's); '' otherwise
    dims: GraphDims
    layout: Optional[SegmentLayout]     # the segment form's; None in the graph form
    graphs: Dict[str, GraphEntry]       # graph kind (segment name in the segment form): a file per rank, its I/O

    @property
    def segmented(self) -> bool:
        return self.collectives == "host"

    @property
    def graph_files(self) -> Dict[str, List[str]]:
        return {kind: entry.files for kind, entry in self.graphs.items()}

    def describe(self, manifest: Manifest) -> str:
        """Which graphs the export holds and why, for its last line. Without a target, upstream's two
        graphs are Ascend's form, which a newcomer on a CPU machine should not get unawares."""
        form = f"kv_cache {self.kv_cache} as step segments per rank" if self.segmented else _KV_WORDS[self.kv_cache]
        if manifest.dims.kv_block:
            form += ", its K/V in the kernels' paged store"
        if manifest.lite_files:
            form += ", converted to Lite's .ms"
        if manifest.external_data:
            form += ", weights as external data"
        if self.target:
            return form + f", for target {self.target}"
        if self.kv_cache == "io" and not self.lite_ms:
            return form + ", for target ascend (no target given; target: cpu writes the form for MindSpore Lite on CPU)"
        return form + ", no target given (target: cpu writes the form for MindSpore Lite on CPU)"


def plan_export(config: ExportConfig, source: ModelSource) -> ExportPlan:
    """The plan of exporting `source` as `config` asks; refuses `target: cpu` with a MindSpore whose
    MindIR Lite 2.0 cannot read."""
    collectives = _settle_collectives(config, source)
    dims, ranks, kv = _graph_dims(config, source), range(config.world_size), config.kv_cache
    layout = None
    if collectives == "host":
        layout = _segment_layout(config, source)
        graphs = {name: GraphEntry([segment_relpath(name, r) for r in ranks], inputs, outputs)
                  for name, (inputs, outputs) in segment_specs(dims, config.world_size, layout).items()}
    else:
        spec = get_family(source.family.name)
        graphs = {kind: GraphEntry([graph_relpath(kind, r) for r in ranks], spec.inputs(kind, kv, dims),
                                   spec.outputs(kind, kv, dims))
                  for kind in graph_kinds(kv)}
    return ExportPlan(target=config.target, kv_cache=kv, collectives=collectives, lite_ms=bool(config.lite_ms),
                      removes_mindir=_removes_mindir(config), mindir_kept=_mindir_kept(config), dims=dims,
                      layout=layout, graphs=graphs)


def _settle_collectives(config: ExportConfig, source: ModelSource) -> str:
    """`parallel.collectives` as written: what `target: cpu` needs of the exporting MindSpore, and its
    choice that needs the model's sizes."""
    if config.target == "cpu" and forms.mindspore_version() >= FIRST_UNREADABLE_MINDSPORE:
        import mindspore as ms
        raise ConfigError(f"{config.source}: target cpu writes the form of MindSpore Lite 2.0 on CPU, which reads only "
                          f"MindIR of MindSpore 2.0; this is MindSpore {ms.__version__}: export with the MindSpore 2.0 "
                          "environment (make export-lite), or give no target for backend ms")
    if (config.segments_by_size and config.compute_dtype == "float32"
            and forms.weight_bytes(source.config, stored_bytes(config)) > forms.LITE_MS_LIMIT):
        return "host"
    return config.parallel.collectives


def _infer_copies(config: ExportConfig) -> bool:
    return bool(config.infer.prefill_model_path or config.infer.increment_model_path)


def _removes_mindir(config: ExportConfig) -> bool:
    """Whether the graphs' MindIR is only the input of Lite's converter, removed once each graph is a
    `.ms`: so for `target: cpu`, whose runtime loads the `.ms` (the `ms` backend runs no MindSpore 2.0
    MindIR), unless the yaml asks for upstream's infer: copies, which are copies of the MindIR."""
    return bool(config.lite_ms) and config.target == "cpu" and not _infer_copies(config)


def _mindir_kept(config: ExportConfig) -> str:
    """Why an export with `.ms` models keeps their MindIR beside them (the manifest's `mindir_kept`);
    '' when it has no `.ms` (the MindIR is what runs) or removes the MindIR (`_removes_mindir`)."""
    if not config.lite_ms or _removes_mindir(config):
        return ""
    if _infer_copies(config):
        return "the infer: copies (prefill_model_path, increment_model_path) are copies of the MindIR graphs"
    return ("lite_ms: true without target: cpu keeps both forms: the runtime loads the .ms, "
            "lite_format 'mindir' the MindIR")


def _graph_dims(config: ExportConfig, source: ModelSource) -> GraphDims:
    cfg = source.config
    return GraphDims(config.batch_size, config.seq_length, cfg.num_layers,
                     cfg.n_kv_heads // config.world_size, cfg.head_dim, cfg.vocab_size,
                     source.slora.slots if source.slora else 0, cfg.hidden_size,
                     int(cfg.positions in ("rotary", "rotary_2d")), KV_BLOCK if config.attention == "paged" else 0)


def lora_fields(source: ModelSource) -> dict:
    """SLoRA's BuildContext fields: every adapter side by side, each padded to the largest rank."""
    if not source.slora:
        return {}
    from exporter.weights.slora import targets
    return dict(lora_width=source.slora.slots * source.slora.rank, lora_rank=source.slora.rank,
                lora_targets=targets(source.slora))


def _segment_layout(config: ExportConfig, source: ModelSource) -> SegmentLayout:
    """What of this model shapes its step segments' I/O (lite_runtime/contract/segments.py)."""
    cfg, lora = source.config, lora_fields(source)
    adapted = tuple(part for part in ("attn", "mlp")
                    if any(t.startswith(part + ".") for t in lora.get("lora_targets", ())))
    return SegmentLayout(source.family.spec.row_inputs, cfg.prefix_attention, cfg.deepnorm,
                         cfg.top_query, lora.get("lora_width", 0), adapted,
                         forms.blocks_per_segment(cfg, config.world_size, stored_bytes(config)),
                         config.attention_on_kernel, config.attention == "paged")


def stored_bytes(config: ExportConfig) -> forms.StoredBytes:
    """The bytes a weight of this export is stored in, by the weights the kernels run."""
    q = config.kernel_quantization
    return forms.StoredBytes.of(q.weights, q.group_size, q.embedding, q.head)
