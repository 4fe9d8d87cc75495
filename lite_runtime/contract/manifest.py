"""The export manifest: the versioned contract between exporter and runtime.

One schema, read and written here only. The runtime trusts nothing else about an export.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from lite_runtime.contract.errors import ArtifactError
from lite_runtime.contract.families import KV_MODES, GRAPH_KINDS, GraphDims, TensorSpec, get_family

FORMAT_VERSION = 2   # 2: graph dimensions stored (graph_dims), any family, tokenizer side files
MANIFEST_NAME = "manifest.json"
GRAPH_FOLDERS = {"prefill": "mindir_full_checkpoint", "increment": "mindir_inc_checkpoint"}


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
    ge_config: Optional[str] = None  # GE config.ini shipped with the export, relative to the folder
    format_version: int = FORMAT_VERSION
    root: str = ""                   # folder the manifest was read from; not serialised

    @property
    def dims(self) -> GraphDims:
        return GraphDims.from_json(self.graph_dims)

    @property
    def vocab_size(self) -> int:
        return int(self.graph_dims["vocab_size"])

    def graph_path(self, kind: str, rank: int) -> str:
        return os.path.join(self.root, self.graphs[kind].files[rank])

    def tokenizer_path(self) -> Optional[str]:
        return os.path.join(self.root, self.tokenizer) if self.tokenizer else None

    def ge_config_path(self) -> Optional[str]:
        return os.path.join(self.root, self.ge_config) if self.ge_config else None

    def to_json(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k not in ("graphs", "root")}
        data["graphs"] = {k: g.to_json() for k, g in self.graphs.items()}
        return data

    def save(self, folder: str) -> None:
        with open(os.path.join(folder, MANIFEST_NAME), "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=2, sort_keys=True)

    def verify_files(self) -> None:
        """Check that every graph file exists and has the recorded hash."""
        for rel, expected in self.sha256.items():
            path = os.path.join(self.root, rel)
            if not os.path.isfile(path):
                raise ArtifactError(f"graph file {path} listed in {self._where()} does not exist")
            if file_sha256(path) != expected:
                raise ArtifactError(f"graph file {path} does not match the sha256 in {self._where()}; "
                                    "the export was modified or damaged: export again")

    def _where(self) -> str:
        return os.path.join(self.root, MANIFEST_NAME)


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_manifest(folder: str) -> Manifest:
    path = os.path.join(folder, MANIFEST_NAME)
    if not os.path.isdir(folder):
        raise ArtifactError(f"export folder {folder} does not exist")
    if not os.path.isfile(path):
        raise ArtifactError(f"{folder} is not an export: it has no {MANIFEST_NAME}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactError(f"cannot read {path}: {e}") from None
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        advice = ("it was written by an older exporter (format 1 did not record graph dimensions): export the "
                  "model again with this version's `python -m exporter`" if isinstance(version, int)
                  and version < FORMAT_VERSION else "export the model again with the matching exporter")
        raise ArtifactError(f"{path} has format_version {version!r}; this runtime reads format_version "
                            f"{FORMAT_VERSION}: {advice}")
    try:
        graphs = {k: GraphEntry.from_json(data["graphs"][k]) for k in GRAPH_KINDS}
        fields = {k: v for k, v in data.items() if k != "graphs"}
        manifest = Manifest(graphs=graphs, root=folder, **fields)
    except (KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path} is malformed: {type(e).__name__}: {e}") from None
    get_family(manifest.family, source=path)
    if manifest.kv_cache not in KV_MODES:
        raise ArtifactError(f"{path}: kv_cache {manifest.kv_cache!r} is not one of {KV_MODES}")
    return manifest
