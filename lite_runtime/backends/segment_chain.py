"""One rank's packed step run as segments (lite_runtime/contract/segments.py) with
MindSpore Lite on CPU, the all-reduces and the vocabulary gather done on the host in between.

The chain is driven by the manifest's segment specs alone: what it does with each tensor follows
from its name (the contract's rules), so no family is known here. Every segment input other than
the caches is one host buffer of its name (the step's own inputs, the hidden state, state made by
earlier segments), which Lite reads in place; each segment's partial sum is all-reduced into a
scratch buffer and added to the hidden state (one rank's groups of whole layers return the hidden
state itself). Inputs are bound once per shape (N tokens, P cache positions, L picked) and rebound only
when the shapes or the cache arrays change.
"""
from __future__ import annotations

import collections
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Tuple

import numpy as np

from lite_runtime.backends.lite_native import LiteModel
from lite_runtime.backends.lite_runners import LiteRunner
from lite_runtime.contract.errors import ArtifactError
from lite_runtime.contract.families import STEP
from lite_runtime.contract.graph_check import check_graph_inputs
from lite_runtime.contract.manifest import Manifest
from lite_runtime.contract.segments import (CACHE_INPUTS, HIDDEN, LOGITS_PART, NEW_CACHE, PAGED_INPUTS, PARTIAL_SUMS,
                                            RESIDUAL, call_shape, run_order)

BUILDERS = 2
_PART, _RESIDUAL, _NEW, _LOGITS, _STATE = range(5)     # what the host does with a segment's output


def _role(name: str) -> int:
    if name in PARTIAL_SUMS:
        return _PART
    if name == RESIDUAL:
        return _RESIDUAL
    if name in NEW_CACHE:
        return _NEW
    return _LOGITS if name == LOGITS_PART else _STATE


def _check_paged_readers(manifest: Manifest, cache_inputs: List[Tuple[str, int, int]]) -> None:
    """Each segment that reads the paged store reads both its feeds (checked before any Build)."""
    reads = collections.Counter(name for name, _, _ in cache_inputs)
    partial = sorted(name for name, count in reads.items() if count != len(PAGED_INPUTS))
    if not reads or partial:
        which = f"segment {', '.join(partial)} reads only one of them" if partial else "no segment reads them"
        raise ArtifactError(f"{manifest.file or 'the manifest'}: a paged export's attention segments read "
                            f"{' and '.join(PAGED_INPUTS)}, but {which}; export again")


