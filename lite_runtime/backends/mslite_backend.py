"""The `mslite` backend: MindSpore Lite, without mindspore in the process.

Two ways to reach Lite:
- the official `mindspore_lite` Python package when it imports (Ascend servers; GE provider,
  config.ini, ModelGroup for `in_graph` exports): `mslite_official.py`;
- otherwise the project's ctypes binding to Lite 2.0's C++ libraries (`lite_native.py`, CPU).
  Lite keeps no state between calls there, so `kv_cache: io` and `packed` exports run,
  the host owning the cache (base.py) and Lite reading its arrays in place.
`MSLiteSession` checks the export, picks one runner for it at load (lite_runners.py: native
static graphs, the native step graph, the segment chain, or the official API) and delegates.
"""
from __future__ import annotations

import logging
import os
import re
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from lite_runtime.contract.errors import ArtifactError, ConfigError, UnsupportedError
from lite_runtime.contract.families import GRAPH_KINDS, KV_CACHE_DTYPES, STEP, graph_kinds
from lite_runtime.ascend.ge_config import GeConfig, read_ge_config, split_config_paths
from lite_runtime.ascend.weight_quant import by_converter
from lite_runtime.contract.graph_check import check_graph_inputs, collectives_in
from lite_runtime.contract.manifest import Manifest
from lite_runtime.contract.mindir import FIRST_UNREADABLE_MINDSPORE
from lite_runtime.backends import lite_kernels
from lite_runtime.backends.base import Session, require_kv_mode
from lite_runtime.backends.paged_cache import PagedKVCache
from lite_runtime.backends.lite_memory import check_load_memory
from lite_runtime.backends.lite_native import MINDIR_VERSION_ADVICE, LiteModel, kernel_types, shim_path
from lite_runtime.backends.lite_runners import LiteRunner, NativeStaticGraphs, NativeStepGraph

log = logging.getLogger("lite_runtime.mslite")

LITE_VERSION = "2.0.0"                # the wheel lite-setup installs (lite_install.py)
LITE_MAX_MIND_IR_VERSION = 1          # Lite 2.0 reads mind_ir_version 1 (MindSpore 2.0); 2.10 writes 3
TARGETS = ("cpu", "ascend")   # and "auto"
LITE_FORMATS = ("auto", "ms", "mindir")
_ge_notice_logged = False


def official_module():
    """The official `mindspore_lite` package, or None when it is not installed (CPU machines)."""
    try:
        import mindspore_lite
    except ImportError:
        return None
    return mindspore_lite


def check_mindir_readable(manifest: Manifest) -> None:
    """Refuse, before loading, an export whose MindIR Lite 2.0 cannot read (native path)."""
    where = f"{manifest.root or 'the export'} (manifest.json)"
    version = str(manifest.mindir_version).strip()
    if version.isdigit() and int(version) > LITE_MAX_MIND_IR_VERSION:
        raise UnsupportedError(f"{where} holds MindIR version {version}, written by MindSpore "
                               f"{manifest.mindspore_version}; MindSpore Lite 2.0 reads up to version "
                               f"{LITE_MAX_MIND_IR_VERSION}. {MINDIR_VERSION_ADVICE}")
    found = re.match(r"(\d+)\.(\d+)", str(manifest.mindspore_version))
    if found and (int(found.group(1)), int(found.group(2))) >= FIRST_UNREADABLE_MINDSPORE:
        raise UnsupportedError(f"{where} was exported by MindSpore {manifest.mindspore_version}; MindSpore Lite "
                               f"2.0 cannot read MindIR of MindSpore >= 2.7. {MINDIR_VERSION_ADVICE}")


def check_kernels(manifest: Manifest) -> None:
    """Refuse, before any Build, an export whose graphs run project kernels this runtime lacks."""
    missing = [k for k in getattr(manifest, "kernels", []) if k not in kernel_types()]
    if missing:
        where = f"{manifest.root or 'the export'} (manifest.json)"
        raise UnsupportedError(f"{where} needs the project's Lite kernels {', '.join(missing)}, which this runtime "
                               f"lacks (no liblite_kernels.so beside the shim {shim_path() or '(none)'}, or an older "
                               "one): run `lite-setup` again")


