"""LoRA adapters merged at export, against Hugging Face peft: a tiny random Llama with a random
(non-zero) r=4 adapter on q, k, v, o. The export from the HF folder + PEFT adapter folder, and from a
MindFormers LoRA checkpoint with a `pet_config` run yaml, give peft's merged model's greedy tokens for
32 steps and logits within 1e-4; bad adapters are refused in one line with nothing written."""
import json
import os

import numpy as np
import pytest

from lite_runtime.backends import load_session
from lite_runtime.contract.manifest import load_manifest
from support.parity_runner import greedy_prompts
from support.family_cases import check_parity
from support.tiny_models import error_lines, REPO, export_in_subprocess, run_cli, save_ckpt, write_yaml

STEPS = 32


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora")
    result = run_cli([os.path.join(REPO, "tests", "support", "lora_models.py"), str(folder), str(STEPS)])
    assert result.returncode == 0, result.stderr[-3000:]
    ref = np.load(folder / "reference.npz")
    return folder, json.loads((folder / "prompts.json").read_text()), ref["logits"], ref["tokens"]


def peft_yaml(folder, out, **model):
    return {"model": dict({"hf_dir": str(folder / "hf"), "adapter": str(folder / "adapter")}, **model),
            "seq_length": 48, "batch_size": 3, "output_dir": str(out)}


def test_peft_adapter_merged_at_export_matches_peft(lora_model, tmp_path):
    folder, prompts, ref_logits, ref_tokens = lora_model
    out = export_in_subprocess(write_yaml(str(tmp_path / "lora.yaml"), peft_yaml(folder, tmp_path / "out")))
    manifest = load_manifest(out)
    [adapter] = manifest.adapters
    assert (adapter["name"], adapter["r"], adapter["alpha"], adapter["merged"]) == ("adapter", 4, 8.0, True)
    assert len(adapter["targets"]) == 2 * 4 and len(adapter["sha256"]) == 64
    logits, tokens = greedy_prompts(load_session("ms", manifest), prompts, STEPS)
    check_parity(logits, tokens, ref_logits, ref_tokens, "PEFT adapter merged")


def test_mindformers_lora_checkpoint_with_pet_config_matches_peft(lora_model, tmp_path):
    folder, prompts, ref_logits, ref_tokens = lora_model
    ckpt = save_ckpt(dict(np.load(folder / "mindformers_lora.npz")), str(tmp_path / "lora.ckpt"))
    hf = json.loads((folder / "hf" / "config.json").read_text())
    mc = dict(type="LlamaConfig", vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
              num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
              n_kv_heads=hf["num_key_value_heads"], intermediate_size=hf["intermediate_size"],
              rms_norm_eps=hf["rms_norm_eps"], theta=500000.0, seq_length=48, batch_size=3,
              bos_token_id=1, eos_token_id=2, pad_token_id=0,
              pet_config={"pet_type": "lora", "lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0,
                          "target_modules": ".*wq|.*wk|.*wv|.*wo"})
    data = {"model": {"model_config": mc, "arch": {"type": "LlamaForCausalLM"}}, "load_checkpoint": ckpt,
            "output_dir": str(tmp_path / "out")}
    manifest = load_manifest(export_in_subprocess(write_yaml(str(tmp_path / "run_llama_lora.yaml"), data)))
    assert manifest.adapters[0]["r"] == 4 and manifest.adapters[0]["targets"] == ".*wq|.*wk|.*wv|.*wo"
    logits, tokens = greedy_prompts(load_session("ms", manifest), prompts, STEPS)
    check_parity(logits, tokens, ref_logits, ref_tokens, "MindFormers LoRA merged")


@pytest.mark.parametrize("damage, facts", [
    ("alpha", ["adapter_config.json", "LoRA alpha must be a positive number", "None"]),
    ("missing_b", ["has no", "lora_B"]),
    ("shape", ["update for", "has shape"]),
])
def test_bad_adapters_are_refused_in_one_line(lora_model, tmp_path, damage, facts):
    from safetensors.numpy import load_file, save_file
    folder = lora_model[0]
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    config = json.loads((folder / "adapter" / "adapter_config.json").read_text())
    tensors = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
    if damage == "alpha":
        config.pop("lora_alpha")
    elif damage == "missing_b":
        tensors.pop(next(n for n in sorted(tensors) if ".lora_B." in n))
    else:
        name = next(n for n in sorted(tensors) if ".lora_B." in n)
        tensors[name] = np.zeros((tensors[name].shape[0] + 1, tensors[name].shape[1]), np.float32)
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    cfg = peft_yaml(folder, tmp_path / "out", adapter=str(adapter))
    result = run_cli(["-m", "exporter", "--config", write_yaml(str(tmp_path / "bad.yaml"), cfg)])
    assert result.returncode == 1 and len(error_lines(result.stderr)) == 1, result.stderr
    for fact in facts:
        assert fact in result.stderr, (fact, result.stderr)
    assert not os.path.exists(tmp_path / "out")
