"""End to end: a tiny Hugging Face Llama exported by `python -m exporter` under MindSpore 2.0, run by
the `mslite` backend (native Lite 2.0 on CPU), compared with transformers at 1e-5.

Each stage is a process of its own (transformers/torch, MindSpore 2.0, Lite), so this test process
loads none of them. Decode is greedy on Lite's logits; the reference is teacher-forced on the
same tokens, so every step's logits are compared.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from lite_process import MS20_PYTHON, MS_NEW_PYTHON, REPO, ensure_lite_installed

PROMPTS = [[1, 5, 9, 13], [1, 7, 8, 20, 30, 40]]
SEQ, STEPS = 16, 5

MAKE_HF = """
import sys, torch, transformers
cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
torch.manual_seed(0)
transformers.LlamaForCausalLM(cfg).save_pretrained(sys.argv[1], safe_serialization=True)
"""

RUN_LITE = """
import json, sys, numpy as np
from lite_runtime.backends import load_session
from lite_runtime.manifest import load_manifest
prompts, steps, seq = json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
session = load_session("mslite", load_manifest(sys.argv[1]), num_threads=2)
ids = np.zeros((len(prompts), seq), np.int32)
for row, p in enumerate(prompts):
    ids[row, :len(p)] = p
lengths = np.array([len(p) for p in prompts], np.int32)
logits = [session.prefill(ids, lengths).copy()]
for _ in range(steps):
    lengths = lengths + 1
    logits.append(session.decode(logits[-1].argmax(1).astype(np.int32)[:, None], lengths).copy())
np.save(sys.argv[5], np.stack(logits))
assert not [m for m in sys.modules if m == "mindspore" or m.startswith("mindspore.")]
"""

HF_REFERENCE = """
import json, sys, numpy as np, torch, transformers
model = transformers.LlamaForCausalLM.from_pretrained(sys.argv[1]).eval()
prompts, lite = json.loads(sys.argv[2]), np.load(sys.argv[3])
tokens = lite.argmax(2)
ref = np.zeros_like(lite)
for row, p in enumerate(prompts):
    with torch.no_grad():
        out = model(torch.tensor([p + tokens[:-1, row].tolist()])).logits[0].numpy()
    ref[:, row] = out[len(p) - 1:]
np.save(sys.argv[4], ref)
"""


def run(cmd, **kw):
    result = subprocess.run([str(c) for c in cmd], cwd=REPO, capture_output=True, text=True, timeout=900, **kw)
    assert result.returncode == 0, f"{cmd[:3]} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_exported_llama_on_lite_matches_transformers(tmp_path):
    ensure_lite_installed()
    hf, export = tmp_path / "hf", tmp_path / "export"
    run([MS_NEW_PYTHON, "-c", MAKE_HF, hf])
    config = tmp_path / "export.yaml"
    config.write_text(f"output_dir: {export}\nmodel:\n  hf_dir: {hf}\nseq_length: {SEQ}\n"
                      f"batch_size: {len(PROMPTS)}\nkv_cache: io\n")
    run([MS20_PYTHON, "-m", "exporter", "--config", config])
    lite, ref = tmp_path / "lite.npy", tmp_path / "ref.npy"
    prompts = str(PROMPTS).replace(" ", "")
    run([sys.executable, "-c", RUN_LITE, export, prompts, STEPS, SEQ, lite],
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    run([MS_NEW_PYTHON, "-c", HF_REFERENCE, hf, prompts, lite, ref])
    lite_logits, ref_logits = np.load(lite), np.load(ref)
    assert lite_logits.shape == (STEPS + 1, len(PROMPTS), 64)
    np.testing.assert_allclose(lite_logits, ref_logits, rtol=1e-5, atol=1e-5)
