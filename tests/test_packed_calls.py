"""How a packed step's tokens go to the graph, on `ms` and real Lite: a step whose prompt rows join rows
with long pasts runs as two calls (the prompt rows given the cache cut to their own pasts), with the
logits of one call, for plain steps and for steps verifying guesses; a request alone in the engine
feeds its prompt whole, with the tokens it gets in chunks, and the cache shrinks to the rows' pasts."""
import os

import pytest

from support.packed_split_runner import compare, lone_prompt
from support.tiny_models import REPO, run_cli

BACKENDS = ["ms", "mslite", "mslite_kernel"]


def _results(demo_exports, backend):
    """(compare, lone_prompt) of support/packed_split_runner.py; for Lite in a process without mindspore.
    `mslite_kernel`: the demo with `attention: kernel` on Lite."""
    if backend.startswith("mslite"):
        result = run_cli([os.path.join(REPO, "tests", "support", "packed_split_runner.py"), demo_exports[backend],
                          "mslite"])
        assert result.returncode == 0, result.stderr[-2000:]
        return [eval(line) for line in result.stdout.strip().splitlines()[-2:]]
    return compare(demo_exports[backend], backend), lone_prompt(demo_exports[backend], backend)


@pytest.fixture(scope="module")
def results(demo_exports):
    return {backend: _results(demo_exports, backend) for backend in BACKENDS}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_split_step_gives_the_logits_of_one_call(results, backend):
    out = results[backend][0]
    for kind in ("step", "verify"):
        diff, scale, one_call, split, default = out[kind]
        assert (one_call, split) == (1, 2), out
        # the demo's shape: 20 prompt tokens x 127 positions not read pass its bound (576); the attention kernel
        # reads no position a row lacks, and never splits
        assert default == (1 if backend == "mslite_kernel" else 2), out
        assert diff <= 1e-4 * max(1.0, scale), out
    assert out["alone"] <= 1e-4, out   # the prompt row's logits do not depend on the other rows


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_request_alone_feeds_its_prompt_whole(results, backend):
    out = results[backend][1]
    (alone,), alone_calls = out[0]
    pair, pair_calls = out[1]
    (again,), again_calls = out[2]
    assert [n for n, _ in alone_calls] == [40] + [1] * 5, alone_calls       # prompt chunks of 8 ignored
    assert max(n for n, _ in pair_calls) <= 16 and len(pair_calls) > 6, pair_calls   # two rows: chunks of 8
    # after the pair grew the cache, the lone prompt reads it cut to its own past (none)
    assert again_calls[0] == (40, 1) and max(p for _, p in pair_calls) > 1, (again_calls, pair_calls)
    assert pair == [alone, alone] and again == alone
