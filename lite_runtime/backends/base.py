"""The backend protocol: the decode loop talks to every backend through `Session`.

A backend implements `_run(kind, feeds)` for one graph call. What is fed and where the new K/V rows
go depends on the export's kv mode only, so it lives in one cache class per mode, for all backends
(kv_cache.py; the paged store's: paged_cache.py): each builds the feeds of a prefill, a decode step and a
continuous-batching step, runs them through the backend and writes the outputs back.
"""
from __future__ import annotations

import time
from typing import List

import numpy as np

from lite_runtime.backends.kv_cache import KV_CACHES
from lite_runtime.backends.paged_cache import PagedKVCache
from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.manifest import Manifest


class Session:
    """One rank's loaded prefill + increment graphs.

    `prefill(input_ids (B,S), valid_length (B,), *extra)` and `decode(input_ids (B,1), valid_length (B,),
    *extra)` return float32 logits (B, vocab) of each row's last valid position; `extra` are the
    family's own graph inputs (its feed builder makes them), in the order of the manifest. `valid_length` counts the
    row's tokens including those of this call. `graph_seconds` accumulates time spent inside graph
    calls, so benchmarks can report host work separately.
    """

    backend_name = "?"
    runtime = "?"        # what runs the graphs, for the run summary (e.g. "MindSpore Lite 2.0.0 CPU, 2 threads")

    def __init__(self, manifest: Manifest, rank: int = 0):
        self.manifest = manifest
        self.rank = rank
        self.graph_seconds = 0.0
        self.cache = PagedKVCache(manifest) if manifest.dims.kv_block else KV_CACHES[manifest.kv_cache](manifest)

    # --- the protocol ---------------------------------------------------------------------------
    def prefill(self, input_ids: np.ndarray, valid_length: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        return self.cache.prefill(self._timed_run, input_ids, valid_length, extra)

    def decode(self, input_ids: np.ndarray, valid_length: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        return self.cache.decode(self._timed_run, input_ids, valid_length, extra)

    def step(self, tokens: np.ndarray, counts: np.ndarray, past: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        """One call of the step graph in which each row moves on by its own number of
        tokens (continuous batching: a prompt joining rows that decode). Row r feeds `tokens[r, :counts[r]]`
        after the `past[r]` tokens in its cache and gets the logits of its last one; rows with
        counts 0 are idle (their cache is left as it is, their logits are meaningless)."""
        return self.cache.step(self._timed_run, tokens, counts, past, extra)

    def verify(self, tokens: np.ndarray, counts: np.ndarray, past: np.ndarray, picks: np.ndarray,
               *extra: np.ndarray) -> np.ndarray:
        """`step`, returning the logits of row r's last picks[r] tokens, row after row (sum(picks), vocab): a row
        feeding its last token and k speculated ones gets the k + 1 distributions that verify them, a row whose
        prompt goes on at the next step none (packed exports; the engine's every step)."""
        self.manifest.require_packed("picking logits by row (the engine, speculative decoding)")
        return self.cache.step(self._timed_run, tokens, counts, past, extra, picks)

    def close(self) -> None:
        """Release the graphs. Sessions are also context managers."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- what a backend implements --------------------------------------------------------------
    def _run(self, kind: str, feeds: List[np.ndarray]) -> List[np.ndarray]:
        raise NotImplementedError

    def _timed_run(self, kind: str, feeds: List[np.ndarray]) -> List[np.ndarray]:
        start = time.perf_counter()
        outputs = self._run(kind, feeds)
        self.graph_seconds += time.perf_counter() - start
        return outputs



def require_kv_mode(manifest: Manifest, backend: str, allowed: tuple) -> None:
    if manifest.kv_cache not in allowed:
        raise UnsupportedError(
            f"backend {backend!r} cannot run this export: its kv_cache is {manifest.kv_cache!r}, "
            f"and {backend} runs only kv_cache {' or '.join(repr(a) for a in allowed)}; "
            "export again with kv_cache: io")
