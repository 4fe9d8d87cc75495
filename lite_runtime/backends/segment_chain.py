"""One rank's dynamic step run as segments (lite_runtime/contract/segments.py) with MindSpore Lite
on CPU, the all-reduces and the vocabulary gather done on the host in between.

The hidden state lives in one host buffer that every layer segment reads in place; each segment's
partial sum is all-reduced into a scratch buffer and added to it. Inputs are bound once per shape
(T new tokens, P cache positions) and rebound only when the shapes or the cache arrays change.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List

import numpy as np

from lite_runtime.backends.lite_native import LiteModel
from lite_runtime.contract.graph_check import check_graph_inputs
from lite_runtime.contract.manifest import Manifest
from lite_runtime.contract.segments import segment_names, segment_specs


class SegmentChain:
    def __init__(self, manifest: Manifest, rank: int, open_model: Callable[[str], LiteModel], collectives):
        self.manifest, self.dims = manifest, manifest.dims
        self.collectives = collectives
        self.names = segment_names(self.dims.num_layers)
        self.models: Dict[str, LiteModel] = {}
        for name in self.names:
            self.models[name] = model = open_model(name)
            check_graph_inputs(model.inputs, manifest.segments[name].inputs, manifest.segment_path(name, rank))
        self._shape = None
        self._caches: List[np.ndarray] = []
        self.collective_seconds = 0.0      # time in host collectives (waiting for the other ranks included)

    def run(self, feeds: List[np.ndarray]) -> List[np.ndarray]:
        """The step's contract: feeds input_ids (B, T), batch_valid_length, past_length, then the
        caches; returns logits (B, vocab) and the new keys and values of every layer."""
        ids, lengths, past_length, *caches = feeds
        shape = (np.shape(ids)[1], caches[1].shape[2])
        if shape != self._shape:
            self._resize(*shape, caches)
        for bound, given in zip(self._ids, (ids, lengths, past_length)):
            np.copyto(bound, given, casting="same_kind")
        first_cache = len(self._state)
        for i, (bound, given) in enumerate(zip(self._caches, caches)):
            if given is not bound:                       # a new request's cache at the same shape
                self.models[f"layer{i // 2}.attn"].bind_input(first_cache + i % 2, given)
                self._caches[i] = given
        for buffer, result in zip(self._state, self.models["embed"].predict()):
            np.copyto(buffer, result)
        x, new_kv = self._state[0], []
        for layer in range(self.dims.num_layers):
            part, key, value = self.models[f"layer{layer}.attn"].predict()
            x += self._all_reduce(part)
            new_kv += [key, value]
            (part,) = self.models[f"layer{layer}.mlp"].predict()
            x += self._all_reduce(part)
        (part,) = self.models["head"].predict()
        start = time.perf_counter()
        logits = self.collectives.all_gather_last(part, self._gathered, self._logits)
        self.collective_seconds += time.perf_counter() - start
        return [logits] + new_kv

    def _all_reduce(self, part: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        self.collectives.all_reduce(part, self._reduced)
        self.collective_seconds += time.perf_counter() - start
        return self._reduced

    def _resize(self, steps: int, positions: int, caches: List[np.ndarray]) -> None:
        specs = segment_specs(self.dims, self.manifest.world_size, steps, positions)
        self._ids = [np.zeros(s.shape, s.dtype) for s in specs["head"][0][1:]]       # ids, lengths, past_length
        self._state = [np.zeros(s.shape, s.dtype) for s in specs["embed"][1]]    # hidden, [cos, sin,] past
        self._reduced = np.zeros_like(self._state[0])
        logits_part = specs["head"][1][0].shape
        self._gathered = np.zeros((self.manifest.world_size,) + logits_part, np.float32)
        self._logits = np.zeros((logits_part[0], self.dims.vocab_size), np.float32)   # reused by every call
        self._caches = list(caches)
        for name in self.names:
            inputs, outputs = specs[name]
            self.models[name].resize([s.shape for s in inputs], [s.shape for s in outputs])
        self.models["embed"].bind_inputs([self._ids[0], self._ids[2]])
        for layer in range(self.dims.num_layers):
            self.models[f"layer{layer}.attn"].bind_inputs(self._state + caches[2 * layer:2 * layer + 2])
            self.models[f"layer{layer}.mlp"].bind_inputs(self._state[:1])
        self.models["head"].bind_inputs(self._state[:1] + self._ids)
        self._shape = (steps, positions)

    def bare_predict(self) -> float:
        """Seconds of one Predict of every segment on the inputs as bound now, no host work between
        (what Lite's compute costs; the results are discarded, the cache is unchanged)."""
        start = time.perf_counter()
        for name in self.names:
            self.models[name].run()
        return time.perf_counter() - start

    def close(self) -> None:
        for model in self.models.values():
            model.close()
        self.models = {}
        self.collectives.close()
