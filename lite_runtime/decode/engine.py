"""The engine: continuous batching over the cache rows of one step-graph session.

Each of the graph's B rows holds one request or is idle. Every step is one call of the step graph in which
each row moves on by its own number of tokens: a request admitted since the last step feeds its prompt, the
others their last token. So a request joins at the next step instead of waiting for a batch to end, and a
finished request frees its row at once. Three parts do the work, vLLM's split: the scheduler (scheduler.py:
queue, rows, the store's blocks, the step plan), the runner (runner.py: the plan as a session call) and the
output stage (output.py: sampling, verifying guesses, tokens to requests, prefixes to the prefix cache).
This class owns them, the request queue's thread safety and, when served, a thread of its own.

Served, `submit` and `cancel` may be called from any thread. `pipeline()` and run_infer_main drive an engine
without a thread: requests submitted together, then `run_until_idle()` steps in the caller's thread until
each has finished. A request reports through `on_token(token_id, TokenLogprobs or None)` and
`on_finish(reason)`, called through the engine's `deliver`: by default at once, in the engine thread; the
server's hands each step's calls to its event loop together (one wake-up a step, not one a token). With
`speculation`, a decoding row also feeds guessed tokens and keeps those its sampler confirms
(speculation.py, draft.py).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

from lite_runtime.backends.base import Session
from lite_runtime.backends.kv_cache import PackedKVCache
from lite_runtime.backends.paged_cache import PagedKVCache
from lite_runtime.contract.errors import ConfigError
from lite_runtime.decode.output import OutputStage, TokenLogprobs
from lite_runtime.decode.prefix_cache import BLOCK, PagedPrefixCache, PrefixCache
from lite_runtime.decode.runner import StepRunner
from lite_runtime.decode.sampling import Sampler, SamplingParams
from lite_runtime.decode.scheduler import PREFILL_CHUNK, EngineLimits, Row, Scheduler
from lite_runtime.decode.speculation import Speculation

log = logging.getLogger("lite_runtime.engine")

__all__ = ["Engine", "EngineRequest", "QueueFull", "TokenLogprobs", "call_each", "PREFILL_CHUNK"]


def call_each(calls: list) -> None:
    for callback, args in calls:
        callback(*args)


class QueueFull(Exception):
    """The engine's waiting queue is full: answer the client at once (429)."""


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


def _request(item) -> EngineRequest:
    """A waiting item's request (a preempted row waits as itself)."""
    return item.request if isinstance(item, Row) else item


