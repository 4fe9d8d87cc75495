"""The backend protocol: the decode loop talks to every backend through `Session`.

A backend implements `_run(kind, feeds)` for one graph call; the `io` kv-mode cache
bookkeeping (host-owned buffers, writing new rows in) lives here once for all backends.
"""
from __future__ import annotations

import time
from typing import List, Optional

import numpy as np

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.manifest import Manifest


class HostKVCache:
    """Per-layer key/value buffers owned by the host (`io` kv mode).

    Arrays are allocated once per session and stay at the same addresses, so a backend may bind
    them to graph inputs without copying.
    """

    def __init__(self, manifest: Manifest):
        d = manifest.dims
        shape = (d.batch_size, d.kv_heads_per_rank, d.seq_length, d.head_dim)
        self.arrays: List[np.ndarray] = [np.zeros(shape, np.float32) for _ in range(2 * d.num_layers)]
        self._rows = np.arange(d.batch_size)

    def write_prefill(self, new_rows: List[np.ndarray]) -> None:
        for cache, new in zip(self.arrays, new_rows):
            np.copyto(cache[:, :, :new.shape[2]], new)

    def write_step(self, new_rows: List[np.ndarray], positions: np.ndarray) -> None:
        """Write one new row per batch row at `positions` (B,)."""
        rows = self._rows
        for cache, new in zip(self.arrays, new_rows):
            cache[rows, :, positions, :] = new[:, :, 0, :]



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
        self.cache: Optional[HostKVCache] = HostKVCache(manifest) if manifest.kv_cache == "io" else None

    # --- the protocol ---------------------------------------------------------------------------
    def prefill(self, input_ids: np.ndarray, valid_length: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        outputs = self._timed_run("prefill", [input_ids, valid_length, *extra])
        if self.cache is not None:
            self.cache.write_prefill(outputs[1:])
        return outputs[0]

    def decode(self, input_ids: np.ndarray, valid_length: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        feeds = [input_ids, valid_length, *extra]
        if self.cache is not None:
            feeds += self.cache.arrays
        outputs = self._timed_run("increment", feeds)
        if self.cache is not None:
            self.cache.write_step(outputs[1:], valid_length - 1)
        return outputs[0]

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