def kernel_threads(manifest: Manifest, num_threads: int) -> int:
    """The thread count of Lite's contexts for this export. Where the project's kernels run every large
    product (`head_on_kernel`), they take the `num_threads` and Lite runs the small ops between them on
    one: Lite's workers spin through a whole graph run and would compete with the kernels for the cores
    (docs/measured-choices.md)."""
    if not manifest.quantization.get("head_on_kernel"):
        return num_threads
    lite_kernels.set_threads(num_threads)
    return 1


def read_configs(config_path: Optional[str]) -> Dict[str, Optional[GeConfig]]:
    """`a.ini` (both graphs) or `a.ini,b.ini` (prefill, increment), validated; {} entries are None."""
    if not config_path:
        return {kind: None for kind in GRAPH_KINDS}
    paths = split_config_paths([config_path])
    if len(paths) not in (1, 2):
        raise ConfigError(f"config_path {config_path!r} names {len(paths)} files; allowed: one ini for both "
                          "graphs, or 'prefill.ini,increment.ini'")
    configs = [read_ge_config(p) for p in paths]
    return dict(zip(GRAPH_KINDS, configs * 2 if len(configs) == 1 else configs))


def _log_ge_ignored(configs: Sequence[GeConfig]) -> None:
    global _ge_notice_logged
    sections = sorted({s for c in configs for s in c.ge_only_sections()})
    if sections and not _ge_notice_logged:
        _ge_notice_logged = True
        log.warning("MindSpore Lite on CPU ignores the GE sections %s of %s",
                    ", ".join(f"[{s}]" for s in sections), ", ".join(sorted({c.path for c in configs})))


