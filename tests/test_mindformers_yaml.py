"""MindFormers run yamls export as they are: same graphs as the project's own schema."""
import os

import numpy as np
import pytest

from exporter.families.llama import llama_ffn_size
from lite_runtime.backends import load_session
from lite_runtime.contract.manifest import load_manifest
from support.tiny_models import error_lines, export_in_subprocess, run_cli, save_ckpt, write_yaml


def mindformers_yaml(ckpt, output_dir, **model_config):
    mc = dict(type="LlamaConfig", batch_size=3, seq_length=48, hidden_size=32, num_layers=2, num_heads=4,
              n_kv_heads=2, intermediate_size=64, vocab_size=96, rms_norm_eps=1.0e-5, theta=10000.0,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, ignore_token_id=-100, compute_dtype="float32",
              layernorm_compute_type="float32", softmax_compute_type="float32", rotary_dtype="float32",
              param_init_type="float32", use_past=True, use_flash_attention=False, offset=0,
              checkpoint_name_or_path="", repetition_penalty=1, max_decode_length=512, top_k=3, top_p=1,
              do_sample=False)
    mc.update(model_config)
    return {"seed": 0, "run_mode": "predict", "output_dir": output_dir, "load_checkpoint": ckpt,
            "auto_trans_ckpt": False, "context": {"mode": 0, "device_target": "Ascend"},
            "parallel_config": {"data_parallel": 1, "model_parallel": 1, "pipeline_stage": 1},
            "runner_config": {"epochs": 1, "batch_size": 1}, "optimizer": {"type": "FP32StateAdamWeightDecay"},
            "model": {"model_config": mc, "arch": {"type": "LlamaForCausalLM"}},
            "processor": {"return_tensors": "ms", "tokenizer": {"type": "LlamaTokenizer"}},
            "infer": {"model_type": "mindir", "infer_seq_length": 48}}


@pytest.mark.fast
def test_llama_ffn_width_matches_published_llama_sizes():
    assert llama_ffn_size(4096, 256, None) == 11008      # Llama 2 7B
    assert llama_ffn_size(5120, 256, None) == 13824      # Llama 2 13B
    assert llama_ffn_size(8192, 4096, 1.3) == 28672      # Llama 2 70B


def test_mindformers_yaml_exports_the_same_model(tiny_ckpt, tiny_exports, tmp_path):
    data = mindformers_yaml(tiny_ckpt[0], str(tmp_path / "out"))
    out = export_in_subprocess(write_yaml(str(tmp_path / "run_llama_tiny.yaml"), data))
    mine, ref = load_manifest(out), load_manifest(tiny_exports["io"])
    assert mine.model_config == ref.model_config and mine.graphs["increment"].inputs == ref.graphs["increment"].inputs
    ids = np.zeros((3, 48), np.int32)
    ids[:, :5] = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14], [1, 2, 3, 4, 5]]
    lengths = np.array([5, 3, 4], np.int32)
    np.testing.assert_array_equal(load_session("ms", mine).prefill(ids, lengths),
                                  load_session("ms", ref).prefill(ids, lengths))


def test_run_yaml_chooses_kv_cache_and_lite_ms_at_its_top_level(tiny_ckpt, tiny_exports, tmp_path):
    """`kv_cache` and `lite_ms`, the export yaml's own top-level keys, are read from a run yaml too: kv_cache
    packed writes the step graph, whose greedy tokens are the io export's."""
    from exporter.config.schema import load_config
    from support.parity_runner import greedy_prompts
    data = dict(mindformers_yaml(tiny_ckpt[0], str(tmp_path / "out")), kv_cache="packed")
    path = write_yaml(str(tmp_path / "run_llama_packed.yaml"), data)
    assert load_config(write_yaml(str(tmp_path / "run_llama_ms.yaml"), dict(data, lite_ms=True))).lite_ms is True
    result = run_cli(["-m", "exporter", "--config", path])
    assert result.returncode == 0, result.stderr[-2000:]
    unused = [line for line in result.stderr.splitlines() if "not used by export" in line]
    assert len(unused) == 1 and "kv_cache" not in unused[0].split("not used by export")[1], result.stderr
    mine = load_manifest(str(tmp_path / "out"))
    assert mine.kv_cache == "packed" and sorted(mine.graphs) == ["step"]
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [1, 2, 3, 4]]
    got = greedy_prompts(load_session("ms", mine), prompts, 8)
    want = greedy_prompts(load_session("ms", load_manifest(tiny_exports["io"])), prompts, 8)
    np.testing.assert_array_equal(got[1], want[1])
    assert np.abs(got[0] - want[0]).max() <= 1e-4


