"""Greedy decode of given prompts on one backend, in a process of its own (Lite and mindspore cannot
share one): python tests/support/parity_runner.py BACKEND EXPORT PROMPTS.json STEPS OUT.npz [KEY=VALUE ...]
(KEY=VALUE: session options, e.g. lite_format=mindir; on Lite kv_cache_dtype is float32 unless given: the logits
are checked within 1e-4 of float32 references, which float16 K/V in the paged store round beyond; float16's tokens
are checked at long prompts, test_long_prompts.py and test_real_model.py)

Saves logits (P, STEPS+1, V) and tokens (P, STEPS+1): the prompts fill the graph batch (in order,
the last batch padded with copies), each row's greedy token fed back every step.
"""
import json
import sys

import numpy as np


def greedy_prompts(session, prompts, steps):
    from lite_runtime.decode.inputs import InputOfInfer
    m = session.manifest
    feeds = InputOfInfer.get_inputs(m.family, m)     # the family's own graph inputs (GLM's), if any
    batch = m.batch_size
    logits_out, tokens_out = [], []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        rows = chunk + [chunk[-1]] * (batch - len(chunk))
        ids = np.zeros((batch, m.seq_length), np.int32)
        for i, p in enumerate(rows):
            ids[i, :len(p)] = p
        lengths = np.array([len(p) for p in rows], np.int32)
        row_inputs = feeds.row_inputs(ids, lengths)
        logits = session.prefill(*feeds.prefill_inputs(ids, lengths, row_inputs)).copy()
        step_logits = [logits]
        for _ in range(steps):
            nxt = logits.argmax(-1).astype(np.int32)
            lengths = lengths + 1
            logits = session.decode(*feeds.decode_inputs(nxt.reshape(-1, 1), lengths, row_inputs)).copy()
            step_logits.append(logits)
        stacked = np.stack(step_logits, 1)[:len(chunk)]       # (rows, steps+1, V)
        logits_out.append(stacked)
        tokens_out.append(stacked.argmax(-1))
    return np.concatenate(logits_out), np.concatenate(tokens_out)


if __name__ == "__main__":
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    backend, export, prompts_file, steps, out = sys.argv[1:6]
    options = {key: {"True": True, "False": False}.get(value, value)
               for key, value in (arg.split("=", 1) for arg in sys.argv[6:])}
    if backend == "mslite":
        options.setdefault("kv_cache_dtype", "float32")
    with open(prompts_file) as f:
        prompts = json.load(f)
    session = load_session(backend, load_manifest(export), **options)
    logits, tokens = greedy_prompts(session, prompts, int(steps))
    assert backend != "mslite" or "mindspore" not in sys.modules
    np.savez(out, logits=logits, tokens=tokens)
