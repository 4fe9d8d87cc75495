"""The family test cases (tests/test_families.py, tests/test_family_details.py): a case is a family
or one shape of a family (`baichuan2_13b`), made by tests/support/hf_models.py (transformers) or
tests/support/numpy_references.py (an independent numpy forward pass); the fixtures `hf_family` and
`family_export` (conftest.py) make its folder and its exports on first use."""
import json
import os

import numpy as np

from support.hf_models import BUILDERS
from support.numpy_references import CASES as NUMPY_CASES
from support.tiny_models import REPO, run_cli, save_ckpt

STEPS = 32
TOLERANCE = 1e-4
FAMILIES = sorted(BUILDERS) + sorted(NUMPY_CASES)   # the cases: a family, or a shape of one
SEQ, BATCH = 48, 3


def family_of(case):
    return NUMPY_CASES.get(case, case)


def mindformers_ckpt(folder):
    """The case's weights under MindFormers' names as a .ckpt (written on first use)."""
    path = folder / "mindformers.ckpt"
    return str(path) if path.exists() else save_ckpt(dict(np.load(folder / "mindformers.npz")), str(path))


def mindformers_yaml(case, folder, ckpt, output_dir):
    """A MindFormers run yaml of the case's family, sizes from the HF config of the same model (or the
    case's own run yaml sections, mindformers.json, for a family with no HF layout)."""
    run_keys = {"load_checkpoint": ckpt, "output_dir": output_dir,
                "parallel_config": {"data_parallel": 1, "model_parallel": 1}, "runner_config": {"epochs": 1}}
    if (folder / "mindformers.json").exists():
        run = json.loads((folder / "mindformers.json").read_text())
        assert run["model"]["model_config"]["seq_length"] == SEQ      # also the position tables' rows
        run["model"]["model_config"]["batch_size"] = BATCH
        return dict(run, **run_keys)
    hf = json.loads((folder / "hf" / "config.json").read_text())
    family = family_of(case)
    common = {"vocab_size": hf.get("vocab_size"), "seq_length": SEQ, "batch_size": BATCH,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "compute_dtype": "float32"}
    if family == "llama":
        mc = dict(common, type="LlamaConfig", hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
                  num_heads=hf["num_attention_heads"], n_kv_heads=hf["num_key_value_heads"],
                  intermediate_size=hf["intermediate_size"], rms_norm_eps=hf["rms_norm_eps"],
                  theta=hf.get("rope_theta") or hf["rope_parameters"]["rope_theta"])
        arch = "LlamaForCausalLM"
    elif family == "internlm":   # research/internlm/predict_internlm_7b.yaml
        mc = dict(common, type="InternLMConfig", hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
                  num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
                  rms_norm_eps=hf["rms_norm_eps"], theta=hf["rotary"]["base"], has_bias=True, multiple_of=256,
                  extend_method="None", scaling_factor=1.0)
        arch = "InternLMForCausalLM"
    elif family == "baichuan2":  # research/baichuan2/predict_baichuan2_{7b,13b}.yaml: LlamaConfig, one arch per size
        mc = dict(common, type="LlamaConfig", hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
                  num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"],
                  rms_norm_eps=hf["rms_norm_eps"], multiple_of=128, pretrain_seqlen=2048, extend_method="None",
                  compute_in_2d=True, use_past_shard=False, temperature=1.0)
        arch = "Baichuan13BV2ForCausalLM" if case == "baichuan2_13b" else "Baichuan7BV2ForCausalLM"
    elif family == "qwen":   # research/qwen/qwen_7b/predict_qwen_7b.yaml (intermediate_size: the MLP width)
        mc = dict(common, type="QwenConfig", hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
                  num_heads=hf["num_attention_heads"], intermediate_size=hf["intermediate_size"] // 2,
                  rms_norm_eps=hf["layer_norm_epsilon"], emb_dropout_prob=0.0, rotary_pct=1.0,
                  rotary_emb_base=hf["rotary_emb_base"], kv_channels=hf["kv_channels"])
        arch = "QwenForCausalLM"
    elif family == "glm2":   # configs/glm3/run_glm3_6b.yaml, with q, k, v and gate/up stored apart
        mc = dict({k: v for k, v in common.items() if k != "vocab_size"}, type="ChatGLM2Config",
                  padded_vocab_size=hf["padded_vocab_size"], num_layers=hf["num_layers"],
                  hidden_size=hf["hidden_size"], ffn_hidden_size=hf["ffn_hidden_size"], kv_channels=hf["kv_channels"],
                  num_attention_heads=hf["num_attention_heads"], layernorm_epsilon=hf["layernorm_epsilon"],
                  rmsnorm=True, apply_residual_connection_post_layernorm=False, post_layer_norm=True,
                  add_bias_linear=False, add_qkv_bias=True, multi_query_attention=True,
                  multi_query_group_num=hf["multi_query_group_num"], rope_ratio=1, qkv_concat=False,
                  mlp_concat=False, use_rearrange_rope=False, pre_seq_len="None", quantization_bit=0)
        arch = "ChatGLM2ForConditionalGeneration"
    elif family == "bloom":
        mc = dict(common, type="BloomConfig", hidden_size=hf["hidden_size"], num_layers=hf["n_layer"],
                  num_heads=hf["n_head"], hidden_act="gelu")
        arch = "BloomLMHeadModel"
    else:
        mc = dict(common, type="GPT2Config", hidden_size=hf["n_embd"], num_layers=hf["n_layer"],
                  num_heads=hf["n_head"], max_position_embeddings=hf["n_positions"], hidden_act="gelu")
        arch = "GPT2LMHeadModel"
    return {"model": {"model_config": mc, "arch": {"type": arch}}, **run_keys}


def reference(folder):
    ref = np.load(folder / "reference.npz")
    return json.loads((folder / "prompts.json").read_text()), ref["logits"], ref["tokens"]


def check_parity(logits, tokens, ref_logits, ref_tokens, what):
    np.testing.assert_array_equal(tokens, ref_tokens, err_msg=f"{what}: greedy tokens differ")
    diff = np.abs(logits - ref_logits).max()
    assert diff <= TOLERANCE, f"{what}: max abs logit difference {diff} > {TOLERANCE}"


def lite_run(folder, export, name, *options):
    out = str(folder / f"{name}.npz")
    result = run_cli([os.path.join(REPO, "tests", "support", "parity_runner.py"), "mslite", export,
                      str(folder / "prompts.json"), str(STEPS), out, *options])
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(out)
    return got["logits"], got["tokens"]