def concatenated(weights):
    """The checkpoint newer MindFormers writes with qkv_concat: True: [q; k; v] as w_qkv and
    [gate; up] as w_gate_hidden, stacked along the output rows."""
    out = {}
    for name, value in weights.items():
        if name.endswith(("attention.wk.weight", "attention.wv.weight", "feed_forward.w3.weight")):
            continue
        if name.endswith("attention.wq.weight"):
            p = name[: -len("wq.weight")]
            out[p + "w_qkv.weight"] = np.concatenate([value, weights[p + "wk.weight"], weights[p + "wv.weight"]])
        elif name.endswith("feed_forward.w1.weight"):
            p = name[: -len("w1.weight")]
            out[p + "w_gate_hidden.weight"] = np.concatenate([value, weights[p + "w3.weight"]])
        else:
            out[name] = value
    return out


def test_qkv_concat_checkpoint_exports_the_same_model(tiny_ckpt, tiny_exports, tmp_path):
    ckpt = save_ckpt(concatenated(tiny_ckpt[1]), str(tmp_path / "concat.ckpt"))
    assert any(n.endswith("w_qkv.weight") for n in concatenated(tiny_ckpt[1]))
    data = mindformers_yaml(ckpt, str(tmp_path / "out"), qkv_concat=True)
    out = export_in_subprocess(write_yaml(str(tmp_path / "run_llama_concat.yaml"), data))
    ids = np.zeros((3, 48), np.int32)
    ids[:, :4] = [[5, 6, 7, 8], [10, 11, 12, 13], [1, 2, 3, 4]]
    lengths = np.array([4, 2, 3], np.int32)
    np.testing.assert_array_equal(load_session("ms", load_manifest(out)).prefill(ids, lengths),
                                  load_session("ms", load_manifest(tiny_exports["io"])).prefill(ids, lengths))


@pytest.mark.parametrize("change, facts", [
    ({"type": "GLM2Config"}, ["LlamaForCausalLM"]),
    ({"use_fancy_thing": 1}, ["unknown key model.model_config.use_fancy_thing"]),
])
def test_mindformers_yaml_refuses_what_it_cannot_build(tiny_ckpt, tmp_path, change, facts):
    data = mindformers_yaml(tiny_ckpt[0], str(tmp_path / "out"), **change)
    if "type" in change:
        data["model"]["arch"]["type"] = "GLM2ForCausalLM"
    result = run_cli(["-m", "exporter", "--config", write_yaml(str(tmp_path / "bad.yaml"), data)])
    assert result.returncode == 1 and len(error_lines(result.stderr)) == 1
    for fact in facts:
        assert fact in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_run_yaml_without_output_dir_exports_into_the_working_directory_and_says_so(tiny_ckpt, tmp_path):
    data = mindformers_yaml(tiny_ckpt[0], None)
    del data["output_dir"]
    path = write_yaml(str(tmp_path / "run_llama.yaml"), data)
    workdir = tmp_path / "work"
    workdir.mkdir()
    result = run_cli(["-m", "exporter", "--config", path], cwd=str(workdir))
    assert result.returncode == 0, result.stderr[-2000:]
    out = str(workdir / "output")
    assert load_manifest(out).family == "llama"
    said = [line for line in result.stderr.splitlines() if "exported llama to " in line]
    assert len(said) == 1 and f"exported llama to {out} " in said[0] and "default output_dir ./output" in said[0]


def test_default_output_dir_holding_mindformers_run_files_is_refused(tiny_ckpt, tmp_path):
    """`./output` is also where MindFormers writes its logs and checkpoints."""
    data = mindformers_yaml(tiny_ckpt[0], None)
    del data["output_dir"]
    path = write_yaml(str(tmp_path / "run_llama.yaml"), data)
    (tmp_path / "output" / "log").mkdir(parents=True)
    (tmp_path / "output" / "log" / "info.log").write_text("training log", encoding="utf-8")
    result = run_cli(["-m", "exporter", "--config", path], cwd=str(tmp_path))
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fact in (f"output_dir {tmp_path / 'output'}", "default output_dir ./output", "sets no output_dir",
                 "not an export", "set output_dir in the yaml or give --output_dir"):
        assert fact in lines[0], lines[0]
    assert os.listdir(tmp_path / "output") == ["log"]
    assert (tmp_path / "output" / "log" / "info.log").read_text(encoding="utf-8") == "training log"


def test_data_parallel_is_a_warning_that_the_export_holds_model_parallel_ranks_only(tiny_ckpt, tmp_path):
    data = mindformers_yaml(tiny_ckpt[0], str(tmp_path / "out"))
    data["parallel_config"]["data_parallel"] = 2
    result = run_cli(["-m", "exporter", "--config", write_yaml(str(tmp_path / "run_llama_dp2.yaml"), data)])
    assert result.returncode == 0, result.stderr[-2000:]
    said = [line for line in result.stderr.splitlines() if "parallel_config.data_parallel" in line]
    assert len(said) == 1, result.stderr
    for fact in ("run_llama_dp2.yaml", "parallel_config.data_parallel 2", "runtime concern", "model_parallel rank(s) only"):
        assert fact in said[0], said[0]
    assert load_manifest(str(tmp_path / "out")).world_size == 1
