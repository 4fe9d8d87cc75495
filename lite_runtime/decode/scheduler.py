"""The engine's scheduler: pure bookkeeping of which request holds which cache row and what each row feeds
in the next step. It calls no graph and samples nothing (runner.py calls the graph, output.py samples).

A step plan gives each row its tokens: a request admitted since the last step feeds its prompt (in chunks of
`prefill_chunk` tokens; alone, in chunks of LONE_CHUNK on the paged store, else whole; whole when its family's
prompts attend both ways), a decoding row its last token and any guesses (speculation). On the kernels' paged
store (`blocks`, backends/paged_cache.py PagedKVCache) a request is admitted only while the store has room for
its first chunk, and when a step needs more blocks than are free the newest running request is preempted:
its blocks go back and it waits at the head of the queue to be fed again, its prompt and the tokens it has
generated as one prompt (vLLM's recompute), its sampler and budget kept.
"""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Deque, List, Optional, Union

import numpy as np

from lite_runtime.backends.kv_cache import PackedKVCache, fixed_picks
from lite_runtime.backends.paged_cache import PagedKVCache
from lite_runtime.contract.errors import ValidationError
from lite_runtime.contract.families import get_family
from lite_runtime.contract.manifest import Manifest

PREFILL_CHUNK = 128     # most prompt tokens a row feeds in one step
# ... and a request alone, on the paged store: a call holds its tokens' activations, and a chunk reads only its
# row's blocks (docs/measured-choices.md)
LONE_CHUNK = 512
log = logging.getLogger("lite_runtime.engine")


def context_room(seq_length: int, prompt_length: int) -> int:
    """New tokens a prompt leaves room for: an export holds seq_length tokens a request, its prompt and its
    new ones (vLLM's max_model_len, MindFormers' max_length), on every entry point."""
    return max(seq_length - prompt_length, 0)


@dataclass(frozen=True)
class EngineLimits:
    """What an export allows the engine, decided once from its manifest for every entry point."""
    rows: int                 # cache rows: requests in flight at once
    seq_length: int           # tokens a request holds: its prompt and its new ones (vLLM's max_model_len)
    whole_prompts: bool       # a prompt attends both ways (GLM): fed in one call
    max_picks: Optional[int]  # logits a step returns when fixed by the export (older exports), else None
    pad_id: int
    adapters: bool            # SLoRA: each row names its adapter slot

    @classmethod
    def of(cls, manifest: Manifest, what: str = "the engine") -> "EngineLimits":
        manifest.require_packed(what)
        return cls(manifest.batch_size, manifest.seq_length, get_family(manifest.family).whole_prompts,
                   fixed_picks(manifest), int(manifest.pad_token_id), manifest.dims.adapter_slots > 0)

    def new_tokens(self, prompt_length: int, asked: Optional[int] = None) -> int:
        """The most new tokens a prompt of `prompt_length` may get, within `asked` when given."""
        room = context_room(self.seq_length, prompt_length)
        return room if asked is None else min(asked, room)

    def check_prompt(self, prompt: List[int]) -> None:
        if not prompt:
            raise ValidationError("the prompt is empty after tokenisation; give at least one token")
        if len(prompt) >= self.seq_length:
            raise ValidationError(f"the prompt has {len(prompt)} tokens but this export holds "
                                  f"{self.seq_length} per request (seq_length): at most {self.seq_length - 1} "
                                  "prompt tokens leave room for one new token")


@dataclass
class Row:
    """A request in a cache row (or preempted, waiting to be fed again)."""
    request: object              # engine.EngineRequest
    sampler: object              # sampling.Sampler
    tokens: List[int]            # prompt, then generated tokens
    past: int = 0                # tokens in the cache
    pending: List[int] = field(default_factory=list)   # tokens to feed at the next step
    guesses: List[int] = field(default_factory=list)   # speculated tokens fed after them
    generated: int = 0
    row_values: List[int] = field(default_factory=list)   # the family's per-row graph inputs
    order: int = 0               # when it was (last) admitted: the newest is preempted first


@dataclass
class StepPlan:
    """One step: row r feeds tokens[r, :counts[r]] after its past[r] cached tokens; picks[r] of its last
    tokens get logits (its last one, one more per guess), 0 when its prompt goes on at the next step."""
    live: List[int]
    tokens: np.ndarray
    counts: np.ndarray
    past: np.ndarray
    picks: np.ndarray


