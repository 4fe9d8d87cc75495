"""Greedy decode of fixed prompts with one SLoRA slot per row, on any backend, in its own process
(Lite and mindspore cannot share one):
  python tests/support/slora_runner.py BACKEND EXPORT PROMPTS.json STEPS OUT.npz SLOTS.json
Writes logits (P, STEPS+1, V) and tokens (P, STEPS+1), as tests/support/hf_models.py's references. On Lite the
paged store holds float32 K/V: the logits are checked within 1e-4 of peft's (as parity_runner.py's)."""
import json
import sys

import numpy as np


def run(session, prompts, steps, slots):
    from lite_runtime.decode.generation import generate_steps, prepare_batch
    from lite_runtime.decode.inputs import InputOfInfer
    m = session.manifest
    inputs = InputOfInfer.get_inputs(m.family, m)
    state = prepare_batch(prompts, m.batch_size, m.seq_length, [steps + 1] * len(prompts), [], 0, slots, inputs)
    logits, tokens = [], []

    def pick(step_logits, ids, lengths, prompt_lengths):
        logits.append(step_logits[:len(prompts)].copy())
        return step_logits.argmax(-1).astype(np.int32)
    for step in generate_steps(session, inputs, state, pick):
        tokens.append(step.tokens[:len(prompts)].copy())
    return np.stack(logits, 1), np.stack(tokens, 1)


if __name__ == "__main__":
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    backend, export, prompts_path, steps, out, slots = sys.argv[1:7]
    with open(prompts_path) as f:
        prompts = json.load(f)
    options = {"kv_cache_dtype": "float32"} if backend == "mslite" else {}
    logits, tokens = run(load_session(backend, load_manifest(export), **options), prompts, int(steps), json.loads(slots))
    assert backend != "mslite" or "mindspore" not in sys.modules
    np.savez(out, logits=logits, tokens=tokens)