class MSLiteSession(Session):
    backend_name = "mslite"

    def __init__(self, manifest: Manifest, rank: int = 0, *, config_path: Optional[str] = None,
                 device_id: int = 0, num_threads: int = 2, target: str = "cpu",
                 config_dict: Optional[dict] = None, lite_format: str = "auto", kv_cache_dtype: str = KV_CACHE_DTYPES[0],
                 kv_cache_gb: Optional[float] = None, int8_activations: bool = False):
        """`config_path`: one ini, or 'prefill.ini,increment.ini'; default: the export's own ini, if any.
        `config_dict` ({section: {key: value}}) overrides ini entries (official API only).
        `lite_format` (CPU): 'auto' loads the export's .ms models when it has them (`lite_ms: true`),
        else the MindIR; 'ms' or 'mindir' insist on one. `kv_cache_dtype`: float32 or float16, what the paged
        store of an `attention: paged` export holds; `kv_cache_gb`: its size (default: every row's seq_length,
        within half the memory available). `int8_activations`: the products of `weights: int8` (in groups of 32)
        on activations quantized to int8 alike, as llama.cpp's Q8_0 computes them (AVX512-VNNI; for the process)."""
        if lite_format not in LITE_FORMATS:
            raise ConfigError(f"lite_format {lite_format!r} is not allowed; allowed: {', '.join(LITE_FORMATS)}")
        if lite_format == "mindir" and manifest.lite_files and not manifest.mindir_kept and not all(
                os.path.isfile(manifest.graph_path(kind, rank)) for kind in manifest.lite_files if kind in manifest.graphs):
            raise ArtifactError(f"{manifest.root}: lite_format 'mindir' needs the export's MindIR, which target cpu "
                                "does not keep beside its .ms models; load the .ms (lite_format 'auto'), or export "
                                "with lite_ms: true and no target to keep both")
        target = str(target).lower()
        if target == "auto":   # Ascend where the official package (an Ascend server's) is present
            target = "ascend" if official_module() is not None else "cpu"
        if target not in TARGETS:
            raise ConfigError(f"target {target!r} is not supported by backend 'mslite'; allowed: {', '.join(TARGETS)}")
        if config_path is None and getattr(manifest, "ge_config_path", None):
            config_path = manifest.ge_config_path()
        q = manifest.quantization
        if int8_activations and (q.get("weights") != "int8" or q.get("group_size") != 32):
            stored = f"weights {q.get('weights') or 'none'}" + (f", group_size {q['group_size']}" if "group_size" in q
                                                               else "")
            raise ConfigError(f"int8_activations runs the products of `quantization: {{weights: int8}}` in groups of "
                              f"32 on int8 activations; {manifest.root} has {stored}: leave it off")
        configs = read_configs(config_path)
        paths = {kind: c.path if c else None for kind, c in configs.items()}
        present = [c for c in configs.values() if c is not None]
        mslite = official_module()
        if target == "cpu":   # every Lite load on CPU: refused in one line when it would not fit (lite_memory.py)
            check_load_memory(manifest, rank, "mindir" if mslite is not None else lite_format)
        super().__init__(manifest, rank)
        if isinstance(self.cache, PagedKVCache):
            self.cache.configure(kv_cache_dtype, None if kv_cache_gb is None else kv_cache_gb * 2 ** 30)
        elif kv_cache_gb is not None:
            kept = "in host arrays" if manifest.kv_cache == "packed" else f"as kv_cache {manifest.kv_cache!r}"
            raise ConfigError(f"kv_cache_gb sizes the paged KV store of an export with attention: paged (target "
                              f"cpu); {manifest.root} keeps its K/V {kept}: leave kv_cache_gb unset")
        start = time.perf_counter()
        if mslite is not None:
            log.info("mslite: using the official mindspore_lite package (target %s)", target)
            for config in present if target == "ascend" else ():
                config.check_runnable(manifest.world_size)
            self._runner = self._load_official(mslite, paths, present, device_id, num_threads, target, config_dict)
            self.runtime = (f"MindSpore Lite {getattr(mslite, '__version__', '?')} (official API) {target}"
                            + (f", {num_threads} threads" if target == "cpu" else f", device {device_id}"))
        else:
            if target != "cpu":
                raise UnsupportedError(f"target {target!r} needs the mindspore_lite package of an Ascend server, "
                                       "which does not import here; use target='cpu'")
            if config_dict:
                raise UnsupportedError("config_dict needs the official mindspore_lite package; on CPU put the "
                                       "settings in the config.ini")
            self._runner = self._load_native(paths, present, num_threads, lite_format)
            if self.manifest.kernels:
                self._int8_activations(int8_activations)
            self.runtime = f"MindSpore Lite {LITE_VERSION} CPU (native binding), {num_threads} threads" + \
                (", int8 activations" if int8_activations else "")
        self.load_seconds = time.perf_counter() - start

    def _int8_activations(self, on: bool) -> None:
        """The kernels' products on int8 activations (or not: the process's setting follows each load)."""
        if lite_kernels.set_int8_activations(on) != on:
            raise UnsupportedError(f"int8_activations needs a CPU with AVX512-VNNI (the kernels here run their "
                                   f"{lite_kernels.isa()} loops): leave it off")

    # --- loading: the runner for this export --------------------------------------------------
    def _load_official(self, mslite, paths, present, device_id, num_threads, target, config_dict) -> LiteRunner:
        require_kv_mode(self.manifest, "mslite (official API)", ("io", "in_graph"))
        if self.manifest.kernels:
            raise UnsupportedError(f"this export's graphs run nodes of the project's Lite kernels "
                                   f"({', '.join(self.manifest.kernels)}), which the official mindspore_lite "
                                   "package cannot load; run it on CPU with the native binding (lite-setup)")
        if self.manifest.collectives == "host":
            raise UnsupportedError("this export holds step segments for MindSpore Lite on CPU (parallel.collectives: "
                                   "host); on Ascend export with collectives: graph (HCCL in the rank graphs)")
        from lite_runtime.backends.mslite_official import OfficialLiteGraphs
        use_ge = any(c.provider == "ge" for c in present)
        graphs = OfficialLiteGraphs(mslite, self.manifest, self.rank, config_paths=paths, use_ge=use_ge,
                                    device_id=device_id, num_threads=num_threads, target=target,
                                    config_dict=config_dict)
        for kind in GRAPH_KINDS:
            check_graph_inputs(graphs.input_specs(kind), self.manifest.graphs[kind].inputs,
                               self.manifest.graph_path(kind, self.rank))
        return graphs

    def _load_native(self, paths, present, num_threads, lite_format) -> LiteRunner:
        m = self.manifest
        require_kv_mode(m, "mslite (CPU)", ("io", "packed"))
        if m.compute_dtype == "float16" and m.kv_cache == "packed":
            raise UnsupportedError(f"{m.root} computes in float16 with kv_cache {m.kv_cache}: MindSpore Lite 2.0 "
                                   "on CPU fails to run such step graphs (Predict: Common error code); export with "
                                   "compute_dtype float32, or kv_cache io for float16 on CPU")
        if m.world_size > 1 and m.collectives != "host":
            raise UnsupportedError(f"this export has {m.world_size} ranks with collectives in their graphs; MindSpore "
                                   "Lite on CPU has none. Export with parallel.collectives: host (kv_cache packed) "
                                   "for Lite on CPU, or run it with backend 'ms' (CPU) or mslite on Ascend")
        check_mindir_readable(m)
        check_kernels(m)
        if by_converter(m):
            log.warning("%s: its int8 weights are Lite's converter's, on Ascend; on CPU its float graphs run", m.root)
        _log_ge_ignored(present)
        num_threads = kernel_threads(m, num_threads)
        if m.collectives == "host":
            from lite_runtime.backends.segment_chain import SegmentChain
            from lite_runtime.distributed.host_collectives import from_env
            return SegmentChain(m, self.rank, lambda name: self._open(
                m.segment_path(name, self.rank), m.lite_path(name, self.rank), paths["increment"], num_threads,
                lite_format), from_env(self.rank, m.world_size))
        models: Dict[str, LiteModel] = {}
        for kind in graph_kinds(m.kv_cache):
            path = m.graph_path(kind, self.rank)
            models[kind] = self._open(path, m.lite_path(kind, self.rank), paths.get(kind, paths["increment"]),
                                      num_threads, lite_format)
            check_graph_inputs(models[kind].inputs, m.graphs[kind].inputs, path)
        if m.kv_cache == "packed":
            return NativeStepGraph(models[STEP], m)
        return NativeStaticGraphs(models, m, self.cache.arrays)

    def _open(self, path: str, lite: Optional[str], ini: Optional[str], num_threads: int, lite_format: str) -> LiteModel:
        """A graph (its .ms form when the export has one and lite_format allows), never one holding
        collectives: Lite 2.0 CPU drops AllReduce with a warning and returns one rank's partial sums.
        A .ms is not scanned (reading the whole MindIR beside it is a large part of a load: docs/measured-choices.md):
        the exporter converts only graphs without collectives (the schema refuses lite_ms for others)."""
        if lite_format == "ms" and not lite:
            raise UnsupportedError(f"{self.manifest.root or 'the export'} has no .ms models; export with "
                                   "lite_ms: true, or use lite_format 'auto' or 'mindir'")
        use_ms = bool(lite) and lite_format != "mindir"
        found = [] if use_ms else collectives_in(path)
        if found:
            raise UnsupportedError(f"{path} contains collective operators ({', '.join(found)}) that MindSpore "
                                   "Lite on CPU cannot execute (it would silently return one rank's partial "
                                   "results); run it with backend 'ms' under the launcher, or with mslite "
                                   "on Ascend, or export with parallel.collectives: host")
        return LiteModel(lite if use_ms else path, ini, num_threads)

    # --- running: delegated to the runner -------------------------------------------------------
    def _run(self, kind: str, feeds: List[np.ndarray]) -> List[np.ndarray]:
        return self._runner.run(kind, feeds)

    def bare_decode_predict(self) -> float:
        """Seconds of one bare Predict of the decode graph (every segment of a segment export) on the
        inputs as bound now: the results are discarded, the cache is unchanged."""
        return self._runner.bare_predict()

    @property
    def collective_seconds(self) -> float:
        """Seconds in host collectives between step segments (a segment export's ranks), else 0."""
        return self._runner.collective_seconds

    @property
    def lite_models(self) -> Dict[str, LiteModel]:
        """The native LiteModel per graph kind, or per segment of a segment export ({} on the official path)."""
        return self._runner.lite_models

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        if isinstance(self.cache, PagedKVCache):
            self.cache.close()
