"""Run under the launcher: one rank's greedy decode of fixed prompts, logits saved per rank.

usage (by tests/test_distributed.py):
  python -m lite_runtime.launch --rank_table T --backend ms -- tests/tp_worker.py EXPORT OUT_DIR STEPS
"""
import os
import sys

import numpy as np

PROMPTS = [[5, 17, 33, 8, 61, 9, 12], [44, 3], [70, 21, 19, 88, 4, 6, 7, 30, 31, 45]]


def greedy_run(session, steps):
    m = session.manifest
    ids = np.zeros((m.batch_size, m.seq_length), np.int32)
    for i, p in enumerate(PROMPTS):
        ids[i, :len(p)] = p
    lengths = np.array([len(p) for p in PROMPTS], np.int32)
    logits = session.prefill(ids, lengths)
    all_logits, tokens = [logits], []
    for _ in range(steps):
        nxt = logits.argmax(-1).astype(np.int32)
        tokens.append(nxt)
        lengths = lengths + 1
        logits = session.decode(nxt.reshape(-1, 1), lengths)
        all_logits.append(logits)
    return np.stack(all_logits), np.stack(tokens, 1)


def main(export, out_dir, steps):
    from mindspore.communication import get_rank, init
    from lite_runtime.backends import load_session
    from lite_runtime.manifest import load_manifest
    init()
    rank = get_rank()
    assert rank == int(os.environ["RANK_ID"]), "launcher rank order differs from MindSpore's"
    logits, tokens = greedy_run(load_session("ms", load_manifest(export), rank), steps)
    np.savez(os.path.join(out_dir, f"rank_{rank}.npz"), logits=logits, tokens=tokens)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
