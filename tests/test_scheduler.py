"""The engine's scheduler alone (pure bookkeeping, no graph): admission within the paged store's blocks,
preemption of the newest row when a step needs blocks none has free, and every block back at the end.
The store is the runtime's own `PagedKVCache` over a manifest made here (its K/V store is made only by a
graph call, which these tests never make)."""
from types import SimpleNamespace

import numpy as np
import pytest

from lite_runtime.backends.paged_cache import PagedKVCache
from lite_runtime.contract.errors import ConfigError, ValidationError
from lite_runtime.contract.families import DYNAMIC, STEP, GraphDims, TensorSpec
from lite_runtime.contract.manifest import GraphEntry, Manifest
from lite_runtime.contract.quant import PAGED_ATTEND_TYPE
from lite_runtime.decode.runner import StepRunner
from lite_runtime.decode.scheduler import EngineLimits, Row, Scheduler

pytestmark = pytest.mark.fast

ROWS, SEQ, BLOCK = 4, 128, 16


def manifest(rows=ROWS, kv_cache="packed"):
    dims = GraphDims(rows, SEQ, 2, 2, 16, 400, kv_block=BLOCK)
    step = GraphEntry([], [TensorSpec("last_token", "int32", (DYNAMIC,))], [])
    return Manifest("llama", {}, dims.to_json(), kv_cache, SEQ, rows, 1, "float32", {STEP: step}, 1, [2], 0, None,
                    "", "", kernels=[PAGED_ATTEND_TYPE], root="made-in-test")


def scheduler(blocks=None, rows=ROWS, **kw):
    m = manifest(rows)
    cache = PagedKVCache(m)
    if blocks is not None:
        cache.configure("float16", blocks * cache.block_bytes)
    limits = EngineLimits(rows, SEQ, False, None, 0, False)
    return Scheduler(limits, cache, **kw), cache


def request(n):
    return SimpleNamespace(prompt=list(range(1, n + 1)), adapter_slot=0)


def admit(s, n):
    row = Row(request(n), None, list(range(1, n + 1)), pending=list(range(1, n + 1)))
    s.waiting.append(row)
    slot = s.next_admission()
    assert s.place(slot, row)
    s.waiting.popleft()
    return slot


def run(s, cache, plan):
    """What the runner and output stage do to the bookkeeping: the cache holds the fed positions, each fed
    row moves on, a row that fed its last pending token 'generates' one more."""
    for i in plan.live:
        cache._hold(i, int(plan.past[i] + plan.counts[i]), int(plan.past[i]) if plan.counts[i] else None)
    for i in plan.live:
        row = s.rows[i]
        row.past += int(plan.counts[i])
        del row.pending[:int(plan.counts[i])]
        if not row.pending:
            row.tokens.append(7)
            row.pending = [7]
            row.generated += 1


def test_a_budget_below_one_sequence_is_refused_naming_the_numbers():
    cache = PagedKVCache(manifest())
    with pytest.raises(ConfigError) as info:
        cache.configure("float16", 7.5 * cache.block_bytes)
    text = str(info.value)
    assert "kv_cache_gb" in text and "holds 7 blocks" in text and "seq_length 128 needs 8" in text, text
    assert "(3.1e-05 GiB): allowed: 3.1e-05 or more" in text, text       # 8 blocks of 4 KiB, rounded up


def test_the_plan_feeds_prompts_in_chunks_beside_decoding_rows_and_whole_alone():
    s, _ = scheduler(prefill_chunk=32)
    a = admit(s, 300 % SEQ)
    plan = s.plan()
    assert plan.counts[a] == 44 and plan.picks[a] == 1        # alone: whole (below lone_chunk)
    b = admit(s, 100)
    s.rows[a].pending, s.rows[a].past = [5], 44
    plan = s.plan()
    assert plan.counts[a] == 1 and plan.counts[b] == 32 and plan.picks[b] == 0 and plan.picks[a] == 1


class PickingSession:
    """A stand-in for the runner's call wiring only: records the picks asked for and returns, for each pick, a
    row of logits holding the number of the cache row it is for."""

    def __init__(self, m):
        self.manifest, self.asked = m, []

    def verify(self, tokens, counts, past, picks, *extra):
        self.asked.append(np.array(picks))
        return np.repeat(np.arange(len(picks)), picks)[:, None] * np.ones((1, 5), np.float32)


def test_the_runner_asks_for_the_picked_rows_logits_only():
    """A decoding row beside a prompt's middle chunk in a 4-row export: one row of logits, the decoding row's
    (not one a row of the export, nor one for the chunk)."""
    s, _ = scheduler(prefill_chunk=32)
    a = admit(s, 44)
    b = admit(s, 100)
    s.rows[a].pending, s.rows[a].past = [5], 44
    plan = s.plan()
    session = PickingSession(manifest())
    logits, first = StepRunner(session, s.limits).run(plan, s.rows)
    assert list(session.asked[0]) == [1 if i == a else 0 for i in range(ROWS)] and plan.counts[b] == 32
    assert logits.shape == (1, 5) and logits[first[a], 0] == a


