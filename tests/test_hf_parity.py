"""Parity with an independent implementation: Hugging Face transformers' LlamaForCausalLM.

A tiny random GQA Llama is created locally with transformers (no download), saved as
safetensors, exported from the minimal yaml (family, sizes and special tokens from config.json),
and run with the `ms` backend: logits within 1e-4 of transformers' for the prompt and 32 greedy
steps, and identical greedy tokens.
"""
import json
import os

import numpy as np
import pytest

from lite_runtime.backends import load_session
from lite_runtime.manifest import load_manifest
from tiny_models import REPO, export_in_subprocess, run_cli, write_yaml

STEPS = 32


@pytest.fixture(scope="module")
def hf_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    result = run_cli([os.path.join(REPO, "tests", "hf_reference.py"), str(folder), str(STEPS)])
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = {"model": {"hf_dir": str(folder / "hf")}, "seq_length": 64, "batch_size": 3,
           "output_dir": str(folder / "out")}
    out = export_in_subprocess(write_yaml(str(folder / "llama.yaml"), cfg))
    ref = np.load(folder / "reference.npz")
    prompts = json.loads((folder / "prompts.json").read_text())
    return out, ref["logits"], ref["tokens"], prompts


def test_minimal_yaml_takes_everything_from_the_hf_folder(hf_export):
    m = load_manifest(hf_export[0])
    assert m.family == "llama"
    assert (m.model_config["n_heads"], m.model_config["n_kv_heads"], m.model_config["rope_theta"]) == (8, 2, 500000.0)
    assert (m.bos_token_id, m.eos_token_id, m.pad_token_id) == (1, [2], 0)


def test_logits_and_greedy_tokens_match_transformers(hf_export):
    out, ref_logits, ref_tokens, prompts = hf_export
    session = load_session("ms", load_manifest(out))
    B, S = 3, 64
    ids = np.zeros((B, S), np.int32)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = p
    lengths = np.array([len(p) for p in prompts], np.int32)
    logits = session.prefill(ids, lengths)
    tokens = []
    for step in range(STEPS + 1):
        diff = np.abs(logits - ref_logits[:, step]).max()
        assert diff <= 1e-4, f"step {step}: max abs logit difference {diff}"
        nxt = logits.argmax(-1).astype(np.int32)
        tokens.append(nxt)
        lengths = lengths + 1
        if step < STEPS:
            logits = session.decode(nxt.reshape(B, 1), lengths)
    np.testing.assert_array_equal(np.stack(tokens, 1), ref_tokens)
