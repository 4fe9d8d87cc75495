"""The decode loop (lite_runtime/decode/generation.py) on a numpy stand-in session: a unit test of its
call wiring, no graph runs. The real end-to-end runs are in the parity and family tests.

`HistoryModel` is the stand-in: it keeps each row's tokens as a KV cache keeps them (the prefill's
prompts, then each decode step's token written at position length - 1) and answers with the token a
fixed rule gives for the whole history it holds, so a token fed at a wrong position or with a wrong
length changes what follows. `reference` applies the same rule in a plain Python loop, without the
loop's batches, budgets arrays or padding: the independent expectation.
"""
from types import SimpleNamespace

import numpy as np
import pytest

from lite_runtime.contract.errors import ValidationError
from lite_runtime.decode.generation import (check_prompts, generate_batches, generate_steps, prepare_batch,
                                            row_budgets)
from lite_runtime.decode.inputs import CommonInputsOfInfer

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

VOCAB, PAD = 50, 0


def rule(history):
    """The stand-in model's next token for a row holding `history` (every token counts)."""
    return (7 * sum(history) + len(history)) % (VOCAB - 1) + 1     # never the pad id 0


def reference(prompt, budget, eos=()):
    """What the loop must produce for one prompt: a plain loop over `rule`."""
    history, out = list(prompt), []
    while len(out) < budget:
        token = rule(history)
        out.append(token)
        if token in eos:
            break
        history.append(token)
    return out


class HistoryModel:
    """Stand-in for a session (call wiring only): a numpy 'KV cache' of token ids and one-hot logits."""

    def __init__(self, batch_size, seq_length):
        self.manifest = SimpleNamespace(batch_size=batch_size, seq_length=seq_length,
                                        dims=SimpleNamespace(adapter_slots=0))
        self.cache = np.full((batch_size, seq_length), -1, np.int64)
        self.calls = []          # ("prefill" | "decode", ids copy, lengths copy)

    def _logits(self, lengths):
        logits = np.zeros((len(lengths), VOCAB), np.float32)
        for row, n in enumerate(lengths):
            logits[row, rule(self.cache[row, :n].tolist())] = 1.0
        return logits

    def prefill(self, ids, lengths):
        self.calls.append(("prefill", ids.copy(), lengths.copy()))
        self.cache[:] = -1
        for row, n in enumerate(lengths):
            self.cache[row, :n] = ids[row, :n]
        return self._logits(lengths)

    def decode(self, step_ids, lengths):
        self.calls.append(("decode", step_ids.copy(), lengths.copy()))
        assert step_ids.shape == (len(lengths), 1) and (lengths <= self.cache.shape[1]).all(), lengths
        self.cache[np.arange(len(lengths)), lengths - 1] = step_ids[:, 0]
        return self._logits(lengths)


def greedy(logits, ids, lengths, prompt_lengths=None):
    return logits.argmax(-1).astype(np.int32)


def run(prompts, budgets, batch_size=3, seq_length=12, eos=(), on_step=None):
    model = HistoryModel(batch_size, seq_length)
    out = generate_batches(model, CommonInputsOfInfer(), prompts, budgets, eos, PAD, greedy, on_step)
    return out, model


PROMPTS = [[5, 9, 2], [11], [3, 4, 8, 8, 1], [20, 21], [7, 7, 7, 7]]


def test_each_row_continues_as_the_plain_loop_and_stops_at_its_own_budget():
    budgets = [4, 1, 6, 0, 3]
    out, model = run(PROMPTS, budgets, batch_size=5)
    assert out == [reference(p, b) for p, b in zip(PROMPTS, budgets)]
    assert out[3] == []                                  # a zero budget: done before the first step
    assert [kind for kind, _, _ in model.calls] == ["prefill"] + ["decode"] * 5   # the longest budget: 6 tokens


def test_padding_rows_are_inert_and_finished_rows_are_fed_padding_at_a_fixed_length():
    out, model = run(PROMPTS[:2], [2, 5], batch_size=4)
    assert out == [reference(PROMPTS[0], 2), reference(PROMPTS[1], 5)]
    prefill_ids, prefill_lengths = model.calls[0][1], model.calls[0][2]
    assert (prefill_ids[2:] == PAD).all() and prefill_lengths.tolist() == [3, 1, 1, 1]
    decodes = [(ids[:, 0], lengths) for kind, ids, lengths in model.calls if kind == "decode"]
    assert len(decodes) == 4
    for step, (ids, lengths) in enumerate(decodes):
        assert (ids[2:] == PAD).all() and (lengths[2:] == 1).all()           # padding rows never move
        assert lengths[1] == 2 + step                                         # the running row grows by one
        if step >= 1:                                                         # row 0 finished after 2 tokens
            assert ids[0] == PAD and lengths[0] == 4


