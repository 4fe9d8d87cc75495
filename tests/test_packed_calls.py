"""A packed step whose prompt rows join rows with long pasts runs as two graph calls (the prompt rows
given the cache cut to their own pasts): the logits equal those of one call, on `ms` and real Lite,
for plain steps and for steps verifying guesses."""
import os

import pytest

from support.packed_split_runner import compare
from support.tiny_models import REPO, run_cli


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_a_split_step_gives_the_logits_of_one_call(demo_exports, backend):
    if backend == "mslite":       # Lite's process must not import mindspore
        result = run_cli([os.path.join(REPO, "tests", "support", "packed_split_runner.py"), demo_exports[backend],
                          backend])
        assert result.returncode == 0, result.stderr[-2000:]
        out = eval(result.stdout.strip().splitlines()[-1])
    else:
        out = compare(demo_exports[backend], backend)
    for kind in ("step", "verify"):
        diff, scale, one_call, split, default = out[kind]
        assert (one_call, split) == (1, 2), out
        assert default == 2, out       # the demo's shape: 20 prompt tokens x 96 positions not read pass its bound
        assert diff <= 1e-4 * max(1.0, scale), out
    assert out["alone"] <= 1e-4, out   # the prompt row's logits do not depend on the other rows
