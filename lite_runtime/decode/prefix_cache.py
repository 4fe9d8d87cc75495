"""Prefix caching on the host-owned cache: a bounded store of recent prompts' keys and values, so a
prompt that starts like an earlier one (a chat's system prompt, its growing conversation) is
prefilled only from where they differ.

The engine's session keeps its cache as host arrays, one (B, kv, hd, P) key and one (B, kv, P, hd)
value array per layer (backends/kv_cache.py), so a prompt's K/V are slices of its row: stored as a copy
once the prompt is in the cache, and copied into a new row at admission. Prompts are matched by
blocks of `BLOCK` tokens: every block boundary of a stored prompt is indexed by a hash chained over
its blocks (and the request's adapter slot: an adapter's K/V differ from the base model's), and a
new prompt takes the longest indexed boundary it shares, at most its length minus one (its last
token is always fed: its logits choose the first new token). The least recently used prompts are
dropped beyond `max_bytes`, and a prompt a newer one extends (a chat's earlier turn) when that is stored.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

BLOCK = 16


@dataclass
class _Entry:
    keys: Tuple[int, ...]        # the index keys of its block boundaries
    arrays: List[np.ndarray]     # per layer: keys (kv, hd, n), values (kv, n, hd)
    prompt: Tuple[int, ...]      # its tokens (a hash match is checked against them)
    nbytes: int


class PrefixCache:
    progressive = False      # stored only once a prompt is whole: each store copies the K/V

    def __init__(self, cache, max_bytes: int):
        self.cache, self.max_bytes = cache, int(max_bytes)
        self._entries: "collections.OrderedDict[int, _Entry]" = collections.OrderedDict()   # by id, LRU first
        self._index: Dict[int, Tuple[int, int]] = {}       # chained hash of a boundary -> (entry id, tokens)
        self._next_id = 0
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0
        self.cached_tokens = 0

    @staticmethod
    def _chain(slot: int, prompt: Sequence[int], tokens: int) -> List[int]:
        """The chained hash of each whole block of `prompt[:tokens]` (slot first)."""
        out, h = [], hash(("slot", slot))
        for start in range(0, tokens - tokens % BLOCK, BLOCK):
            h = hash((h, tuple(prompt[start:start + BLOCK])))
            out.append(h)
        return out

    def _longest(self, slot: int, prompt: Sequence[int]):
        """(entry id, tokens) of the longest stored prefix of `prompt`, at most its length minus one; None: none."""
        best = None
        for h in self._chain(slot, prompt, len(prompt) - 1):
            found = self._index.get(h)
            if found is None:
                break
            best = found
        if best is None or tuple(prompt[:best[1]]) != self._entries[best[0]].prompt[:best[1]]:   # a hash collision
            return None
        return best

    def peek(self, slot: int, prompt: Sequence[int]) -> int:
        """The length of the longest stored prefix of `prompt` (0: none), not counted."""
        best = self._longest(slot, prompt)
        return best[1] if best else 0

    def _match(self, slot: int, prompt: Sequence[int]) -> int:
        """The length of the longest stored prefix of `prompt` (0: none), counted as a hit or a miss."""
        best = self._longest(slot, prompt)
        if best is None:
            self.misses += 1
            return 0
        entry_id, tokens = best
        self._entries.move_to_end(entry_id)
        self.hits += 1
        self.cached_tokens += tokens
        return tokens

    def load(self, row: int, slot: int, prompt: Sequence[int]) -> int:
        """Copy the longest stored prefix of `prompt` into cache row `row`; returns its length (0: none)."""
        tokens = self._match(slot, prompt)
        if not tokens:
            return 0
        entry = self._entries[self._index[self._chain(slot, prompt, tokens)[-1]][0]]
        self.cache.ensure(tokens)
        for i, (cache, stored) in enumerate(zip(self.cache.arrays, entry.arrays)):
            if i % 2:
                cache[row, :, :tokens, :] = stored[:, :tokens, :]
            else:
                cache[row, :, :, :tokens] = stored[:, :, :tokens]
        return tokens

    def store(self, row: int, slot: int, prompt: Sequence[int]) -> None:
        """Keep the whole blocks of `prompt`, whose K/V are in cache row `row` now."""
        chain = self._chain(slot, prompt, len(prompt))
        if not chain or chain[-1] in self._index:
            return
        tokens = len(chain) * BLOCK
        arrays = [np.array(a[row, :, :tokens, :] if i % 2 else a[row, :, :, :tokens])
                  for i, a in enumerate(self.cache.arrays)]
        nbytes = sum(a.nbytes for a in arrays)
        if nbytes > self.max_bytes:
            return
        self._add(chain, _Entry(tuple(chain), arrays, tuple(prompt[:tokens]), nbytes))

    def _add(self, chain: List[int], entry) -> None:
        for n, h in enumerate(chain, 1):      # an entry the new one extends holds nothing more: dropped
            older = self._entries.get(self._index.get(h, (None,))[0])
            if older is not None and len(older.keys) == n and older.prompt == entry.prompt[:n * BLOCK]:
                self._forget(self._index[h][0])
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = entry
        for n, h in enumerate(chain, 1):
            self._index[h] = (entry_id, n * BLOCK)       # a later prompt points its boundaries at itself
        self.bytes += entry.nbytes
        while self.bytes > self.max_bytes:
            self._evict()

    def _evict(self) -> None:
        self._forget(next(iter(self._entries)))
        self.evictions += 1

    def _forget(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        for h in entry.keys:
            if self._index.get(h, (None,))[0] == entry_id:
                del self._index[h]
        self.bytes -= entry.nbytes
        self._release(entry)

    def _release(self, entry) -> None:
        """What an entry held, given back (its arrays: to the garbage collector)."""


class PagedPrefixCache(PrefixCache):
    """The prefix cache on the kernels' paged store (backends/paged_cache.py): an entry holds references
    to its prompt's whole blocks, and a prompt that starts with it is given those blocks as its row's first
    ones, read where they are: nothing is copied. So a prompt is stored as it is computed, after each chunk
    (`progressive`: each store replaces the entry of the chunks before), and a request that shares a prompt
    still being computed can wait for its blocks (engine.py) rather than compute them again. Its `max_bytes`
    are blocks reserved in the store beside the rows' (within the store's budget when it has one, kv_cache_gb);
    None: the store's own, no more (entries keep blocks no row holds). When the store has no free block the
    least recently used entry is dropped."""

    progressive = True

    def __init__(self, cache, max_bytes: Optional[int]):
        if cache.block != BLOCK:
            raise ValueError(f"the paged store's blocks of {cache.block} positions are not the prefix cache's {BLOCK}")
        super().__init__(cache, cache.total_blocks * cache.block_bytes if max_bytes is None else max_bytes)
        self.block_bytes = cache.block_bytes
        if max_bytes is not None:
            cache.reserve(self.max_bytes // self.block_bytes)
        cache.on_full = self._drop_one

    def _drop_one(self) -> bool:
        if not self._entries:
            return False
        self._evict()
        return True

    def load(self, row: int, slot: int, prompt: Sequence[int]) -> int:
        tokens = self._match(slot, prompt)
        if tokens:
            entry = self._entries[self._index[self._chain(slot, prompt, tokens)[-1]][0]]
            self.cache.attach(row, entry.blocks[:tokens // BLOCK])
        return tokens

    def store(self, row: int, slot: int, prompt: Sequence[int]) -> None:
        chain = self._chain(slot, prompt, len(prompt))
        if not chain or chain[-1] in self._index:
            return
        blocks = self.cache.held[row][:len(chain)]
        nbytes = len(blocks) * self.block_bytes
        if nbytes > self.max_bytes:
            return
        self.cache.ref(blocks)
        self._add(chain, _PagedEntry(tuple(chain), list(blocks), tuple(prompt[:len(chain) * BLOCK]), nbytes))

    def _release(self, entry) -> None:
        self.cache.unref(entry.blocks)


@dataclass
class _PagedEntry:
    keys: Tuple[int, ...]
    blocks: List[int]            # its whole blocks in the paged store, one a BLOCK tokens
    prompt: Tuple[int, ...]
    nbytes: int