class Scheduler:
    def __init__(self, limits: EngineLimits, cache=None, prefill_chunk: int = PREFILL_CHUNK,
                 max_step_tokens: int = PackedKVCache.max_tokens, lone_chunk: int = LONE_CHUNK):
        if max_step_tokens < limits.rows:
            raise ValidationError(f"max_step_tokens {max_step_tokens} is below the export's {limits.rows} cache rows: "
                                  f"each decoding row feeds a token per step; allowed: {limits.rows} or more")
        self.limits = limits
        self.blocks: Optional[PagedKVCache] = cache if isinstance(cache, PagedKVCache) else None
        self.prefill_chunk, self.max_step_tokens, self.lone_chunk = prefill_chunk, max_step_tokens, lone_chunk
        self.rows: List[Optional[Row]] = [None] * limits.rows
        self.waiting: Deque[Union[object, Row]] = collections.deque()   # requests, preempted rows first
        self.preemptions = 0
        self._admitted = 0

    def busy(self) -> int:
        return sum(row is not None for row in self.rows)

    def live(self) -> List[int]:
        return [i for i, row in enumerate(self.rows) if row is not None]

    def has_work(self) -> bool:
        return self.busy() > 0 or (bool(self.waiting) and None in self.rows)

    # --- admission -------------------------------------------------------------------------------
    def next_admission(self) -> Optional[int]:
        """The free row the head of the queue may take now, or None."""
        if not self.waiting or None not in self.rows:
            return None
        return self.rows.index(None)

    def computing(self, tokens: List[int], adapter_slot: int, block: int) -> int:
        """The longest run of whole `block`s that starts `tokens` (at most all of it but its last token) and that
        a running row shares and has still to compute, in its prompt: a request may wait for those blocks
        (a prefix cache stores them as they are computed) rather than compute them too."""
        cap, best = (len(tokens) - 1) // block * block, 0
        for row in self.rows:
            if row is None or row.request.adapter_slot != adapter_slot or row.past + 1 >= len(row.tokens):
                continue
            end, n = min(cap, len(row.tokens) // block * block), 0
            while n < end and row.tokens[n:n + block] == tokens[n:n + block]:
                n += block
            if n > row.past:
                best = max(best, n)
        return best

    def place(self, slot: int, row: Row) -> bool:
        """Put `row` (its cached prefix attached to `slot` already) into `slot` if the store has room for its
        first chunk; False leaves the slot empty (its blocks given back) and the row at the head of the queue."""
        if self.blocks is not None and self.busy():
            first = min(len(row.pending), self._width(alone=False))
            if not self.blocks.make_room(self.blocks.blocks_needed(slot, row.past + first, row.past)):
                self.blocks.release(slot)
                return False
        self._admitted += 1
        row.order = self._admitted
        self.rows[slot] = row
        return True

    def remove(self, slot: int) -> Row:
        row, self.rows[slot] = self.rows[slot], None
        if self.blocks is not None:
            self.blocks.release(slot)
        return row

    def preempt(self, slot: int) -> None:
        """Free the row's blocks; it waits first in the queue, to feed all its tokens again."""
        row = self.remove(slot)
        log.warning("preempted the request in cache row %d (%d tokens): the KV store has no free block; it is fed "
                    "again when blocks free (a larger kv_cache_gb avoids it)", slot, len(row.tokens))
        row.past, row.pending, row.guesses = 0, list(row.tokens), []
        self.preemptions += 1
        self.waiting.appendleft(row)

    # --- the step --------------------------------------------------------------------------------
    def _width(self, alone: bool) -> int:
        L = self.limits
        if L.whole_prompts or (alone and self.blocks is None):
            return L.seq_length
        return self.lone_chunk if alone else self.prefill_chunk

    def plan(self) -> Optional[StepPlan]:
        """The next step's plan (None: no row is running), preempting the newest rows while the store lacks
        the blocks it needs."""
        while True:
            live = self.live()
            if not live:
                return None
            plan = self._plan(live)
            if self.blocks is None or self.blocks.make_room(self._blocks_needed(plan)):
                return plan
            self.preempt(max(live, key=lambda i: self.rows[i].order))

    def _blocks_needed(self, plan: StepPlan) -> int:
        return sum(self.blocks.blocks_needed(i, int(plan.past[i] + plan.counts[i]),
                                             int(plan.past[i]) if plan.counts[i] else None) for i in plan.live)

    def _plan(self, live: List[int]) -> StepPlan:
        L, rows = self.limits, self.rows
        past = np.zeros(L.rows, np.int32)
        for i in live:
            past[i] = rows[i].past
        # A longer prompt is fed in chunks over several steps (chunked prefill), which bounds how long the rows
        # that decode wait; a request alone, which no row waits for, in larger ones (or whole: on host arrays
        # each chunk's tokens would read all the positions before them).
        alone = len(live) == 1
        width = min(max(len(rows[i].pending) + len(rows[i].guesses) for i in live), L.seq_length, self._width(alone))
        counts = np.zeros(L.rows, np.int32)
        tokens = np.full((L.rows, width), L.pad_id, np.int32)
        left = max(self.max_step_tokens, width) if alone else self.max_step_tokens
        spare = left if L.max_picks is None else L.max_picks - len(live)    # logits left for guesses
        for i in sorted(live, key=lambda i: len(rows[i].pending)):    # decoding rows first
            row = rows[i]
            feed = row.pending[:width]
            if not L.whole_prompts:
                feed = feed[:left]
            elif len(feed) < len(row.pending) or len(feed) > left and counts.any():
                continue      # a whole prompt waits for room (alone in a step, it may pass the budget)
            if len(feed) == len(row.pending):      # a decoding row's guesses, within the budget
                fits = max(0, min(left, width, len(feed) + spare) - len(feed))
                row.guesses = row.guesses[:fits]
                spare -= len(row.guesses)
                feed = feed + row.guesses
            else:
                row.guesses = []
            left -= len(feed)
            counts[i] = len(feed)
            tokens[i, :len(feed)] = feed
        # Rows whose fed tokens end their pending ones get logits: one each, or one per guess more.
        picks = np.array([len(rows[i].guesses) + 1 if rows[i] and counts[i] >= len(rows[i].pending) else 0
                          for i in range(L.rows)], np.int64)
        return StepPlan(live, tokens, counts, past, picks)
