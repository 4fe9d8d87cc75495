"""The export manifest: the versioned contract between exporter and runtime.

One schema, read and written here only. The runtime trusts nothing else about an export.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from lite_runtime.contract.errors import ArtifactError, UnsupportedError
from lite_runtime.contract.hashes import CheckedHashes
from lite_runtime.contract.families import KV_MODES, GraphDims, TensorSpec, get_family, graph_kinds

FORMAT_VERSION = 3   # 2: graph dimensions stored (graph_dims), any family, tokenizer side files;
                     # 3: step graphs store keys transposed (B, kv, head_dim, P)
MANIFEST_NAME = "manifest.json"
RETIRED_KV_MODE = "dynamic"   # one step graph over B rows x T tokens, superseded by packed
# Custom op types of earlier quantized exports that no kernel runs any more (contract/quant.py has the others).
RETIRED_OP_TYPES = {"LiteLinearI8": "int8 rows stored whole, replaced by LiteLinearI8P16's panels",
                    "LiteLinearI8P4": "int8 in panels of 4 rows, replaced by LiteLinearI8P16's panels of 16",
                    "LiteGatherI8P4": "an int8 table in panels of 4 rows, replaced by LiteGatherI8P16's panels of 16",
                    "LiteLinearI4Min": "int4 rows stored whole, replaced by LiteLinearI4F16P16's panels",
                    "LiteLinearI4": "symmetric int4, which no export writes",
                    "LiteLinearI4MinP16": "int4 with float32 scales and mins, replaced by LiteLinearI4F16P16's "
                                          "float16 ones"}
COPY_MANIFEST_SUFFIX = ".manifest.json"   # beside an upstream infer.*_model_path graph copy
GRAPH_FOLDERS = {"prefill": "mindir_full_checkpoint", "increment": "mindir_inc_checkpoint", "step": "mindir_step"}


def graph_relpath(kind: str, rank: int) -> str:
    """Upstream-compatible location of one rank's graph inside an export folder."""
    return f"{GRAPH_FOLDERS[kind]}/rank_{rank}_graph.mindir"


@dataclass
class GraphEntry:
    files: List[str]                 # one per rank, relative to the export folder
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]

    def to_json(self) -> dict:
        return {"files": self.files, "inputs": [t.to_json() for t in self.inputs],
                "outputs": [t.to_json() for t in self.outputs]}

    @classmethod
    def from_json(cls, data: dict) -> "GraphEntry":
        return cls(list(data["files"]), [TensorSpec.from_json(t) for t in data["inputs"]],
                   [TensorSpec.from_json(t) for t in data["outputs"]])


