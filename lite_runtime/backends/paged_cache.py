"""The packed step's K/V in the kernels' paged store (`attention: paged`): the rows' block tables, blocks counted by
reference (rows, cached prefixes), the store's size (a budget, kv_cache_gb) and what the scheduler asks of it."""
from __future__ import annotations

import heapq
import math
from typing import Callable, List, Optional, Sequence

import numpy as np

from lite_runtime.backends.kv_cache import PackedKVCache
from lite_runtime.contract.errors import ConfigError
from lite_runtime.contract.families import KV_CACHE_DTYPES, STEP
from lite_runtime.contract.manifest import Manifest

KV_SCALE_RUN = 32     # int8 K/V: values of a position and head per scale (native/attention_math.h kKvScaleRun)


class PagedKVCache(PackedKVCache):
    """The packed step over the kernels' paged store (`attention: paged`, native/paged_attention_kernel.cc): the
    store is allocated once, on the first call, with blocks of `kv_block` positions for every row's seq_length
    and more for a prefix cache (`reserve`), reserved and resident only as blocks are written, float32 or
    float16 (`dtype`). Each call passes each row's block ids and the store's id; the attention nodes
    write the new K/V into the blocks and read them there: nothing of the cache is copied, grown or bound. A
    row holds the blocks of the positions it has (its past and the call's tokens); a row whose past starts again
    (a new request, an idle row) gives the rest back, lowest ids first, so that the resident part of the store
    stays at the blocks in use. Blocks are counted by reference: a prefix cache keeps a prompt's blocks, and a
    row that starts with that prompt reads them (`attach`); a shared block a row would write is replaced by a
    copy of its own first."""

    def __init__(self, manifest: Manifest, dtype: str = KV_CACHE_DTYPES[0]):
        d = manifest.dims
        self.block, self.per_row, self.dtype = d.kv_block, d.kv_blocks_per_row, dtype
        self.store = None
        self.tables = np.zeros((d.batch_size, self.per_row), np.float32)
        self.held: List[List[int]] = [[] for _ in range(d.batch_size)]
        self.refs: dict = {}          # block -> its holders (rows, prefix cache entries)
        self.on_full: Callable[[], bool] = lambda: False      # frees a block when none is (the prefix cache's)
        self.budget = None            # the store's bytes when given (kv_cache_gb), else every row's seq_length
        self.free: List[int] = []
        super().__init__(manifest)
        self.free = list(range(self._default_blocks()))      # a heap: the lowest free id first

    @property
    def block_bytes(self) -> int:
        """One block's K/V in every layer."""
        return kv_block_bytes(self._layers, self._kv, self._hd, self.block, self.dtype)

    @property
    def total_blocks(self) -> int:
        return len(self.free) + len(self.refs)

    def _default_blocks(self) -> int:
        """Every row's seq_length, unless that is more than half the memory available now (the store is
        resident as it is written: beyond that, requests are preempted before the machine swaps)."""
        return max(self.per_row, min(len(self.held) * self.per_row, available_memory() // 2 // self.block_bytes))

    def configure(self, dtype: str = KV_CACHE_DTYPES[0], budget_bytes: Optional[float] = None) -> None:
        """The store's K/V dtype and size (its blocks, within `budget_bytes` when given), before the first call."""
        if dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype {dtype!r} is not allowed; allowed: {', '.join(KV_CACHE_DTYPES)}")
        if self.store is not None or self.refs:
            raise ConfigError("the paged store's kv_cache_dtype and kv_cache_gb are chosen before the first call")
        self.dtype = dtype
        blocks = self._default_blocks()
        if budget_bytes is not None:
            blocks = int(budget_bytes // self.block_bytes)
            if blocks < self.per_row:
                gib = math.ceil(self.per_row * self.block_bytes / 2 ** 30 * 1e6) / 1e6     # rounded up
                raise ConfigError(f"kv_cache_gb {budget_bytes / 2 ** 30:g} holds {blocks} block{'s' * (blocks != 1)} of {self.block} "
                                  f"positions ({self.block_bytes / 2 ** 20:.3f} MiB each, {dtype}); one sequence of "
                                  f"the export's seq_length {self.per_row * self.block} needs {self.per_row} "
                                  f"({gib:g} GiB): allowed: {gib:g} or more")
            self.budget = blocks * self.block_bytes
        self.free = list(range(blocks))

    def blocks_needed(self, row: int, end: int, past: Optional[int] = None) -> int:
        """The free blocks row `row` takes to hold positions < `end`, writing from `past` on (None: not fed)."""
        held = self.held[row]
        need = -(-end // self.block)
        new = max(0, need - len(held))
        if past is not None:     # the shared blocks it writes are copied first (_hold)
            new += sum(self.refs[held[j]] > 1 for j in range(past // self.block, min(len(held), need)))
        return new

    def make_room(self, blocks: int) -> bool:
        """Whether `blocks` blocks are free, after dropping cached prefixes (least recent first) to free them."""
        while len(self.free) < blocks and self.on_full():
            pass
        return len(self.free) >= blocks

    def release(self, row: int) -> None:
        """Row `row` ends: its blocks go back (those a cached prefix holds stay with it)."""
        self._hold(row, 0)

    def reset(self) -> None:
        for row in range(len(self.held)):
            self._hold(row, 0)

    def fit(self, past: np.ndarray) -> None:
        """Nothing to shrink: a row's blocks follow its past."""

    def _split(self, counts: np.ndarray, past: np.ndarray):
        return None     # a token reads only its own row's blocks

    @property
    def held_blocks(self) -> int:
        return len(self.refs)

    def reserve(self, blocks: int) -> None:
        """Room for `blocks` more blocks (a prefix cache's) beside the rows', before the store is made; within a
        budget (kv_cache_gb) a prefix cache takes its blocks from it."""
        if self.store is None and self.budget is None:
            total = self.total_blocks
            for block in range(total, total + blocks):
                heapq.heappush(self.free, block)

    def ref(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            self.refs[block] += 1

    def unref(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            self.refs[block] -= 1
            if not self.refs[block]:
                del self.refs[block]
                heapq.heappush(self.free, block)

    def attach(self, row: int, blocks: Sequence[int]) -> None:
        """Row `row` starts with these blocks (a cached prefix), as its positions 0 .. len(blocks) · kv_block."""
        self.unref(self.held[row])
        self.held[row] = list(blocks)
        self.ref(blocks)
        self.tables[row, :len(blocks)] = blocks

    def _alloc(self) -> int:
        while not self.free:
            if not self.on_full():
                raise RuntimeError("the paged KV store has no free block")   # the scheduler makes room first
        block = heapq.heappop(self.free)
        self.refs[block] = 1
        return block

    def _shrink(self, row: int, positions: int) -> int:
        """Row `row` gives back its blocks past those of positions < `positions`; returns how many it keeps."""
        held, need = self.held[row], -(-positions // self.block)
        while len(held) > need:
            self.unref([held.pop()])
        return need

    def _hold(self, row: int, positions: int, past: int = None) -> None:
        """Row `row` holds the blocks of positions < `positions`, those it writes from `past` on its own."""
        held, need = self.held[row], self._shrink(row, positions)
        for j in range(len(held) if past is None else past // self.block, len(held)):
            if self.refs[held[j]] > 1:        # shared (a cached prefix): written by this row, so copied first
                block = self._alloc()
                if self.store is not None and j * self.block < past:
                    self.store.copy_block(held[j], block)
                self.unref([held[j]])
                held[j] = block
                self.tables[row, j] = block
        while len(held) < need:
            held.append(self._alloc())
            self.tables[row, len(held) - 1] = held[-1]

    def _run_tokens(self, run, ids, rows, positions, past, last, extra, span=None):
        if self.store is None:
            from lite_runtime.backends.lite_kernels import KVStore
            self.store = KVStore(self._layers, self.total_blocks, self.block, self._kv, self._hd, self.dtype)
            self._store_id = np.array([self.store.id], np.float32)
        ends = np.array(past, np.int64)
        np.maximum.at(ends, rows, positions.astype(np.int64) + 1)
        fed = np.bincount(rows, minlength=len(ends)) > 0
        # Rows give back first, then take: another rank replaying this call (mirrored.py), which is not told of
        # rank 0's releases, frees the same blocks before it needs them and takes the same ids.
        for row, end in enumerate(ends):
            self._shrink(row, int(end))
        for row, end in enumerate(ends):
            self._hold(row, int(end), int(past[row]) if fed[row] else None)
        return run(STEP, [ids, rows, positions, past, last, *extra, self.tables, self._store_id])[0]

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None


def kv_block_bytes(layers: int, kv: int, hd: int, block: int, dtype: str) -> int:
    """The bytes of one block of `block` positions of the store (lite_kernels.KVStore): keys and values of
    `kv` heads of `hd` in each of `layers` layers, and for int8 a float32 scale a run of KV_SCALE_RUN values."""
    runs = -(-hd // KV_SCALE_RUN)
    per_position = {"float32": 4 * hd, "float16": 2 * hd, "int8": hd + 4 * runs}[dtype]
    return 2 * layers * kv * block * per_position


def available_memory() -> int:
    """Bytes of memory available now (Linux's MemAvailable; elsewhere a large number)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 50