class SegmentChain(LiteRunner):
    def __init__(self, manifest: Manifest, rank: int, open_model: Callable[[str], LiteModel], collectives):
        self.manifest, self.dims = manifest, manifest.dims
        self.collectives = collectives
        self.names = run_order(manifest.segments)
        # where the step's cache feeds go: (segment, input index, feed index). Host arrays: a key and a value array
        # a layer, in the order of the segments and their inputs; the paged store: its tables and id, to every
        # attention segment
        self._paged = bool(self.dims.kv_block)
        names = PAGED_INPUTS if self._paged else CACHE_INPUTS
        self._cache_inputs: List[Tuple[str, int, int]] = []
        for name in self.names:
            for i, spec in enumerate(manifest.segments[name].inputs):
                if spec.name in names:
                    feed = names.index(spec.name) if self._paged else len(self._cache_inputs)
                    self._cache_inputs.append((name, i, feed))
        feeds = len(PAGED_INPUTS) if self._paged else 2 * self.dims.num_layers
        if not self._paged and len(self._cache_inputs) != feeds:
            raise ArtifactError(f"{manifest.file or 'the manifest'}: its segments read {len(self._cache_inputs)} "
                                f"caches but the model has {self.dims.num_layers} layers (2 each); export again")
        if self._paged:
            _check_paged_readers(manifest, self._cache_inputs)
        # Two Builds at a time: each is mostly copying and page faults, which a second core overlaps
        # (docs/measured-choices.md).
        with ThreadPoolExecutor(BUILDERS) as pool:
            self._models: Dict[str, LiteModel] = dict(zip(self.names, pool.map(open_model, self.names)))
        for name, model in self._models.items():
            check_graph_inputs(model.inputs, manifest.segments[name].inputs, manifest.segment_path(name, rank))
        self._roles = {name: [_role(s.name) for s in manifest.segments[name].outputs] for name in self.names}
        self._step_names = [s.name for s in manifest.graphs[STEP].inputs[:-feeds]]
        self._shape = None
        self._caches: List[np.ndarray] = []
        self.collective_seconds = 0.0      # time in host collectives (waiting for the other ranks included)

    @property
    def lite_models(self) -> Dict[str, LiteModel]:
        return dict(self._models)

    def run(self, kind: str, feeds: List[np.ndarray]) -> List[np.ndarray]:
        """The step's contract (families.py; `kind` is the step): feeds its inputs (input_ids (N,)
        first), the caches (or the paged store's tables and id) last; returns logits (L, vocab) and the new keys
        and values of every layer (none with the paged store: its nodes wrote them)."""
        given, caches = feeds[:len(self._step_names)], feeds[len(self._step_names):]
        picks = len(given[self._step_names.index("last_token")])
        shape = (len(given[0]), 0 if self._paged else caches[1].shape[2], picks)     # (N, P, L)
        if shape != self._shape:
            self._resize(*shape, caches)
        for name, array in zip(self._step_names, given):
            if name in self._buffers:
                np.copyto(self._buffers[name], array, casting="same_kind")
        for i, (name, index, feed) in enumerate(self._cache_inputs):
            if caches[feed] is not self._caches[i]:          # a new request's cache at the same shape
                self._models[name].bind_input(index, caches[feed])
                self._caches[i] = caches[feed]
        hidden, new_kv, logits = self._buffers[HIDDEN], [], None
        for name in self.names:
            part = residual = None
            for role, spec, result in zip(self._roles[name], self.manifest.segments[name].outputs,
                                          self._models[name].predict()):
                if role == _PART:
                    part = result
                elif role == _RESIDUAL:
                    residual = result
                elif role == _NEW:
                    new_kv.append(result)
                elif role == _LOGITS:
                    logits = self._gather(result)
                elif spec.name in self._buffers:
                    np.copyto(self._buffers[spec.name], result)
            if part is not None:
                reduced = self._all_reduce(part)
                if residual is None:
                    hidden += reduced
                else:
                    np.add(residual, reduced, out=hidden)
        return [logits] + new_kv

    def _all_reduce(self, part: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        reduced = self.collectives.all_reduce(part, self._reduced)
        self.collective_seconds += time.perf_counter() - start
        return reduced

    def _gather(self, part: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        logits = self.collectives.all_gather_last(part, self._gathered, self._logits)
        self.collective_seconds += time.perf_counter() - start
        return logits

    def _resize(self, tokens: int, positions: int, picks: int, caches: List[np.ndarray]) -> None:
        shape = lambda spec: call_shape(spec, tokens, positions, picks)
        segments = [self.manifest.segments[name] for name in self.names]
        self._buffers = {s.name: np.zeros(shape(s), s.dtype)
                         for entry in segments for s in entry.inputs if s.name not in CACHE_INPUTS + PAGED_INPUTS}
        self._reduced = np.zeros_like(self._buffers[HIDDEN])
        logits_part = next(shape(s) for entry in segments for s in entry.outputs if s.name == LOGITS_PART)
        self._gathered = np.zeros((self.manifest.world_size,) + logits_part, np.float32)
        self._logits = np.zeros((logits_part[0], self.dims.vocab_size), np.float32)   # reused by every call
        self._caches = [caches[feed] for _, _, feed in self._cache_inputs]
        cache_of = {(name, i): caches[feed] for name, i, feed in self._cache_inputs}
        for name, entry in zip(self.names, segments):
            self._models[name].resize([shape(s) for s in entry.inputs], [shape(s) for s in entry.outputs])
            self._models[name].bind_inputs([cache_of.get((name, i), self._buffers.get(s.name))
                                           for i, s in enumerate(entry.inputs)])
        self._shape = (tokens, positions, picks)

    def bare_predict(self) -> float:
        """Seconds of one Predict of every segment on the inputs as bound now, no host work between
        (what Lite's compute costs; the results are discarded, the cache is unchanged)."""
        start = time.perf_counter()
        for name in self.names:
            self._models[name].run()
        return time.perf_counter() - start

    def close(self) -> None:
        for model in self._models.values():
            model.close()
        self._models = {}
        self.collectives.close()
