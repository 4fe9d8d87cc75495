"""Greedy decode of fixed prompts on any backend, used by tests that compare backends and ranks.

Run as a script it loads one backend in its own process (Lite and mindspore cannot share one):
  python tests/support/greedy_runner.py BACKEND EXPORT OUT.npz STEPS
"""
import sys

import numpy as np

PROMPTS = [[5, 17, 33, 8, 61, 9, 12], [44, 3], [70, 21, 19, 88, 4, 6, 7, 30, 31, 45], [9, 9, 12]]


def prompts_for(manifest):
    """PROMPTS; for GLM each ends with its [gMASK] <sop> (the ids in the manifest), as ChatGLM-6B prompts do."""
    config = manifest.model_config or {}
    if config.get("gmask_token_id") is None or manifest.bos_token_id is None:
        return PROMPTS
    return [p + [config["gmask_token_id"], manifest.bos_token_id] for p in PROMPTS]


def greedy_run(session, steps):
    """(logits (steps+1, B, V), tokens (B, steps)) for PROMPTS padded/cut to the graph batch."""
    from lite_runtime.decode.inputs import InputOfInfer
    m = session.manifest
    feeds = InputOfInfer.get_inputs(m.family, m)     # the family's own graph inputs (GLM's), if any
    prompts = (prompts_for(m) * m.batch_size)[:m.batch_size]
    ids = np.zeros((m.batch_size, m.seq_length), np.int32)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = p
    lengths = np.array([len(p) for p in prompts], np.int32)
    row_inputs = feeds.row_inputs(ids, lengths)
    logits = session.prefill(*feeds.prefill_inputs(ids, lengths, row_inputs)).copy()
    all_logits, tokens = [logits], []
    for _ in range(steps):
        nxt = logits.argmax(-1).astype(np.int32)
        tokens.append(nxt)
        lengths = lengths + 1
        logits = session.decode(*feeds.decode_inputs(nxt.reshape(-1, 1), lengths, row_inputs)).copy()
        all_logits.append(logits)
    return np.stack(all_logits), np.stack(tokens, 1)


if __name__ == "__main__":
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    backend, export, out, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    logits, tokens = greedy_run(load_session(backend, load_manifest(export)), steps)
    assert backend != "mslite" or "mindspore" not in sys.modules
    np.savez(out, logits=logits, tokens=tokens)
