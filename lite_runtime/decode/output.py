"""The engine's output stage: after a step's call, each row's tokens chosen by its sampler (guesses verified),
handed to its request, finished requests' rows given back, and prompts just cached kept by the prefix cache."""
from __future__ import annotations

import time
from typing import Callable, NamedTuple, Optional, List, Tuple

import numpy as np

from lite_runtime.decode.sampling import token_logprobs
from lite_runtime.decode.scheduler import Row, Scheduler, StepPlan
from lite_runtime.decode.speculation import SpeculationStats


class TokenLogprobs(NamedTuple):
    """The chosen token's log-probability under the model, and the `top` most likely tokens' (id, logprob)."""
    logprob: float
    top: List[Tuple[int, float]]


class OutputStage:
    def __init__(self, scheduler: Scheduler, tell: Callable, prefix=None, metrics=None):
        self.scheduler, self.tell, self.prefix, self.metrics = scheduler, tell, prefix, metrics
        self.speculated = SpeculationStats()
        self.pick_seconds = 0.0    # host time in the rows' samplers (benchmarks)

    def apply(self, plan: StepPlan, logits: np.ndarray, first: np.ndarray) -> None:
        for i in plan.live:
            row = self.scheduler.rows[i]
            if not plan.picks[i]:        # the prompt's next chunk comes at the next step (or the row's turn)
                row.past += int(plan.counts[i])
                del row.pending[:int(plan.counts[i])]
                row.guesses = []
                if self.prefix is not None and self.prefix.progressive:     # the whole blocks computed so far
                    self.prefix.store(i, row.request.adapter_slot, row.tokens[:row.past])
                continue
            row.past += len(row.pending)
            if self.prefix is not None and row.generated == 0:      # the whole prompt is in the cache now
                self.prefix.store(i, row.request.adapter_slot, row.request.prompt)
                if self.metrics is not None:
                    self.metrics.prefix_cache(0, self.prefix)
            guesses, row.guesses, confirmed = row.guesses, [], 0
            for j in range(int(plan.picks[i])):
                row.past += j > 0               # the guess confirmed last is in the cache
                token, logprob = self.pick(row, logits[first[i] + j:first[i] + j + 1])
                hit = j < len(guesses) and token == guesses[j]
                confirmed += hit
                if self.emit(i, token, logprob) or not hit:
                    break
            self.speculated.add(len(guesses), confirmed, self.metrics)

    def emit(self, slot: int, token: int, logprob) -> bool:
        """Hand the row's next token to its request; True when that finished it."""
        row = self.scheduler.rows[slot]
        row.tokens.append(token)
        row.pending = [token]
        row.generated += 1
        self.tell(row.request.on_token, token, logprob)
        reason = None
        if token in row.request.stop_ids:
            reason = "stop"
        elif row.generated >= row.request.max_tokens or len(row.tokens) >= self.scheduler.limits.seq_length:
            reason = "length"
        if reason:
            self.finish(slot, reason)
        return reason is not None

    def pick(self, row: Row, logits: np.ndarray):
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

    def finish(self, slot: int, reason: str) -> None:
        row: Optional[Row] = self.scheduler.remove(slot)
        self.tell(row.request.on_finish, reason)