class Engine:
    """Owns `session` (a packed export's session) and schedules requests onto its rows."""

    def __init__(self, session, max_waiting: int = 64, prefill_chunk: int = PREFILL_CHUNK, metrics=None,
                 max_step_tokens: int = PackedKVCache.max_tokens, threaded: bool = True,
                 prefix_cache_bytes: Optional[int] = 0, speculation: Optional[Speculation] = None):
        """`prefix_cache_bytes` > 0 keeps recent prompts' K/V up to that size and reuses their shared
        prefixes (prefix_cache.py): on one rank's session, for families whose prompts attend causally. None: within
        the paged store where there is one (cached prompts keep blocks no row holds until a row needs them), else
        none.
        `speculation` guesses tokens (prompt lookup or a draft export), verified in the step (speculation.py)."""
        self.limits = EngineLimits.of(session.manifest, "serving")
        self.session = session
        self.seq_length = self.limits.seq_length
        self.max_waiting = max_waiting
        self.metrics = metrics
        self.prefix = self._prefix_cache(session, prefix_cache_bytes) if prefix_cache_bytes != 0 else None
        self.scheduler = Scheduler(self.limits, getattr(session, "cache", None), prefill_chunk, max_step_tokens)
        self.runner = StepRunner(session, self.limits)
        self.output = OutputStage(self.scheduler, self._tell, self.prefix, metrics)
        self.speculation = speculation
        self.counted = self        # whose rows and queue the metrics report (Replicas: all of them)
        self._wake = threading.Condition()
        self._stopping = False     # no new requests
        self._exit = False         # the engine thread ends
        self._preemptions_seen = 0
        self.step_seconds = 0.0    # wall time in steps: less the session's graph_seconds, the host's share
        # How the requests' callbacks run: given [(callback, args)] in order, those of a step together.
        self.deliver: Callable[[list], None] = call_each
        self._told: Optional[Tuple[int, list]] = None    # (the stepping thread, the step's callbacks so far)
        self._thread = None
        if threaded:
            self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
            self._thread.start()

    @property
    def waiting(self):
        return self.scheduler.waiting

    @property
    def replicas(self) -> list:
        """The engines that answer (distributed/replicas.py's several behind one endpoint)."""
        return [self]

    @property
    def steps(self) -> int:
        return self.runner.steps

    @property
    def speculated(self):
        return self.output.speculated

    @property
    def pick_seconds(self) -> float:
        return self.output.pick_seconds

    def summary(self) -> str:
        """Its steps so far: their time, the graph calls' part and the host's share of the rest (where the
        session times its calls: not a data-parallel replica's remote one)."""
        graph, total = getattr(self.session, "graph_seconds", None), self.step_seconds
        if graph is None:
            return f"{self.steps} steps in {total:.2f} s (sampling {self.pick_seconds:.2f} s)"
        share = f"{1 - graph / total:.1%}" if total else "-"
        return (f"{self.steps} steps in {total:.2f} s, of which the graph calls {graph:.2f} s: the host's share "
                f"{share} (sampling {self.pick_seconds:.2f} s)")

    def _prefix_cache(self, session, max_bytes: Optional[int]) -> Optional[PrefixCache]:
        if max_bytes is None:        # by default: where the store holds it by reference
            paged = isinstance(getattr(session, "cache", None), PagedKVCache)
            if not isinstance(session, Session) or self.limits.whole_prompts or not paged:
                return None
        if not isinstance(session, Session):
            raise ConfigError("prefix caching keeps the K/V of one rank's session; this engine drives several ranks "
                              f"({session.runtime}): serve without --prefix_cache_gb")
        if self.limits.whole_prompts:
            raise ConfigError(f"prefix caching needs prompts whose K/V depend only on the tokens before them; a "
                              f"{session.manifest.family} prompt attends both ways: serve without --prefix_cache_gb")
        if isinstance(session.cache, PagedKVCache):     # shared by reference: its blocks
            return PagedPrefixCache(session.cache, max_bytes)
        return PrefixCache(session.cache, max_bytes)

    # --- called from any thread ------------------------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        self.limits.check_prompt(request.prompt)
        with self._wake:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            free_rows = self.scheduler.rows.count(None)       # requests for them are admitted at the next step
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
            self._abort_waiting()
            self._wake.notify()
        deadline = time.perf_counter() + timeout
        while self.busy_rows() and time.perf_counter() < deadline:
            time.sleep(0.02)
        with self._wake:
            self._exit = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for slot in self.scheduler.live():     # what the timeout cut short is told so
            self.output.finish(slot, "abort")
        self._abort_waiting()

    def _abort_waiting(self) -> None:
        while self.waiting:
            self._tell(_request(self.waiting.popleft()).on_finish, "abort")

    def busy_rows(self) -> int:
        return self.scheduler.busy()

    # --- the engine thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._exit and not self.scheduler.has_work():
                    self._wake.wait()
                if self._exit:
                    return
                self._admit()
            try:
                self._step()
            except Exception as e:   # a failing graph ends every running request, not the server
                log.exception("engine step failed")
                for slot in self.scheduler.live():
                    self.output.finish(slot, f"error: {e}")
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
        if not self.scheduler.busy():
            return False
        self._step()
        return True

    def _admit(self) -> None:
        while (slot := self.scheduler.next_admission()) is not None:
            item = self.waiting[0]
            request = _request(item)
            if request.cancelled:
                self.waiting.popleft()
                self._tell(request.on_finish, "cancelled")
                continue
            row = item if isinstance(item, Row) else Row(
                request, Sampler(request.sampling, request.stop_ids, request.constraint), list(request.prompt),
                row_values=self.runner.row_values(request.prompt))
            if self._shared_later(row):
                self.waiting[0] = row
                return
            cached = self.prefix.load(slot, request.adapter_slot, row.tokens) if self.prefix else 0
            row.past, row.pending = cached, list(row.tokens[cached:])
            if not self.scheduler.place(slot, row):
                self.waiting[0] = row          # waits for blocks, built once
                return
            self.waiting.popleft()
            if request.admitted is None:
                request.admitted, request.cached_tokens = time.perf_counter(), cached
                if self.metrics is not None:
                    self.metrics.queue_time.observe(request.admitted - request.arrived)
            if self.metrics is not None and self.prefix is not None:
                self.metrics.prefix_cache(cached, self.prefix)

    def _shared_later(self, row: Row) -> bool:
        """Whether a running row is computing more of `row`'s prompt than the prefix cache holds now: `row` waits
        for those blocks (stored as they are computed) rather than compute them too. So chats that arrive
        together with one system prompt compute it once; the queue behind waits with it."""
        if self.prefix is None or not self.prefix.progressive:
            return False
        slot, tokens = row.request.adapter_slot, row.tokens
        return self.scheduler.computing(tokens, slot, BLOCK) > self.prefix.peek(slot, tokens)

    def _step(self) -> None:
        self._told, start = (threading.get_ident(), []), time.perf_counter()
        try:
            self._run_step()
        finally:
            told, self._told = self._told[1], None
            if told:
                self.deliver(told)
            self.step_seconds += time.perf_counter() - start

    def _tell(self, callback: Callable, *args) -> None:
        """Call a request's callback: with the step's others when the engine is stepping in this thread."""
        if self._told is not None and self._told[0] == threading.get_ident():
            self._told[1].append((callback, args))
        else:
            self.deliver([(callback, args)])

    def _run_step(self) -> None:
        for slot in self.scheduler.live():
            if self.scheduler.rows[slot].request.cancelled:
                self.output.finish(slot, "cancelled")
        self._guess()
        plan = self.scheduler.plan()
        if plan is None:
            return
        logits, first = self.runner.run(plan, self.scheduler.rows)
        self.output.apply(plan, logits, first)

    def _guess(self) -> None:
        """Each decoding row's guesses for this step (none for a row whose grammar must see each token)."""
        if self.speculation is None:
            return
        asked, rows = {}, self.scheduler.rows
        for i in self.scheduler.live():
            row = rows[i]
            if row.generated and row.request.constraint is None:
                asked[i] = (row.tokens, min(self.seq_length - row.past - len(row.pending),
                                            row.request.max_tokens - row.generated - 1))
        for i, guesses in self.speculation.guess(asked).items():
            rows[i].guesses = guesses

    def _observe(self) -> None:
        if self.metrics is None:
            return
        self.metrics.running.set(self.counted.busy_rows())
        self.metrics.waiting.set(len(self.counted.waiting))
        blocks = self.scheduler.blocks
        if blocks is not None:
            preempted, self._preemptions_seen = self.scheduler.preemptions - self._preemptions_seen, \
                self.scheduler.preemptions
            self.metrics.kv_cache(blocks.held_blocks, blocks.total_blocks, blocks.block_bytes, preempted)
