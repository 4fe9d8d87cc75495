"""The decode loop in small named pieces: batch preparation, prefill, one decode step, and a
generator yielding each step's tokens. Backend-agnostic: it talks to a `Session` only.

Graphs have a static batch size: `generate_batches` pads a short request with inert rows and runs
a long one in successive batches, so callers never see the graph batch size.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence

import numpy as np

from lite_runtime.backends.base import Session
from lite_runtime.contract.errors import ValidationError
from lite_runtime.decode.inputs import BaseInputsOfInfer
from lite_runtime.decode.scheduler import context_room


@dataclass
class DecodeState:
    """Per-row bookkeeping of one batch: token buffer, valid lengths, budgets, finished flags."""
    ids: np.ndarray          # (B, S) int32: prompt then generated tokens, padding after
    lengths: np.ndarray      # (B,) int32: real tokens in `ids` (= tokens in the cache after feeding)
    budget: np.ndarray       # (B,) int32: new tokens each row may still produce
    done: np.ndarray         # (B,) bool
    eos_ids: np.ndarray      # (E,) int32
    pad_id: int
    prompt_lengths: Optional[np.ndarray] = None   # (B,) int32: where each row's generated tokens start
    adapter_ids: Optional[np.ndarray] = None   # (B,) int32: SLoRA exports' per-row adapter slot (0: base)
    row_inputs: List[np.ndarray] = field(default_factory=list)   # the family's own (B,) int32 inputs (GLM's)


@dataclass(frozen=True)
class Step:
    """One decode step: `tokens` (B,) and `active` (B,) marking rows that produced a new token."""
    tokens: np.ndarray
    active: np.ndarray


def prepare_batch(prompts: Sequence[Sequence[int]], batch_size: int, seq_length: int,
                  max_new: Sequence[int], eos_ids: Sequence[int], pad_id: int,
                  adapters: Optional[Sequence[int]] = None, inputs: Optional[BaseInputsOfInfer] = None) -> DecodeState:
    """Right-pad `prompts` into a (batch_size, seq_length) buffer; missing rows are inert (and use
    adapter slot 0 when `adapters`, each prompt's SLoRA slot, are given). `inputs`, the family's feed
    builder, computes the rows' own graph inputs here, once (needed where the family has them)."""
    if len(prompts) > batch_size:
        raise ValueError(f"{len(prompts)} prompts for a batch of {batch_size}")
    ids = np.full((batch_size, seq_length), pad_id, np.int32)
    lengths = np.ones(batch_size, np.int32)
    budget = np.zeros(batch_size, np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, :len(prompt)] = prompt
        lengths[row] = len(prompt)
        budget[row] = max_new[row]
    slots = None
    if adapters is not None:
        slots = np.zeros(batch_size, np.int32)
        slots[:len(prompts)] = adapters
    rows = [] if inputs is None else inputs.row_inputs(ids, lengths)
    return DecodeState(ids, lengths, budget, budget <= 0, np.asarray(list(eos_ids), np.int32), pad_id, lengths.copy(),
                       slots, rows)


def generate_steps(session: Session, inputs: BaseInputsOfInfer, state: DecodeState,
                   pick: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> Iterator[Step]:
    """Prefill, then one increment per step; yields until every row is done.

    `pick(logits, ids, lengths, prompt_lengths) -> (B,) int32` chooses the next tokens (the
    request's sampler).
    Finished rows no longer change: they are fed padding and their length stays put.
    """
    rows = np.arange(len(state.lengths))
    extra = [] if state.adapter_ids is None else [state.adapter_ids]      # graph inputs after the family's
    logits = session.prefill(*inputs.prefill_inputs(state.ids, state.lengths, state.row_inputs), *extra)
    step_ids = np.empty((len(rows), 1), np.int32)
    while not state.done.all():
        tokens = pick(logits, state.ids, state.lengths, state.prompt_lengths)
        active = ~state.done
        tokens = np.where(active, tokens, state.pad_id).astype(np.int32)
        stored = active & (state.lengths < state.ids.shape[1])   # a row's very last token needs no slot
        state.ids[rows[stored], state.lengths[stored]] = tokens[stored]
        state.budget -= active
        state.done = state.done | (state.budget <= 0) | np.isin(tokens, state.eos_ids)
        yield Step(tokens, active)
        if state.done.all():
            return
        state.lengths += ~state.done
        step_ids[:, 0] = np.where(state.done, state.pad_id, tokens)
        logits = session.decode(*inputs.decode_inputs(step_ids, state.lengths, state.row_inputs), *extra)


def _each_row(samplers: Sequence[Callable]) -> Callable:
    """generate_steps' `pick` from one sampler per row (the padding rows after them pick 0: they are inactive)."""
    def pick(logits, ids, lengths, prompt_lengths):
        out = np.zeros(len(logits), np.int32)
        for r, sampler in enumerate(samplers):
            out[r] = sampler(logits[r:r + 1], ids[r:r + 1], lengths[r:r + 1],
                             None if prompt_lengths is None else prompt_lengths[r:r + 1])[0]
        return out
    return pick


def row_budgets(prompt_lengths: Sequence[int], seq_length: int, max_new_tokens: Optional[int],
                max_length: Optional[int]) -> List[int]:
    """New tokens each row may produce: within max_new_tokens, max_length (prompt + new) and the
    export's seq_length (scheduler.context_room)."""
    budgets = []
    for n in prompt_lengths:
        limit = context_room(seq_length, n)
        if max_new_tokens is not None:
            limit = min(limit, max_new_tokens)
        if max_length is not None:
            limit = min(limit, max_length - n)
        budgets.append(max(limit, 0))
    return budgets


def check_prompts(prompts: Sequence[Sequence[int]], seq_length: int, truncate: bool,
                  log_truncation: Callable[[str], None], truncate_option: str = "truncate=True") -> List[List[int]]:
    """Refuse empty and over-long prompts, or keep the last seq_length-1 tokens when asked;
    `truncate_option`: how the caller's surface spells that request (pipeline()'s keyword, a command's option)."""
    checked = []
    for i, prompt in enumerate(prompts):
        prompt = list(prompt)
        if not prompt:
            raise ValidationError(f"prompt {i} is empty after tokenisation; give at least one token")
        if len(prompt) >= seq_length:
            if not truncate:
                raise ValidationError(
                    f"prompt {i} has {len(prompt)} tokens but the graph's seq_length is {seq_length} "
                    f"(at most {seq_length - 1} prompt tokens leave room to generate); shorten it, "
                    f"export with a larger seq_length, or pass {truncate_option} to keep its last tokens")
            dropped = len(prompt) - (seq_length - 1)
            log_truncation(f"prompt {i}: dropped its first {dropped} of {len(prompt)} tokens to fit "
                           f"seq_length {seq_length}")
            prompt = prompt[dropped:]
        checked.append(prompt)
    return checked


def generate_batches(session: Session, inputs: BaseInputsOfInfer, prompts: List[List[int]],
                     budgets: List[int], eos_ids: Sequence[int], pad_id: int,
                     pick: Callable, on_step: Optional[Callable] = None,
                     adapters: Optional[List[int]] = None) -> List[List[int]]:
    """New token ids of every prompt (EOS included when produced), any number of prompts.

    `pick` picks every row's token (a function of generate_steps', e.g. one Sampler for all), or is one Sampler
    per prompt (each row's own, seeded as the engine's: the same text as the packed forms); `on_step(offset, step)`
    sees each step (offset = index of the batch's first prompt), for streaming; `adapters`: each prompt's SLoRA slot (an SLoRA export needs them).
    """
    m = session.manifest
    if adapters is None and m.dims.adapter_slots:     # an SLoRA export without a choice: the base model
        adapters = [0] * len(prompts)
    results: List[List[int]] = [[] for _ in prompts]
    for start in range(0, len(prompts), m.batch_size):
        chunk = prompts[start:start + m.batch_size]
        state = prepare_batch(chunk, m.batch_size, m.seq_length, budgets[start:start + len(chunk)],
                              eos_ids, pad_id, None if adapters is None else adapters[start:start + len(chunk)], inputs)
        chunk_pick = pick if callable(pick) else _each_row(pick[start:start + len(chunk)])
        for step in generate_steps(session, inputs, state, chunk_pick):
            for row in np.flatnonzero(step.active[:len(chunk)]):
                results[start + row].append(int(step.tokens[row]))
            if on_step is not None:
                on_step(start, step)
    return results
