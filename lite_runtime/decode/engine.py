"""The engine: continuous batching over the cache rows of one step-graph session.

Each of the graph's B rows holds one request or is idle. Every step is one call of the step graph
in which each row moves on by its own number of tokens: a request admitted since the last step
feeds its prompt (in chunks of `prefill_chunk` tokens, whole when it is alone), the others their last
token (`Session.step`).
So a request joins at the next step instead of waiting for a batch to end, and a finished request
frees its row at once. The packed step computes each fed token once, whichever row it belongs to.
Each row keeps its own sampler (seeded per request), penalties, token budget and stop ids.

Served, the engine runs in one thread of its own; `submit` and `cancel` may be called from any thread.
`pipeline()` and run_infer_main drive one without a thread: a static batch is requests submitted
together, then `run_until_idle()` steps in the caller's thread until each has finished.
A request reports through `on_token(token_id, TokenLogprobs or None)` and `on_finish(reason)`, called
through the engine's `deliver`: by default at once, in the engine thread; the server's hands each step's
calls to its event loop together (one wake-up a step, not one a token). Choosing a token is the request's
`Sampler` (decode/sampling.py: every logits processor lives there). With `speculation`, a decoding
row also feeds guessed tokens and keeps those its sampler confirms (speculation.py, draft.py).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Deque, List, NamedTuple, Optional, Tuple

import numpy as np

from lite_runtime.backends.base import PackedKVCache, PagedKVCache, Session, fixed_picks
from lite_runtime.contract.errors import ConfigError, UnsupportedError, ValidationError
from lite_runtime.contract.families import get_family
from lite_runtime.decode.inputs import InputOfInfer
from lite_runtime.decode.prefix_cache import PagedPrefixCache, PrefixCache
from lite_runtime.decode.sampling import Sampler, SamplingParams, token_logprobs
from lite_runtime.decode.speculation import Speculation, SpeculationStats

log = logging.getLogger("lite_runtime.engine")


PREFILL_CHUNK = 128     # most prompt tokens a row feeds in one step


def call_each(calls: list) -> None:
    for callback, args in calls:
        callback(*args)


class QueueFull(Exception):
    """The engine's waiting queue is full: answer the client at once (429)."""


class TokenLogprobs(NamedTuple):
    """The chosen token's log-probability under the model, and the `top` most likely tokens' (id, logprob)."""
    logprob: float
    top: List[Tuple[int, float]]


