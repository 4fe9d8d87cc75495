"""Prefix caching on the host-owned cache: a bounded store of recent prompts' keys and values, so a
prompt that starts like an earlier one (a chat's system prompt, its growing conversation) is
prefilled only from where they differ.

The engine's session keeps its cache as host arrays, one (B, kv, hd, P) key and one (B, kv, P, hd)
value array per layer (backends/base.py), so a prompt's K/V are slices of its row: stored as a copy
once the prompt is in the cache, and copied into a new row at admission. Prompts are matched by
blocks of `BLOCK` tokens: every block boundary of a stored prompt is indexed by a hash chained over
its blocks (and the request's adapter slot: an adapter's K/V differ from the base model's), and a
new prompt takes the longest indexed boundary it shares, at most its length minus one (its last
token is always fed: its logits choose the first new token). The least recently used prompts are
dropped beyond `max_bytes`.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

BLOCK = 16


@dataclass
class _Entry:
    keys: Tuple[int, ...]        # the index keys of its block boundaries
    arrays: List[np.ndarray]     # per layer: keys (kv, hd, n), values (kv, n, hd)
    prompt: Tuple[int, ...]      # its tokens (a hash match is checked against them)
    nbytes: int


class PrefixCache:
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

    def load(self, row: int, slot: int, prompt: Sequence[int]) -> int:
        """Copy the longest stored prefix of `prompt` into cache row `row`; returns its length (0: none)."""
        best = None
        for h in self._chain(slot, prompt, len(prompt) - 1):
            found = self._index.get(h)
            if found is None:
                break
            best = found
        if best is None:
            self.misses += 1
            return 0
        entry_id, tokens = best
        entry = self._entries[entry_id]
        if tuple(prompt[:tokens]) != entry.prompt[:tokens]:      # a hash collision: no reuse
            self.misses += 1
            return 0
        self._entries.move_to_end(entry_id)
        self.cache.ensure(tokens)
        for i, (cache, stored) in enumerate(zip(self.cache.arrays, entry.arrays)):
            if i % 2:
                cache[row, :, :tokens, :] = stored[:, :tokens, :]
            else:
                cache[row, :, :, :tokens] = stored[:, :, :tokens]
        self.hits += 1
        self.cached_tokens += tokens
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
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = _Entry(tuple(chain), arrays, tuple(prompt[:tokens]), nbytes)
        for n, h in enumerate(chain, 1):
            self._index[h] = (entry_id, n * BLOCK)       # a later prompt points its boundaries at itself
        self.bytes += nbytes
        while self.bytes > self.max_bytes:
            self._evict()

    def _evict(self) -> None:
        entry_id, entry = self._entries.popitem(last=False)
        for h in entry.keys:
            if self._index.get(h, (None,))[0] == entry_id:
                del self._index[h]
        self.bytes -= entry.nbytes
        self.evictions += 1