def test_a_prompt_alone_goes_in_lone_chunks_on_the_paged_store_and_whole_on_host_arrays():
    s, _ = scheduler(prefill_chunk=8, lone_chunk=32)
    a = admit(s, 100)
    plan = s.plan()
    assert plan.counts[a] == 32 and plan.picks[a] == 0        # no logits until its last chunk
    s.rows[a].pending, s.rows[a].past = s.rows[a].pending[96:], 96
    plan = s.plan()
    assert plan.counts[a] == 4 and plan.picks[a] == 1
    host = Scheduler(EngineLimits(ROWS, SEQ, False, None, 0, False), None, 8, lone_chunk=32)
    b = admit(host, 100)
    assert host.plan().counts[b] == 100


def test_the_newest_row_is_preempted_when_blocks_run_out_and_fed_again_whole():
    s, cache = scheduler(blocks=10)          # 10 blocks of 16: two 70-token rows do not fit
    first, second = admit(s, 60), admit(s, 60)
    assert cache.total_blocks == 10
    run(s, cache, s.plan())                  # 4 + 4 blocks
    while s.preemptions == 0:
        plan = s.plan()
        run(s, cache, plan)
    assert s.rows[second] is None and s.rows[first] is not None
    waiting = s.waiting[0]
    assert isinstance(waiting, Row) and waiting.past == 0 and waiting.pending == waiting.tokens
    assert waiting.generated > 0 and len(waiting.tokens) == 60 + waiting.generated
    assert cache.held[second] == [] and cache.held_blocks == len(cache.held[first])
    assert s.next_admission() == second and not s.place(second, waiting)   # no room for it yet
    s.remove(first)
    assert cache.held_blocks == 0 and len(cache.free) == 10


def test_a_long_prompt_waits_while_the_store_has_no_room_for_its_first_chunk():
    s, cache = scheduler(blocks=8, prefill_chunk=64)
    a = admit(s, 100)
    run(s, cache, s.plan())                                  # 7 blocks held
    row = Row(request(50), None, list(range(50)), pending=list(range(50)))
    s.waiting.append(row)
    slot = s.next_admission()
    assert not s.place(slot, row) and s.rows[slot] is None and cache.held[slot] == []
    s.remove(a)
    assert s.place(slot, row)


def test_the_limits_refuse_a_prompt_with_no_room_and_an_export_without_the_step_graph():
    limits = EngineLimits.of(manifest())
    with pytest.raises(ValidationError, match="at most 127 prompt tokens"):
        limits.check_prompt(list(range(128)))
    io = manifest(kv_cache="io")
    with pytest.raises(Exception, match="serving needs an export with kv_cache packed.*'io'"):
        EngineLimits.of(io, "serving")


def test_a_request_may_wait_only_for_shared_blocks_a_row_has_still_to_compute():
    s, cache = scheduler(prefill_chunk=32)
    a = admit(s, 100)                        # tokens 1 .. 100, its prompt not fed yet
    shares = list(range(1, 61)) + [999, 998]
    assert s.computing(shares, 0, BLOCK) == 48         # 60 shared tokens: 3 whole blocks
    assert s.computing(shares, 1, BLOCK) == 0          # another adapter's K/V differ
    assert s.computing(list(range(1, 40)), 0, BLOCK) == 32     # all but its last token at most
    assert s.computing([5] + shares[1:], 0, BLOCK) == 0
    s.rows[a].past, s.rows[a].pending = 48, s.rows[a].pending[48:]
    assert s.computing(shares, 0, BLOCK) == 0          # computed already (the prefix cache has them)
    s.rows[a].past, s.rows[a].pending = 99, [100]
    assert s.computing(list(range(1, 101)) + [7], 0, BLOCK) == 0   # decoding: its prompt is done


def test_the_prefix_cache_stores_a_prompt_as_computed_and_keeps_each_block_once():
    from lite_runtime.decode.prefix_cache import PagedPrefixCache
    cache = PagedKVCache(manifest())
    prefix = PagedPrefixCache(cache, 64 * cache.block_bytes)
    tokens = list(range(1, 101))
    cache._hold(0, 40, 0)                    # row 0's first chunk: 2 whole blocks
    prefix.store(0, 0, tokens[:40])
    cache._hold(0, 80, 40)
    prefix.store(0, 0, tokens[:80])          # replaces the entry of the chunk before
    assert len(prefix._entries) == 1 and prefix.bytes == 5 * cache.block_bytes
    assert prefix.peek(0, tokens[:90]) == 80 and prefix.peek(0, tokens[:80]) == 64 and prefix.peek(1, tokens) == 0
    assert [cache.refs[b] for b in cache.held[0]] == [2] * 5
    cache._hold(1, 96, 0)                    # row 1 computed the same prompt on its own, and more
    prefix.store(1, 0, tokens[:96])          # its entry extends row 0's: that one's blocks are dropped
    assert len(prefix._entries) == 1 and prefix.peek(0, tokens) == 96
    cache.release(0)
    cache.release(1)
    assert cache.held_blocks == 6 and prefix.bytes == 6 * cache.block_bytes
