"""`InferConfig`: the upstream-compatible runtime configuration, validated at construction."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional, Tuple

from lite_runtime.contract.errors import ArtifactError, ConfigError, UnsupportedError
from lite_runtime.contract.families import KV_CACHE_DTYPES
from lite_runtime.contract.manifest import (GRAPH_FOLDERS, MANIFEST_NAME, Manifest, copy_manifest_path, load_manifest,
                                           load_manifest_file)

TARGETS = ("auto", "CPU", "Ascend")


@dataclass
class InferConfig:
    prefill_model_path: str = ""
    increment_model_path: str = ""
    model_type: str = "mindir"
    model_name: str = "common"          # "common": take the family from the export's manifest
    infer_seq_length: Optional[int] = None   # upstream default 1024; None = the export's seq_length
    target: str = "auto"                # auto: Ascend when the official mindspore_lite is present, else CPU
    device_id: int = 0
    rank_id: Optional[int] = None        # None: $RANK_ID (set by the launcher), else 0
    ge_config_path: str = ""            # one ini, or "prefill.ini,increment.ini"
    dynamic: bool = False
    paged_attention: bool = False
    pa_block_size: int = 16
    pa_num_blocks: int = 512
    # Beyond upstream:
    model_dir: str = ""                 # an export folder; replaces the two graph paths
    backend: str = "mslite"
    tokenizer_path: str = ""
    num_threads: int = 2
    kv_cache_dtype: str = KV_CACHE_DTYPES[0]   # what the paged store of an `attention: paged` export holds (mslite)
    kv_cache_gb: Optional[float] = None  # that store's size (default: every row's seq_length, within half the memory)
    int8_activations: bool = False      # `weights: int8` products on int8 activations (AVX512-VNNI; mslite)
    data_parallel: int = 1              # > 1: replicas of the export under the launcher, prompts split in order

    def __init__(self, **kwargs):
        fields = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(kwargs) - set(fields))
        if unknown:
            raise ConfigError(f"InferConfig: unknown keyword {unknown[0]!r}; allowed: {', '.join(fields)}")
        for name, f in fields.items():
            setattr(self, name, kwargs.get(name, f.default))
        if self.rank_id is None:
            self.rank_id = int(os.environ.get("RANK_ID", "0"))
        self._validate()

    def _validate(self) -> None:
        if self.model_type.lower() != "mindir":
            raise UnsupportedError(f"InferConfig: model_type {self.model_type!r} is not supported; allowed: mindir")
        if self.target not in TARGETS:
            raise ConfigError(f"InferConfig: target {self.target!r} is not allowed; allowed: {', '.join(TARGETS)}")
        if self.paged_attention:
            raise UnsupportedError("InferConfig: paged_attention=True is not supported: exports have an io, "
                                   "in-graph or packed KV cache; leave it False")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"InferConfig: kv_cache_dtype {self.kv_cache_dtype!r} is not allowed; allowed: "
                              f"{', '.join(KV_CACHE_DTYPES)}")
        if self.kv_cache_gb is not None and (isinstance(self.kv_cache_gb, bool) or not isinstance(
                self.kv_cache_gb, (int, float)) or not self.kv_cache_gb > 0):
            raise ConfigError(f"InferConfig: kv_cache_gb must be a number of GiB above 0, got {self.kv_cache_gb!r}")
        if self.kv_cache_gb is not None and self.backend != "mslite":
            raise ConfigError(f"InferConfig: kv_cache_gb sizes the paged KV store of backend 'mslite'; backend "
                              f"{self.backend!r} keeps its K/V in host arrays: leave kv_cache_gb unset")
        if not isinstance(self.int8_activations, bool) or (self.int8_activations and self.backend != "mslite"):
            raise ConfigError(f"InferConfig: int8_activations runs the kernels of backend 'mslite' on int8 "
                              f"activations; got {self.int8_activations!r} with backend {self.backend!r} (allowed: "
                              "True with backend 'mslite', or False)")
        if not isinstance(self.data_parallel, int) or isinstance(self.data_parallel, bool) or self.data_parallel < 1:
            raise ConfigError(f"InferConfig: data_parallel must be a positive integer, got {self.data_parallel!r}")
        for name in ("device_id", "rank_id", "num_threads", "infer_seq_length"):
            value = getattr(self, name)
            if name == "infer_seq_length" and value is None:
                continue
            least = 1 if name == "num_threads" else 0
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"InferConfig: {name} must be an integer >= {least}, got {value!r}")
        if not self.model_dir and not (self.prefill_model_path and self.increment_model_path):
            raise ConfigError("InferConfig: give model_dir (an export folder) or both prefill_model_path "
                              "and increment_model_path")

    def load_manifest(self) -> Manifest:
        """The export's manifest, located from model_dir or from the graph paths."""
        if self.model_dir:
            manifest = load_manifest(self.model_dir)
        else:
            for path in (self.prefill_model_path, self.increment_model_path):
                if not os.path.isfile(path):
                    raise ArtifactError(f"graph file {path} does not exist")
            manifest = _graph_manifest(self.prefill_model_path, self.increment_model_path)
            for kind, path in (("prefill", self.prefill_model_path), ("increment", self.increment_model_path)):
                expected = manifest.graph_path(kind, self.rank_id)
                if os.path.realpath(expected) != os.path.realpath(path):
                    raise ConfigError(f"InferConfig: {kind}_model_path {path} is not the {kind} graph of rank "
                                      f"{self.rank_id} of its export ({expected})")
        if self.dynamic:
            manifest.require_packed("InferConfig: dynamic=True", ConfigError)
        if self.infer_seq_length not in (None, manifest.seq_length):
            raise ConfigError(f"InferConfig: infer_seq_length {self.infer_seq_length} differs from the export's "
                              f"seq_length {manifest.seq_length}; graphs have static shapes: export again")
        return manifest

    def ge_config_files(self, manifest: Manifest) -> Tuple[Optional[str], Optional[str]]:
        """(prefill ini, increment ini): the `a.ini,b.ini` pair, one ini for both, or the export's."""
        if self.ge_config_path:
            parts = [p.strip() for p in self.ge_config_path.split(",")]
            if len(parts) > 2 or not all(parts):
                raise ConfigError(f"ge_config_path {self.ge_config_path!r}: give one ini or 'prefill.ini,increment.ini'")
            return parts[0], parts[-1]
        shipped = manifest.ge_config_path()
        return shipped, shipped


def _graph_manifest(prefill_path: str, increment_path: str) -> Manifest:
    """The manifest of two graph paths: the one the exporter writes beside its copies of the graphs
    (upstream `infer.prefill_model_path` ...), else that of the export folder holding them."""
    for path in (prefill_path, increment_path):
        if os.path.isfile(copy_manifest_path(path)):
            return load_manifest_file(copy_manifest_path(path))
    return load_manifest(_export_root(prefill_path))


def _export_root(graph_path: str) -> str:
    """`<export>/mindir_full_checkpoint/rank_0_graph.mindir` -> `<export>`."""
    folder = os.path.dirname(os.path.abspath(graph_path))
    for candidate in (folder, os.path.dirname(folder)):
        if os.path.isfile(os.path.join(candidate, MANIFEST_NAME)):
            return candidate
    raise ArtifactError(f"no {MANIFEST_NAME} found beside {graph_path} (nor {copy_manifest_path(graph_path)}): the "
                        f"runtime needs a whole export folder written by `python -m exporter` ({MANIFEST_NAME} with "
                        f"{'/ and '.join(GRAPH_FOLDERS.values())}/), or graph copies the exporter wrote for "
                        "infer.prefill_model_path / increment_model_path")