def test_eos_ends_its_row_only_and_is_returned():
    free = [reference(p, 6) for p in PROMPTS[:3]]
    eos = free[0][2]                      # row 0's third token, made an end-of-sequence id
    assert eos not in free[0][:2]
    out, model = run(PROMPTS[:3], [6, 6, 6], eos=[eos])
    assert out == [reference(p, 6, eos=[eos]) for p in PROMPTS[:3]]
    assert out[0] == free[0][:3]
    assert any(len(o) > 3 for o in out[1:]), out   # the others went on
    last_lengths = model.calls[-1][2]
    assert last_lengths[0] == len(PROMPTS[0]) + 2  # EOS was never fed back


def test_the_last_token_of_a_full_row_needs_no_cache_slot():
    """The loop can fill every slot and pick one more (the entry points allow seq_length - n: row_budgets)."""
    seq_length = 8
    prompt = [4, 6, 1]
    budget = seq_length - len(prompt) + 1       # 6: five stored behind the prompt, the last not
    state = prepare_batch([prompt], 1, seq_length, [budget], [], PAD)
    model = HistoryModel(1, seq_length)
    tokens = [int(step.tokens[0]) for step in generate_steps(model, CommonInputsOfInfer(), state, greedy)]
    assert tokens == reference(prompt, budget)
    assert state.ids[0].tolist() == prompt + tokens[:-1]          # the buffer is full; the last token is not in it
    assert max(lengths.max() for _, _, lengths in model.calls) == seq_length
    assert sum(kind == "decode" for kind, _, _ in model.calls) == budget - 1


@pytest.mark.parametrize("lengths, seq_length, max_new, max_length, expected", [
    ([3, 7], 8, None, None, [5, 1]),          # the export: prompt + new <= seq_length
    ([3, 7], 8, 4, None, [4, 1]),             # max_new_tokens
    ([3, 7], 8, None, 6, [3, 0]),             # max_length counts the prompt; nothing left is 0, not negative
    ([3, 7], 8, 2, 4, [1, 0]),                # the smallest limit wins
])
def test_row_budgets(lengths, seq_length, max_new, max_length, expected):
    assert row_budgets(lengths, seq_length, max_new, max_length) == expected


def test_the_default_length_limit_gives_way_to_max_new_tokens():
    """A call that gives max_new_tokens is not refused for the default max_length (a 2,000-token prompt with
    max_new_tokens=8 was: 'max_length is 256'); given, max_length still binds."""
    from lite_runtime.api.generation_options import DEFAULT_MAX_LENGTH, GenerationOptions
    assert GenerationOptions().length_limit() == DEFAULT_MAX_LENGTH
    assert GenerationOptions(max_new_tokens=8).length_limit() is None
    assert GenerationOptions(max_new_tokens=8, max_length=100).length_limit() == 100
    assert row_budgets([2000], 4096, 8, GenerationOptions(max_new_tokens=8).length_limit()) == [8]


def test_streaming_offsets_name_each_batch_first_prompt():
    seen = {}

    def on_step(offset, step):
        for row in np.flatnonzero(step.active):
            seen.setdefault(offset + row, []).append(int(step.tokens[row]))
    budgets = [3, 2, 4, 1, 2]
    out, _ = run(PROMPTS, budgets, batch_size=2, on_step=on_step)     # batches of prompts 0-1, 2-3, 4
    assert out == [reference(p, b) for p, b in zip(PROMPTS, budgets)]
    assert [seen[i] for i in range(len(PROMPTS))] == out
    assert sorted(seen) == list(range(len(PROMPTS)))         # the last batch's padding row streamed nothing


def test_prompts_are_checked_or_truncated_to_leave_room():
    notes = []
    assert check_prompts([[1, 2, 3, 4, 5, 6, 7, 8, 9]], 8, True, notes.append) == [[3, 4, 5, 6, 7, 8, 9]]
    assert notes == ["prompt 0: dropped its first 2 of 9 tokens to fit seq_length 8"]
    with pytest.raises(ValidationError, match="prompt 1 has 8 tokens but the graph's seq_length is 8"):
        check_prompts([[1], list(range(8))], 8, False, notes.append)
    with pytest.raises(ValidationError, match="prompt 0 is empty after tokenisation"):
        check_prompts([[]], 8, False, notes.append)