@dataclass
class Manifest:
    family: str
    model_config: Dict[str, object]      # the exporter's model description (for people and tools)
    graph_dims: Dict[str, int]           # GraphDims: what the runtime sizes its buffers by
    kv_cache: str
    seq_length: int
    batch_size: int
    world_size: int
    compute_dtype: str
    graphs: Dict[str, GraphEntry]
    bos_token_id: Optional[int]
    eos_token_id: List[int]
    pad_token_id: int
    tokenizer: Optional[str]             # main tokenizer file, relative to the folder
    mindspore_version: str
    mindir_version: str
    sha256: Dict[str, str] = field(default_factory=dict)
    tokenizer_files: List[str] = field(default_factory=list)   # side files (tokenizer_config.json ...)
    tokenizer_options: Dict[str, object] = field(default_factory=dict)   # load_tokenizer() keywords: the
                                                                 # family's special_tokens, prefix_tokens, jieba
    adapters: List[dict] = field(default_factory=list)         # LoRA adapters merged into the weights
    lite_files: Dict[str, List[str]] = field(default_factory=dict)   # per graph kind: MindSpore Lite .ms per rank
    external_data: Dict[str, List[str]] = field(default_factory=dict)  # graph or .ms file -> the files holding
                                     # its weights (`<name>_variables/data_N`, `<name>.msw`), all relative to the folder
    ge_config: Optional[str] = None  # GE config.ini shipped with the export, relative to the folder
    collectives: str = "graph"       # multi-rank: in the rank graphs ("graph") or on the host between segments
    segments: Dict[str, GraphEntry] = field(default_factory=dict)   # the "host" form: each rank's step in pieces
    mindir_kept: str = ""            # why the graphs' MindIR is kept beside their .ms models (lite_files); "" with .ms
                                     # models: the MindIR, only the converter's input, was removed (target cpu) and
                                     # the graphs' `files` name no file on disk
    quantization: Dict[str, object] = field(default_factory=dict)   # weight-only quantization of the linear
                                     # layers (contract/quant.py: weights, group_size, ...); {}: float32 weights
    kernels: List[str] = field(default_factory=list)   # the project's Lite kernels (Custom op types) the graphs run
    format_version: int = FORMAT_VERSION
    root: str = ""                   # folder the manifest was read from; not serialised
    file: str = ""                   # the manifest file read (root/manifest.json or a copy's); not serialised

    @property
    def dims(self) -> GraphDims:
        return GraphDims.from_json(self.graph_dims)

    @property
    def vocab_size(self) -> int:
        return int(self.graph_dims["vocab_size"])

    def graph_path(self, kind: str, rank: int) -> str:
        return os.path.join(self.root, self.graphs[kind].files[rank])

    def segment_path(self, name: str, rank: int) -> str:
        return os.path.join(self.root, self.segments[name].files[rank])

    def lite_path(self, kind: str, rank: int) -> Optional[str]:
        """The graph converted to Lite's .ms format, when the export has it."""
        files = self.lite_files.get(kind)
        return os.path.join(self.root, files[rank]) if files else None

    def tokenizer_path(self) -> Optional[str]:
        return os.path.join(self.root, self.tokenizer) if self.tokenizer else None

    def ge_config_path(self) -> Optional[str]:
        return os.path.join(self.root, self.ge_config) if self.ge_config else None

    def to_json(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k not in ("graphs", "segments", "root", "file")}
        data["graphs"] = {k: g.to_json() for k, g in self.graphs.items()}
        data["segments"] = {k: g.to_json() for k, g in self.segments.items()}
        return data

    def save(self, folder: str, name: str = MANIFEST_NAME) -> None:
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=2, sort_keys=True)

    def verify_files(self) -> None:
        """Check that every graph file and weight data file exists and has the recorded hash (files
        checked before and unchanged since are not hashed again, see `hashes.CheckedHashes`)."""
        data = {rel for files in self.external_data.values() for rel in files}
        checked = CheckedHashes()
        try:
            for rel, expected in self.sha256.items():
                path = os.path.join(self.root, rel)
                what = "weight data file" if rel in data else "graph file"
                if not os.path.isfile(path):
                    raise ArtifactError(f"{what} {path} listed in {self._where()} does not exist")
                if not checked.matches(path, expected):
                    raise ArtifactError(f"{what} {path} does not match the sha256 in {self._where()}; "
                                        "the export was modified, damaged or truncated: export again")
        finally:
            checked.save()

    def _where(self) -> str:
        return self.file or os.path.join(self.root, MANIFEST_NAME)

    def require_packed(self, what: str, error=UnsupportedError) -> None:
        """Refuse, naming `what`, an export without the step graph (continuous batching and all it carries)."""
        if self.kv_cache != "packed":
            raise error(f"{what} needs an export with kv_cache packed (one step graph over a list of tokens of any "
                        f"rows); {self.root or 'this export'} has kv_cache {self.kv_cache!r}: export it again with "
                        "kv_cache: packed")


def copy_manifest_path(graph_copy: str) -> str:
    """The manifest written beside a copy of a graph (upstream `infer.prefill_model_path` ...)."""
    return graph_copy + COPY_MANIFEST_SUFFIX


def copy_manifest(manifest: Manifest, export_dir: str, copies: Dict[str, str], folder: str,
                  hashes: Dict[str, str]) -> Manifest:
    """`manifest` (of the export in `export_dir`) re-rooted at `folder`: each file named in `copies`
    ({name in the export: path of its copy}) is that copy, every other file the export's own, all
    by paths relative to `folder`. A copy's hash is `hashes[name]` when given (a graph whose data
    location was rewritten), else the export's (a byte copy)."""
    def moved(name):
        if not name:
            return name
        path = copies[name] if name in copies else os.path.join(export_dir, name)
        return os.path.relpath(os.path.abspath(path), os.path.abspath(folder))

    def entries(graphs: Dict[str, GraphEntry]) -> Dict[str, GraphEntry]:
        return {kind: GraphEntry([moved(n) for n in e.files], e.inputs, e.outputs) for kind, e in graphs.items()}

    return dataclasses.replace(
        manifest, graphs=entries(manifest.graphs), segments=entries(manifest.segments),
        sha256={moved(k): hashes.get(k, v) for k, v in manifest.sha256.items()},
        lite_files={kind: [moved(n) for n in files] for kind, files in manifest.lite_files.items()},
        external_data={moved(g): [moved(d) for d in data] for g, data in manifest.external_data.items()},
        tokenizer=moved(manifest.tokenizer), tokenizer_files=[moved(n) for n in manifest.tokenizer_files],
        ge_config=moved(manifest.ge_config), root=folder, file="")


