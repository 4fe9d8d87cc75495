"""Run under the launcher: one rank's greedy decode of fixed prompts, logits saved per rank.

usage (by tests/test_distributed.py):
  python -m lite_runtime.distributed.launch --rank_table T --backend ms -- tests/tp_worker.py EXPORT OUT_DIR STEPS
With PROMPTS.json SLOTS.json after STEPS (tests/test_slora.py): those prompts, one SLoRA slot per row.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from greedy_runner import greedy_run


def main(export, out_dir, steps, prompts=None, slots=None):
    from mindspore.communication import get_rank, init
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    init()
    rank = get_rank()
    assert rank == int(os.environ["RANK_ID"]), "launcher rank order differs from MindSpore's"
    session = load_session("ms", load_manifest(export), rank)
    if prompts is None:
        logits, tokens = greedy_run(session, steps)
    else:
        import json
        from slora_runner import run
        with open(prompts) as f:
            logits, tokens = run(session, json.load(f), steps, json.loads(slots))
    np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), logits=logits, tokens=tokens)


if __name__ == "__main__":
    args = sys.argv[1:]     # then the launcher's own --backend ms --distributed True
    args = args[:next((i for i, a in enumerate(args) if a.startswith("--")), len(args))]
    main(args[0], args[1], int(args[2]), *args[3:5])
