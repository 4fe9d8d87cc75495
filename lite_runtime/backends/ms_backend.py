"""The `ms` backend: MindSpore's own MindIR executor (`mindspore.load` + `nn.GraphCell`).

Runs both kv modes. In `in_graph` mode each graph holds its cache as Parameters; the prefill
graph's cache is handed to the increment graph once per request. Also the CPU engine of
multi-rank runs, where `mindspore.communication.init()` must run before any graph with
collectives is loaded.
"""
from __future__ import annotations

import logging
import os
import re
from typing import List, Optional, Tuple

import numpy as np

from lite_runtime.contract.errors import ArtifactError, UnsupportedError
from lite_runtime.contract.families import graph_kinds
from lite_runtime.contract.graph_check import check_graph_inputs
from lite_runtime.contract.mindir import cpu_graph_mode, read_mindir
from lite_runtime.contract.manifest import Manifest
from lite_runtime.backends.base import Session

log = logging.getLogger("lite_runtime.ms")
# Exports of MindSpore older than this are the Lite-compatible ones (mslite_backend: Lite 2.0 refuses newer MindIR).
LITE_COMPATIBLE_BELOW = (2, 7)


class MSSession(Session):
    backend_name = "ms"

    def __init__(self, manifest: Manifest, rank: int = 0, *, num_threads: int = 2, **_ignored):
        super().__init__(manifest, rank)
        if manifest.collectives == "host":
            where = " under the launcher" if manifest.world_size > 1 else ""
            raise UnsupportedError("this export holds step segments for MindSpore Lite on CPU (parallel.collectives: "
                                   f"host); run it with backend 'mslite'{where}, or export with "
                                   "collectives: graph for backend 'ms'")
        if manifest.kernels:
            raise UnsupportedError(f"this export's graphs hold Custom nodes ({', '.join(manifest.kernels)}) that "
                                   "only the project's kernels on MindSpore Lite run; use backend 'mslite', or export "
                                   "without quantization and with attention: graph")
        try:
            import mindspore as ms
        except ImportError:
            raise UnsupportedError("backend 'ms' needs the mindspore package, which is not installed here; "
                                   "install mindspore or use backend='mslite'") from None
        _check_exporting_version(manifest, ms.__version__)
        from mindspore import nn
        self._ms = ms
        self.runtime = f"MindSpore {ms.__version__} GraphCell (CPU)"
        cpu_graph_mode(ms)
        if manifest.world_size > 1:
            _require_cluster(manifest)
        self._cells = {}
        for kind in graph_kinds(manifest.kv_cache):
            path = manifest.graph_path(kind, rank)
            inputs = read_mindir(path).inputs
            check_graph_inputs(inputs, manifest.graphs[kind].inputs, path)
            try:
                self._cells[kind] = nn.GraphCell(ms.load(path))
            except (RuntimeError, ValueError, TypeError) as e:
                raise ArtifactError(
                    f"MindSpore {ms.__version__} cannot load {path} (written by MindSpore "
                    f"{manifest.mindspore_version}, MindIR version {manifest.mindir_version}): "
                    f"{str(e).strip().splitlines()[0]}; for backend 'ms' export with MindSpore {ms.__version__} "
                    "(the .venv environment); MindSpore 2.0 exports are for backend 'mslite'") from None
        self._cache_params = []
        if manifest.kv_cache == "in_graph":
            src = self._cells["prefill"].parameters_dict()
            dst = self._cells["increment"].parameters_dict()
            self._cache_params = [(src[n], dst[n]) for n in src if n.endswith(("key_cache", "value_cache"))]

    def prefill(self, input_ids: np.ndarray, valid_length: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        logits = super().prefill(input_ids, valid_length, *extra)
        for src, dst in self._cache_params:
            dst.set_data(src)
        return logits

    def _run(self, kind: str, feeds: List[np.ndarray]) -> List[np.ndarray]:
        Tensor = self._ms.Tensor
        out = self._cells[kind](*[Tensor(f) for f in feeds])
        if isinstance(out, (tuple, list)):
            return [o.asnumpy() for o in out]
        return [out.asnumpy()]


def _major_minor(version: str) -> Optional[Tuple[int, int]]:
    found = re.match(r"(\d+)\.(\d+)", str(version))
    return (int(found.group(1)), int(found.group(2))) if found else None


def _check_exporting_version(manifest: Manifest, running: str) -> None:
    """MindSpore runs the MindIR of its own release: a MindSpore 2.0 graph (the Lite-compatible
    export) fails deep inside MindSpore 2.10's graph compiler ("Got null AbstractBasePtr ...
    primitive Add"), so refuse before loading, naming the environment that writes the right one."""
    written, here = _major_minor(manifest.mindspore_version), _major_minor(running)
    if written is None or here is None or written == here:
        return
    where = f"the export {manifest.root or '.'}"
    if written < LITE_COMPATIBLE_BELOW <= here:
        raise UnsupportedError(
            f"{where} was written by MindSpore {manifest.mindspore_version} for MindSpore Lite (MindIR version "
            f"{manifest.mindir_version}); backend ms runs MindIR of the MindSpore it has ({running}): export with "
            "the .venv environment (`make export CONFIG=...`) for backend ms, or run this export with backend mslite")
    raise UnsupportedError(
        f"{where} was written by MindSpore {manifest.mindspore_version}; backend ms here has MindSpore {running} and "
        f"runs MindIR of its own release only: export again with MindSpore {running} for backend ms")


def join_cluster() -> None:
    """`mindspore.communication.init()` in a rank the launcher started. init() sets RANK_ID to the rank
    in the cluster, which with data parallel is the rank in the replica: RANK_ID stays the job's."""
    from mindspore.communication import init
    job_rank = os.environ.get("RANK_ID")
    init()
    if job_rank is not None:
        os.environ["RANK_ID"] = job_rank


def _require_cluster(manifest: Manifest) -> None:
    """Graphs with collectives crash a process that has no communication group (notes). In a job
    started by the launcher (MS_ROLE is set) the group is joined here, so `pipeline()` just works."""
    from mindspore.communication import GlobalComm, get_group_size
    if not GlobalComm.INITED and os.environ.get("MS_ROLE") == "MS_WORKER":
        join_cluster()
    try:
        size = get_group_size() if GlobalComm.INITED else None
    except (RuntimeError, ValueError):
        size = None
    if size != manifest.world_size:
        raise UnsupportedError(
            f"this export has {manifest.world_size} ranks and must run inside a launched job of "
            f"{manifest.world_size} processes (python -m lite_runtime.cli.launch ...); "
            f"this process is in a group of {size or 'no'} ranks")