def load_manifest(folder: str) -> Manifest:
    """An export folder's manifest, or, in upstream's model folder form, that of its prefill graph copy."""
    if not os.path.isdir(folder):
        raise ArtifactError(f"export folder {folder} does not exist")
    if not os.path.isfile(os.path.join(folder, MANIFEST_NAME)):
        return load_manifest_file(_graph_copy_manifest(folder))
    return load_manifest_file(os.path.join(folder, MANIFEST_NAME))


def _graph_copy_manifest(folder: str) -> str:
    """Upstream's model folder (MindFormers' Lite guide: a yaml, `xxx_prefill_graph.mindir`,
    `xxx_inc_graph.mindir`, `config.ini`): the manifest the exporter wrote beside its prefill graph copy."""
    graphs = sorted(n for n in os.listdir(folder) if n.endswith("prefill_graph.mindir"))
    found = [copy_manifest_path(os.path.join(folder, n)) for n in graphs
             if os.path.isfile(copy_manifest_path(os.path.join(folder, n)))]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise ArtifactError(f"{folder} holds the graphs of several exports ({', '.join(graphs)}); give "
                            "prefill_model_path and increment_model_path of one")
    if graphs:
        raise ArtifactError(f"{folder} is not an export: it has no {MANIFEST_NAME}, and {graphs[0]} has no "
                            f"{os.path.basename(copy_manifest_path(graphs[0]))} beside it; export with "
                            "infer.prefill_model_path / increment_model_path naming this folder, which writes it")
    raise ArtifactError(f"{folder} is not an export: it has no {MANIFEST_NAME} (nor a *prefill_graph.mindir "
                        f"copy with its {COPY_MANIFEST_SUFFIX} beside it)")


def load_manifest_file(path: str) -> Manifest:
    """A manifest by its file: an export's `manifest.json` or the one beside a graph copy; its
    relative paths are taken from the file's folder."""
    folder = os.path.dirname(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path} is malformed: expected a JSON object, got a {type(data).__name__}; "
                            "export the model again")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        advice = ("it was written by an older exporter (its graphs' inputs differ): export the model again "
                  "with this version's `python -m exporter`" if isinstance(version, int)
                  and version < FORMAT_VERSION else "export the model again with the matching exporter")
        raise ArtifactError(f"{path} has format_version {version!r}; this runtime reads format_version "
                            f"{FORMAT_VERSION}: {advice}")
    if data.get("kv_cache") == RETIRED_KV_MODE:
        raise ArtifactError(f"{folder or '.'}: this export has kv_cache dynamic, which is retired (kv_cache packed does "
                            "the same for every family, form and runtime): export it again with kv_cache: packed in "
                            "its yaml: python -m exporter --config <your yaml>")
    retired = [k for k in data.get("kernels") or [] if k in RETIRED_OP_TYPES]
    if retired:
        raise ArtifactError(f"{folder or '.'}: this export's linear layers run the kernel {retired[0]} "
                            f"({RETIRED_OP_TYPES[retired[0]]}), which is retired: export it again with this version: "
                            "python -m exporter --config <your yaml>")
    _check_keys(data, path)
    try:
        if data.get("kv_cache") not in KV_MODES:
            raise ArtifactError(f"{path}: kv_cache {data.get('kv_cache')!r} is not one of {KV_MODES}")
        missing = [k for k in graph_kinds(data["kv_cache"]) if k not in (data["graphs"] or {})]
        if missing:
            raise ArtifactError(f"{path} is malformed: graphs has no {' or '.join(missing)} entry (kv_cache "
                                f"{data['kv_cache']} needs {', '.join(graph_kinds(data['kv_cache']))}); "
                                "export the model again")
        graphs = {k: GraphEntry.from_json(data["graphs"][k]) for k in graph_kinds(data["kv_cache"])}
        segments = {k: GraphEntry.from_json(v) for k, v in data.get("segments", {}).items()}
        fields = {k: v for k, v in data.items() if k not in ("graphs", "segments", "root", "file")}
        manifest = Manifest(graphs=graphs, segments=segments, root=folder, file=path, **fields)
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path} is malformed: {type(e).__name__}: {e}") from None
    get_family(manifest.family, source=path)
    return manifest


def _check_keys(data: dict, path: str) -> None:
    """Hand-edited manifests: a missing or unknown key named, not a Python error."""
    fields = [f for f in dataclasses.fields(Manifest) if f.name not in ("root", "file")]
    required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in data]
    if missing:
        raise ArtifactError(f"{path} is malformed: it has no {', '.join(missing)} (required keys: "
                            f"{', '.join(required)}); export the model again")
    unknown = sorted(set(data) - {f.name for f in fields})
    if unknown:
        raise ArtifactError(f"{path} is malformed: unknown key {', '.join(unknown)} (allowed keys: "
                            f"{', '.join(sorted(f.name for f in fields))}); export the model again")
