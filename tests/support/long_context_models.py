"""Run in its own process (torch and MindSpore are kept apart): a tiny random Hugging Face model of one family
(hf_models.py's, widened the same way) with room for POSITIONS positions, and transformers' greedy tokens and
logits for random prompts of the given lengths.

usage: python tests/support/long_context_models.py FAMILY OUT_DIR [POSITIONS STEPS LENGTH ...] (default: the
tests' POSITIONS, STEPS, LENGTHS). Writes OUT_DIR/hf/ (config, weights, tokenizer), OUT_DIR/prompts.json (one prompt of each length) and
OUT_DIR/reference.npz (logits (P, STEPS, V), tokens (P, STEPS)).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from hf_models import BUILDERS, REFERENCES, VOCAB, greedy_continuation, write_model_folder  # noqa: E402

POSITION_KEYS = ("max_position_embeddings", "n_positions", "seq_length")
POSITIONS = 2048
# crossing the cache's buckets (16-64 positions), the engine's prompt chunks (128), the packed prefill's
# windows (256) and 1,500 (Lite's one-row products)
LENGTHS = (1, 17, 129, 257, 1501, 2040)
STEPS = 6
# the forms of an export at POSITIONS: target cpu (the kernels' attention over host arrays, or the paged store), the packed step's attention as Lite's
# ops (.ms), that step as segments (.ms each), upstream's io graphs (MindIR, Lite), the packed step on ms
FORMS = {"lite_cpu": {"target": "cpu", "attention": "kernel"}, "lite_paged": {"target": "cpu"}, "lite_packed": {"kv_cache": "packed", "lite_ms": True},
         "lite_segments": {"target": "cpu", "parallel": {"collectives": "host"}},
         "lite_io": {"kv_cache": "io"}, "ms_packed": {"kv_cache": "packed"}}


def build(family, positions):
    import transformers
    model = BUILDERS[family](transformers)
    config = model.config
    for key in POSITION_KEYS:
        if getattr(config, key, None) is not None:
            setattr(config, key, positions)
    return type(model)(config)


def main(family, out_dir, positions, steps, lengths):
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = build(family, positions).eval()
    write_model_folder(model, family, out_dir)
    if family in REFERENCES:      # what the checkpoint's own code computes at inference (hf_models.py)
        REFERENCES[family](model)
    rng = np.random.default_rng(7)
    prompts = [[1] + rng.integers(3, VOCAB, n - 1).tolist() for n in lengths]
    runs = [greedy_continuation(model, p, steps) for p in prompts]
    np.savez(os.path.join(out_dir, "reference.npz"), logits=np.stack([r[1] for r in runs]),
             tokens=np.array([r[0] for r in runs]))
    with open(os.path.join(out_dir, "prompts.json"), "w") as f:
        json.dump(prompts, f)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) > 2:
        main(args[0], args[1], int(args[2]), int(args[3]), [int(a) for a in args[4:]])
    else:
        main(args[0], args[1], POSITIONS, STEPS, LENGTHS)