@dataclass
class EngineRequest:
    """One generation: token ids in, token ids out through the callbacks."""
    prompt: List[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_ids: frozenset = frozenset()
    adapter_slot: int = 0
    logprobs: Optional[int] = None   # k: report TokenLogprobs with the k most likely tokens (a softmax per step)
    constraint: Optional[object] = None   # a grammar the answer must follow (constraints.JsonConstraint)
    on_token: Callable[[int, Optional[TokenLogprobs]], None] = lambda token, logprobs: None
    on_finish: Callable[[str], None] = lambda reason: None
    # set by the engine
    arrived: float = field(default_factory=time.perf_counter)
    cached_tokens: int = 0           # prompt tokens whose K/V came from the prefix cache
    admitted: Optional[float] = None
    cancelled: bool = False


@dataclass
class _Row:
    request: EngineRequest
    sampler: Sampler
    tokens: List[int]            # prompt, then generated tokens
    past: int = 0                # tokens in the cache
    pending: List[int] = field(default_factory=list)   # tokens to feed at the next step
    guesses: List[int] = field(default_factory=list)   # speculated tokens fed after them
    generated: int = 0
    row_values: List[int] = field(default_factory=list)   # the family's per-row graph inputs


class Engine:
    """Owns `session` (a packed export's session) and schedules requests onto its rows."""

    def __init__(self, session, max_waiting: int = 64, prefill_chunk: int = PREFILL_CHUNK, metrics=None,
                 max_step_tokens: int = PackedKVCache.max_tokens, threaded: bool = True, prefix_cache_bytes: int = 0,
                 speculation: Optional[Speculation] = None):
        """`prefix_cache_bytes` > 0 keeps recent prompts' K/V up to that size and reuses their shared
        prefixes (prefix_cache.py): on one rank's session, for families whose prompts attend causally.
        `speculation` guesses tokens (prompt lookup or a draft export), verified in the step (speculation.py)."""
        m = session.manifest
        if m.kv_cache != "packed":
            raise UnsupportedError(f"serving needs an export with kv_cache: packed (one step graph over a list of "
                                   f"tokens of any rows); {m.root} has kv_cache {m.kv_cache!r}: export it again with "
                                   "kv_cache: packed")
        if max_step_tokens < m.batch_size:
            raise ValidationError(f"max_step_tokens {max_step_tokens} is below the export's {m.batch_size} cache rows: "
                                  f"each decoding row feeds a token per step; allowed: {m.batch_size} or more")
        # A family's own per-row graph inputs (GLM v1's context_length, mask_position) come from each
        # prompt, once, by its feed builder.
        self.inputs = InputOfInfer.get_inputs(m.family, m)
        self.whole_prompts = get_family(m.family).whole_prompts
        self.pad_id = m.pad_token_id
        self.idle_row_values = self._row_values([self.pad_id])    # what an idle row feeds
        self.session = session
        self.batch = m.batch_size
        self.seq_length = m.seq_length
        self.adapters = m.dims.adapter_slots > 0
        self.max_waiting = max_waiting
        self.prefill_chunk = prefill_chunk    # most prompt tokens a row feeds in one step
        self.max_step_tokens = max_step_tokens    # most tokens a step computes
        self.metrics = metrics
        self.prefix = self._prefix_cache(session, prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.speculation, self.speculated = speculation, SpeculationStats()
        self.max_picks = fixed_picks(m)
        self.rows: List[Optional[_Row]] = [None] * self.batch
        self.waiting: Deque[EngineRequest] = collections.deque()
        self._wake = threading.Condition()
        self._stopping = False     # no new requests
        self._exit = False         # the engine thread ends
        self.steps = 0
        self.pick_seconds = 0.0    # host time in the rows' samplers (benchmarks)
        self.counted = self        # whose rows and queue the metrics report (Replicas: all of them)
        # How the requests' callbacks run: given [(callback, args)] in order, those of a step together.
        self.deliver: Callable[[list], None] = call_each
        self._told: Optional[Tuple[int, list]] = None    # (the stepping thread, the step's callbacks so far)
        self._thread = None
        if threaded:
            self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
            self._thread.start()

    def _prefix_cache(self, session, max_bytes: int) -> PrefixCache:
        if not isinstance(session, Session):
            raise ConfigError("prefix caching keeps the K/V of one rank's session; this engine drives several ranks "
                              f"({session.runtime}): serve without --prefix_cache_gb")
        if self.whole_prompts:
            raise ConfigError(f"prefix caching needs prompts whose K/V depend only on the tokens before them; a "
                              f"{session.manifest.family} prompt attends both ways: serve without --prefix_cache_gb")
        if isinstance(session.cache, PagedKVCache):     # shared by reference: its blocks
            return PagedPrefixCache(session.cache, max_bytes)
        return PrefixCache(session.cache, max_bytes)

    # --- called from any thread ------------------------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        if not request.prompt:
            raise ValidationError("the prompt is empty after tokenisation; give at least one token")
        if len(request.prompt) >= self.seq_length:
            raise ValidationError(f"the prompt has {len(request.prompt)} tokens but this export holds "
                                  f"{self.seq_length} per request (seq_length): at most {self.seq_length - 1} "
                                  "prompt tokens leave room for one new token")
        with self._wake:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            free_rows = self.rows.count(None)       # requests for them are admitted at the next step
            if len(self.waiting) >= self.max_waiting + free_rows:
                raise QueueFull(f"{len(self.waiting) - free_rows} requests are waiting for a cache row already "
                                "(the most the engine queues)")
            self.waiting.append(request)
            self._wake.notify()
        self._observe()

    def cancel(self, request: EngineRequest) -> None:
        """Stop `request` (a client went away): its row is freed at the next step."""
        request.cancelled = True
        with self._wake:
            self._wake.notify()

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new requests, let running ones finish within `timeout`, then end the rest with the
        finish reason `abort` (vLLM's; waiting requests at once)."""
        with self._wake:
            self._stopping = True
            while self.waiting:
                self._tell(self.waiting.popleft().on_finish, "abort")
            self._wake.notify()
        deadline = time.perf_counter() + timeout
        while self.busy_rows() and time.perf_counter() < deadline:
            time.sleep(0.02)
        with self._wake:
            self._exit = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for slot, row in enumerate(self.rows):     # what the timeout cut short is told so
            if row is not None:
                self._finish(slot, "abort")
        while self.waiting:
            self._tell(self.waiting.popleft().on_finish, "abort")

    def busy_rows(self) -> int:
        return sum(row is not None for row in self.rows)

    # --- the engine thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._exit and not self._has_work():
                    self._wake.wait()
                if self._exit:
                    return
                self._admit()
            try:
                self._step()
            except Exception as e:   # a failing graph ends every running request, not the server
                log.exception("engine step failed")
                for i, row in enumerate(self.rows):
                    if row is not None:
                        self._finish(i, f"error: {e}")
            self._observe()

    def run_until_idle(self, after_step: Optional[Callable[[], None]] = None) -> None:
        """Without a thread: admit and step until no request is running or waiting (a failing step
        raises here, to the caller)."""
        while self.step():
            if after_step is not None:
                after_step()

    def step(self) -> bool:
        """Without a thread: admit what waits and run one step; False when no request was running."""
        self._admit()
        if not any(row is not None for row in self.rows):
            return False
        self._step()
        return True

    def _has_work(self) -> bool:
        return any(row is not None for row in self.rows) or (self.waiting and None in self.rows)

    def _admit(self) -> None:
        while self.waiting and None in self.rows:
            request = self.waiting.popleft()
            if request.cancelled:
                self._tell(request.on_finish, "cancelled")
                continue
            request.admitted = time.perf_counter()
            slot = self.rows.index(None)
            cached = self.prefix.load(slot, request.adapter_slot, request.prompt) if self.prefix else 0
            request.cached_tokens = cached
            sampler = Sampler(request.sampling, request.stop_ids, request.constraint)
            self.rows[slot] = _Row(request, sampler, list(request.prompt), past=cached,
                                   pending=list(request.prompt[cached:]), row_values=self._row_values(request.prompt))
            if self.metrics is not None:
                self.metrics.queue_time.observe(request.admitted - request.arrived)
                if self.prefix is not None:
                    self.metrics.prefix_cache(cached, self.prefix)

    def _row_values(self, prompt: List[int]) -> List[int]:
        rows = self.inputs.row_inputs(np.array([prompt], np.int32), np.array([len(prompt)], np.int32))
        return [int(v[0]) for v in rows]

    def _step(self) -> None:
        self._told = (threading.get_ident(), [])
        try:
            self._run_step()
        finally:
            told, self._told = self._told[1], None
            if told:
                self.deliver(told)

    def _tell(self, callback: Callable, *args) -> None:
        """Call a request's callback: with the step's others when the engine is stepping in this thread."""
        if self._told is not None and self._told[0] == threading.get_ident():
            self._told[1].append((callback, args))
        else:
            self.deliver([(callback, args)])

    def _run_step(self) -> None:
        for i, row in enumerate(self.rows):
            if row is not None and row.request.cancelled:
                self._finish(i, "cancelled")
        live = [i for i, row in enumerate(self.rows) if row is not None]
        if not live:
            return
        past = np.zeros(self.batch, np.int32)
        for i in live:
            past[i] = self.rows[i].past
        # A longer prompt is fed in chunks over several steps (chunked prefill), which bounds how long
        # the rows that decode wait. A request alone in the engine, which no row waits for, is fed whole:
        # each chunk's tokens would read the row's cache over all its past (PackedKVCache), SmolLM2-135M's
        # 1,000-token prompt took 5.9 s in chunks of 128 and 2.3 s whole, and less memory.
        self._guess(live)
        alone = len(live) == 1
        width = min(max(len(self.rows[i].pending) + len(self.rows[i].guesses) for i in live), self.seq_length,
                    self.seq_length if self.whole_prompts or alone else self.prefill_chunk)
        counts = np.zeros(self.batch, np.int32)
        tokens = np.full((self.batch, width), self.pad_id, np.int32)
        left = max(self.max_step_tokens, width) if alone else self.max_step_tokens
        spare = left if self.max_picks is None else self.max_picks - len(live)    # logits left for guesses
        for i in sorted(live, key=lambda i: len(self.rows[i].pending)):    # decoding rows first
            feed = self.rows[i].pending[:width]
            if not self.whole_prompts:
                feed = feed[:left]
            elif len(feed) < len(self.rows[i].pending) or len(feed) > left and counts.any():
                continue      # a whole prompt waits for room (alone in a step, it may pass the budget)
            if len(feed) == len(self.rows[i].pending):      # a decoding row's guesses, within the budget
                fits = max(0, min(left, width, len(feed) + spare) - len(feed))
                guesses = self.rows[i].guesses = self.rows[i].guesses[:fits]
                spare -= len(guesses)
                feed = feed + guesses
            left -= len(feed)
            counts[i] = len(feed)
            tokens[i, :len(feed)] = feed
        idle = self.idle_row_values
        extra = [np.array([row.row_values[k] if row else idle[k] for row in self.rows], np.int32)
                 for k in range(len(idle))]
        if self.adapters:
            extra.append(np.array([row.request.adapter_slot if row else 0 for row in self.rows], np.int32))
        # Rows whose fed tokens end their pending ones get logits: one each, or one per guess more.
        picks = np.array([len(self.rows[i].guesses) + 1 if self.rows[i] and counts[i] >= len(self.rows[i].pending)
                          else 0 for i in range(self.batch)], np.int64)
        guessing = any(self.rows[i].guesses for i in live)
        if guessing:
            logits = self.session.verify(tokens, counts, past, picks, *extra)
            first = np.cumsum(picks) - picks
        else:
            logits, first = self.session.step(tokens, counts, past, *extra), np.arange(self.batch)
        self.steps += 1
        for i in live:
            row = self.rows[i]
            if not picks[i]:        # the prompt's next chunk comes at the next step (or the row's turn)
                row.past += int(counts[i])
                del row.pending[:int(counts[i])]
                row.guesses = []
                continue
            row.past += len(row.pending)
            if self.prefix is not None and row.generated == 0:      # the whole prompt is in the cache now
                self.prefix.store(i, row.request.adapter_slot, row.request.prompt)
                if self.metrics is not None:
                    self.metrics.prefix_cache(0, self.prefix)
            guesses, row.guesses, confirmed = row.guesses, [], 0
            for j in range(int(picks[i])):
                row.past += j > 0               # the guess confirmed last is in the cache
                token, logprob = self._pick(row, logits[first[i] + j:first[i] + j + 1])
                hit = j < len(guesses) and token == guesses[j]
                confirmed += hit
                if self._emit(i, token, logprob) or not hit:
                    break
            self.speculated.add(len(guesses), confirmed, self.metrics)

    def _guess(self, live: List[int]) -> None:
        """Each decoding row's guesses for this step (none for a row whose grammar must see each token)."""
        if self.speculation is None:
            return
        asked = {}
        for i in live:
            row = self.rows[i]
            if row.generated and row.request.constraint is None:
                asked[i] = (row.tokens, min(self.seq_length - row.past - 1, row.request.max_tokens - row.generated - 1))
        for i, guesses in self.speculation.guess(asked).items():
            self.rows[i].guesses = guesses

    def _emit(self, slot: int, token: int, logprob) -> bool:
        """Hand the row's next token to its request; True when that finished it."""
        row = self.rows[slot]
        row.tokens.append(token)
        row.pending = [token]
        row.generated += 1
        self._tell(row.request.on_token, token, logprob)
        reason = None
        if token in row.request.stop_ids:
            reason = "stop"
        elif row.generated >= row.request.max_tokens or row.past >= self.seq_length:   # no slot left
            reason = "length"
        if reason:
            self._finish(slot, reason)
        return reason is not None

    def _pick(self, row: _Row, logits: np.ndarray):
        """The row's next token, and its TokenLogprobs when the request asks for them."""
        request = row.request
        ids = valid = prompt = None
        if row.sampler.reads_tokens:
            ids = np.asarray(row.tokens, np.int32)[None]
            valid, prompt = np.array([ids.shape[1]], np.int32), np.array([len(request.prompt)], np.int32)
        start = time.perf_counter()
        token = int(row.sampler(logits, ids, valid, prompt)[0])
        self.pick_seconds += time.perf_counter() - start
        if request.logprobs is None:
            return token, None
        return token, TokenLogprobs(*token_logprobs(logits[0], token, request.logprobs))

    def _finish(self, slot: int, reason: str) -> None:
        row = self.rows[slot]
        self.rows[slot] = None
        self._tell(row.request.on_finish, reason)

    def _observe(self) -> None:
        if self.metrics is not None:
            self.metrics.running.set(self.counted.busy_rows())
            self.metrics.waiting.set(len(self.counted.waiting))
