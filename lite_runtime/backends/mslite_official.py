"""Both graphs of one rank through the official `mindspore_lite` Python API (Ascend servers).

Used by `MSLiteSession` when `import mindspore_lite` works. The module object is passed in, so
this file imports neither mindspore_lite nor mindspore itself (tests inject a stand-in).
Call sequence: Context (target ascend: device_id, rank_id, provider "ge" when the ini asks for
GE; target cpu: thread_num) → for `in_graph` exports one ModelGroup(SHARE_WEIGHT) holding both
models, so the increment graph sees the cache the prefill graph wrote → Model.build_from_file
per graph with its ini → get_inputs / predict.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import numpy as np

from lite_runtime.ascend.weight_quant import graph_to_build
from lite_runtime.backends.lite_runners import LiteRunner
from lite_runtime.contract.errors import ArtifactError, UnsupportedError
from lite_runtime.contract.families import GRAPH_KINDS, TensorSpec
from lite_runtime.contract.manifest import Manifest


class OfficialLiteGraphs(LiteRunner):
    def __init__(self, mslite, manifest: Manifest, rank: int, *, config_paths: Dict[str, Optional[str]],
                 use_ge: bool, device_id: int, num_threads: int, target: str,
                 config_dict: Optional[dict] = None):
        self._mslite = mslite
        context = mslite.Context()
        if target == "ascend":
            context.target = ["ascend"]
            context.ascend.device_id = device_id
            context.ascend.rank_id = rank
            if use_ge:
                context.ascend.provider = "ge"
        else:
            context.target = ["cpu"]
            context.cpu.thread_num = num_threads
        self.models = {kind: mslite.Model() for kind in GRAPH_KINDS}
        self.group = None
        if manifest.kv_cache == "in_graph":
            if not hasattr(mslite, "ModelGroup"):
                raise UnsupportedError("kv_cache 'in_graph' needs mindspore_lite's ModelGroup (Lite >= 2.1) to share "
                                       "the cache between the two graphs; install a newer mindspore_lite or "
                                       "export with kv_cache: io")
            self.group = mslite.ModelGroup(mslite.ModelGroupFlag.SHARE_WEIGHT)
            self.group.add_model([self.models[kind] for kind in GRAPH_KINDS])
        for kind, model in self.models.items():
            path = graph_to_build(manifest, kind, rank, target)
            options = {"config_path": config_paths.get(kind) or ""}
            if config_dict:
                options["config_dict"] = config_dict
            try:
                model.build_from_file(path, mslite.ModelType.MINDIR, context, **options)
            except (RuntimeError, ValueError, TypeError) as e:
                raise ArtifactError(f"mindspore_lite cannot build {path}: {e}") from None
        self._inputs = {kind: model.get_inputs() for kind, model in self.models.items()}

    def input_specs(self, kind: str) -> List[TensorSpec]:
        return [TensorSpec(t.name, t.dtype.name.lower(), tuple(int(d) for d in t.shape))
                for t in self._inputs[kind]]

    def run(self, kind: str, feeds: List[np.ndarray]) -> List[np.ndarray]:
        inputs = self._inputs[kind]
        for tensor, array in zip(inputs, feeds):
            tensor.set_data_from_numpy(np.ascontiguousarray(array))
        outputs = self.models[kind].predict(inputs)
        return [t.get_data_to_numpy() for t in outputs]

    def bare_predict(self) -> float:
        """Seconds of one predict call of the increment graph on the inputs as last set."""
        start = time.perf_counter()
        self.models["increment"].predict(self._inputs["increment"])
        return time.perf_counter() - start

    def close(self) -> None:
        self.models, self._inputs, self.group = {}, {}, None
