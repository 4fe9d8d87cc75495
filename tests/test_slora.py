"""SLoRA: one export serving two LoRA adapters of different ranks (and the base model), chosen per
row, against Hugging Face peft on a tiny random Llama (tests/support/slora_models.py). Each adapter, and
the base, gives peft's greedy tokens for 32 steps and logits within 1e-4 on `ms` (io and packed)
and on real Lite (packed, .ms); a batch mixing adapters gives, row by row, each prompt's own
result; MindFormers adapter folders with a MindFormers run yaml give the same; run_infer_main.py
--adapter_id picks the adapter; bad adapters are refused in one line with nothing written."""
import json
import os
import sys

import numpy as np
import pytest

from support.family_cases import check_parity
from support.tiny_models import (VENV_MS20_PYTHON, REPO, error_lines, export_in_subprocess, rank_table, run_cli, save_ckpt,
                                 write_yaml)
from lite_runtime.tokenizers import export_tokenizer

STEPS = 32
ADAPTERS = {"a1": 1, "a2": 2}          # name -> slot: the order of lora_adapter.json
MF_TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2")


@pytest.fixture(scope="module")
def slora_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slora")
    result = run_cli([os.path.join(REPO, "tests", "support", "slora_models.py"), str(folder), str(STEPS)])
    assert result.returncode == 0, result.stderr[-3000:]
    (folder / "lora_adapter.json").write_text(json.dumps({"a1": "a1", "a2": "a2"}))
    (folder / "lora_adapter_a1.json").write_text(json.dumps({"a1": "a1"}))    # attention layers only
    # The same adapters as MindFormers adapter folders (adapter_config.json + adapter_model.ckpt).
    for name, r, alpha in (("a1", 4, 8), ("a2", 8, 4)):
        os.makedirs(folder / "mf" / name)
        (folder / "mf" / name / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": alpha,
                                                                              "lora_dropout": 0.0}))
        save_ckpt(dict(np.load(folder / f"{name}_mindformers.npz")), str(folder / "mf" / name / "adapter_model.ckpt"))
    (folder / "mf" / "lora_adapter.json").write_text(json.dumps({"a1": "a1", "a2": "a2"}))
    save_ckpt(dict(np.load(folder / "base_mindformers.npz")), str(folder / "mf" / "base.ckpt"))
    return folder


def slora_yaml(folder, out, kv_cache="io", **extra):
    return dict({"model": {"hf_dir": str(folder / "hf"),
                           "pet_config": {"pet_type": "slora", "adapter_path": str(folder / "lora_adapter.json")}},
                 "seq_length": 48, "batch_size": 3, "kv_cache": kv_cache, "output_dir": str(out)}, **extra)


@pytest.fixture(scope="module")
def slora_exports(slora_model):
    folder, made = slora_model, {}

    def get(variant):
        if variant not in made:
            out = folder / f"export_{variant}"
            if variant == "mindformers":      # upstream's SLoRA run yaml: pet_config in model_config
                hf = json.loads((folder / "hf" / "config.json").read_text())
                mc = {"type": "LlamaConfig", "vocab_size": hf["vocab_size"], "hidden_size": hf["hidden_size"],
                      "num_layers": hf["num_hidden_layers"], "num_heads": hf["num_attention_heads"],
                      "n_kv_heads": hf["num_key_value_heads"], "intermediate_size": hf["intermediate_size"],
                      "rms_norm_eps": hf["rms_norm_eps"], "theta": hf["rope_parameters"]["rope_theta"],
                      "seq_length": 48, "batch_size": 3, "compute_dtype": "float32", "eos_token_id": 2,
                      "pet_config": {"pet_type": "slora", "adapter_path": str(folder / "mf" / "lora_adapter.json")}}
                cfg = {"model": {"model_config": mc, "arch": {"type": "LlamaForCausalLM"}},
                       "load_checkpoint": str(folder / "mf" / "base.ckpt"), "output_dir": str(out)}
            elif variant == "tp2":
                cfg = slora_yaml(folder, out, parallel={"model_parallel": 2})
            elif variant.startswith("lite_tp2"):    # Lite TP: step segments, adapters on the blocks' segments
                cfg = slora_yaml(folder, out, "packed", parallel={"model_parallel": 2, "collectives": "host"})
                if variant == "lite_tp2_a1":
                    cfg["model"]["pet_config"]["adapter_path"] = str(folder / "lora_adapter_a1.json")
            elif variant == "lite_int8":     # the base's linear layers quantized, the adapters float32 on top
                cfg = slora_yaml(folder, out, "packed", target="cpu", quantization={"weights": "int8", "head": "float32",
                                                                                  "embedding": "float32"})
            elif variant.startswith("lite_segments"):      # one rank's step as segments of whole layers
                cfg = slora_yaml(folder, out, "packed", lite_ms=True, parallel={"collectives": "host"})
            else:      # packed: each token's adapter columns by its row
                cfg = slora_yaml(folder, out, "packed" if variant.endswith("packed") else "io",
                                 lite_ms=variant == "lite_packed")
            python = str(VENV_MS20_PYTHON) if variant.startswith("lite") else sys.executable
            made[variant] = export_in_subprocess(write_yaml(str(folder / f"{variant}.yaml"), cfg), python=python)
        return made[variant]
    return get


def run_slots(folder, export, backend, slots, name):
    out = folder / f"{name}.npz"
    result = run_cli([os.path.join(REPO, "tests", "support", "slora_runner.py"), backend, export, str(folder / "prompts.json"),
                      str(STEPS), str(out), json.dumps(slots)])
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(out)
    return got["logits"], got["tokens"]


@pytest.mark.parametrize("adapter", ["base", "a1", "a2"])
def test_each_adapter_on_an_int8_base_matches_peft_on_the_dequantized_base(slora_model, slora_exports, adapter):
    """An int8 SLoRA export on Lite: the base's linear layers on the project's kernels, the adapters in
    float32 beside them, against peft with the base's weights quantized and dequantized."""
    export = slora_exports("lite_int8")
    assert json.load(open(os.path.join(export, "manifest.json")))["quantization"]["weights"] == "int8"
    ref = np.load(slora_model / f"reference_int8_{adapter}.npz")
    logits, tokens = run_slots(slora_model, export, "mslite", [ADAPTERS.get(adapter, 0)] * 3, f"int8_{adapter}")
    check_parity(logits, tokens, ref["logits"], ref["tokens"], f"SLoRA {adapter} on an int8 base (Lite)")


@pytest.mark.parametrize("variant, backend", [("io", "ms"), ("packed", "ms"), ("lite_packed", "mslite"),
                                              ("mindformers", "ms")])
@pytest.mark.parametrize("adapter", ["base", "a1", "a2"])
def test_each_adapter_matches_peft(slora_model, slora_exports, variant, backend, adapter):
    export = slora_exports(variant)
    assert [a["name"] for a in json.load(open(os.path.join(export, "manifest.json")))["adapters"]] == ["a1", "a2"]
    ref = np.load(slora_model / f"reference_{adapter}.npz")
    logits, tokens = run_slots(slora_model, export, backend, [ADAPTERS.get(adapter, 0)] * 3,
                               f"{variant}_{adapter}")
    check_parity(logits, tokens, ref["logits"], ref["tokens"], f"SLoRA {adapter} on {backend} ({variant})")


@pytest.mark.parametrize("variant, backend", [("io", "ms"), ("packed", "ms"), ("lite_packed", "mslite"),
                                              ("lite_segments_packed", "mslite")])
def test_rows_of_one_batch_use_their_own_adapters(slora_model, slora_exports, variant, backend):
    """Prompts 0, 1, 2 with adapters a1, base, a2 in one batch: each row is peft's result for that adapter."""
    logits, tokens = run_slots(slora_model, slora_exports(variant), backend, [1, 0, 2], f"{variant}_mixed")
    for row, adapter in enumerate(("a1", "base", "a2")):
        ref = np.load(slora_model / f"reference_{adapter}.npz")
        check_parity(logits[row:row + 1], tokens[row:row + 1], ref["logits"][row:row + 1], ref["tokens"][row:row + 1],
                     f"row {row} ({adapter}) of a mixed batch")


def run_tp2(slora_model, export, backend, slots, tmp_path):
    """Greedy runs of the mixed batch on 2 ranks under the launcher: [(logits, tokens)] per rank."""
    table = rank_table(tmp_path / "table2.json", 2)
    result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", backend,
                      "--log_dir", str(tmp_path / "logs"), "--", os.path.join(REPO, "tests", "support", "tp_worker.py"),
                      str(tmp_path), str(STEPS), str(slora_model / "prompts.json"), json.dumps(slots),
                      "--model_dir", export])
    assert result.returncode == 0, result.stderr[-2000:]
    return [(got["logits"], got["tokens"]) for got in (np.load(tmp_path / f"rank_{rank}.npz") for rank in range(2))]


@pytest.fixture(scope="module")
def tp1_mixed(slora_model, slora_exports):
    """(logits, tokens) of the mixed batch a1, base, a2 on one rank (`ms`, io)."""
    return run_slots(slora_model, slora_exports("io"), "ms", [1, 0, 2], "tp1_mixed")


@pytest.mark.parametrize("variant, backend", [("tp2", "ms"), ("lite_tp2_packed", "mslite")])
def test_tp2_with_adapters_equals_tp1(slora_model, slora_exports, tp1_mixed, tmp_path, variant, backend):
    """Adapters split with their base layers (B by output rows under column parallel, A by input
    columns under row parallel): a mixed batch on 2 ranks gives the single-rank logits, with the
    collectives in the rank graphs (`ms`) and as Lite step segments reduced on the host."""
    want_logits, want_tokens = tp1_mixed
    for rank, (logits, tokens) in enumerate(run_tp2(slora_model, slora_exports(variant), backend, [1, 0, 2], tmp_path)):
        check_parity(logits, tokens, want_logits, want_tokens, f"SLoRA TP=2 ({variant}) rank {rank}")


def test_lite_tp2_adapter_columns_reach_only_the_adapted_segments(slora_model, slora_exports, tmp_path):
    """An adapter of the attention projections only: its column mask is an input of the attention
    segments and not of the MLP segments (Lite drops unused inputs), and rows a1, base, a1 of one
    batch on 2 ranks each give peft's result for their adapter."""
    from lite_runtime.contract.manifest import load_manifest
    export = slora_exports("lite_tp2_a1")
    segments = load_manifest(export).segments
    takes = {name: "adapter_columns" in [s.name for s in entry.inputs] for name, entry in segments.items()}
    assert takes == {name: name.endswith(".attn") for name in segments}, takes
    for rank, (logits, tokens) in enumerate(run_tp2(slora_model, export, "mslite", [1, 0, 1], tmp_path)):
        for row, adapter in enumerate(("a1", "base", "a1")):
            ref = np.load(slora_model / f"reference_{adapter}.npz")
            check_parity(logits[row:row + 1], tokens[row:row + 1], ref["logits"][row:row + 1],
                         ref["tokens"][row:row + 1], f"rank {rank} row {row} ({adapter}) on Lite TP=2")


def test_run_infer_adapter_id(slora_model, slora_exports):
    """--adapter_id picks the adapter; an unknown id runs the base model with a warning naming the known
    ones, or is refused with --strict_adapter."""
    export = slora_exports("lite_packed")
    common = ["run_infer_main.py", "--model_dir", export, "--backend", "mslite", "--predict_data", "one, two,",
              "--max_new_tokens", "8"]
    runs = {name: run_cli(common + (["--adapter_id", name] if name else [])) for name in ("a1", "a2", "", "a9")}
    for name, result in runs.items():
        assert result.returncode == 0, result.stderr[-2000:]
    texts = {name: r.stdout.splitlines()[0] for name, r in runs.items()}
    assert len({texts["a1"], texts["a2"], texts[""]}) == 3, texts    # the adapters change the answer
    assert texts["a9"] == texts[""] and "'a9' is not one of this export's adapters (a1, a2)" in runs["a9"].stderr
    strict = run_cli(common + ["--adapter_id", "a9", "--strict_adapter", "True"])
    assert strict.returncode != 0 and len(error_lines(strict.stderr)) == 1 and "'a9'" in strict.stderr


def _bad_peft(folder, tmp_path, change):
    """A copy of adapter a1 changed by `change(config, tensors)`, listed alone in a lora_adapter.json."""
    from safetensors.numpy import load_file, save_file
    bad = tmp_path / "bad"
    os.makedirs(bad)
    config = json.loads((folder / "a1" / "adapter_config.json").read_text())
    tensors = load_file(str(folder / "a1" / "adapter_model.safetensors"))
    change(config, tensors)
    (bad / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, str(bad / "adapter_model.safetensors"))
    (tmp_path / "lora_adapter.json").write_text(json.dumps({"bad": "bad"}))
    return tmp_path / "lora_adapter.json"


def _drop_b(config, tensors):
    del tensors[next(n for n in tensors if ".lora_B." in n)]


def _wrong_shape(config, tensors):
    name = next(n for n in tensors if ".lora_A." in n)
    tensors[name] = np.zeros((tensors[name].shape[0], 5), np.float32)


def _zero_rank(config, tensors):
    config["r"] = 0


def _embedding_target(config, tensors):
    tensors["base_model.model.model.embed_tokens.lora_A.weight"] = np.zeros((4, 320), np.float32)
    tensors["base_model.model.model.embed_tokens.lora_B.weight"] = np.zeros((64, 4), np.float32)


@pytest.mark.parametrize("change, facts", [
    (_drop_b, ["has no", "lora_B"]), (_wrong_shape, ["A (4, 5)", "needs A (4, 64)"]),
    (_zero_rank, ["LoRA r must be a positive number, got 0"]),
    (_embedding_target, ["embed_tokens", "not a projection"])], ids=["missing_b", "shape", "rank", "target"])
def test_bad_adapters_are_refused(slora_model, tmp_path, change, facts):
    listing = _bad_peft(slora_model, tmp_path, change)
    cfg = slora_yaml(slora_model, tmp_path / "out")
    cfg["model"]["pet_config"]["adapter_path"] = str(listing)
    result = run_cli(["-m", "exporter", "--config", write_yaml(str(tmp_path / "bad.yaml"), cfg)])
    assert result.returncode != 0 and len(error_lines(result.stderr)) == 1, result.stderr[-2000:]
    assert all(f in result.stderr for f in facts), result.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_pipeline_takes_one_adapter_per_prompt(slora_exports):
    from lite_runtime import pipeline
    pipe = pipeline("text_generation", model=slora_exports("io"), backend="ms")
    prompts = ["one, two,", "An increasing", "three four"]
    mixed = pipe(prompts, adapter_id=["a1", None, "a2"], max_new_tokens=8)
    alone = [pipe([p], adapter_id=a, max_new_tokens=8)[0] for p, a in zip(prompts, ["a1", None, "a2"])]
    assert mixed == alone
    assert pipe(prompts[:1], adapter_id="a1", max_new_tokens=8) != pipe(prompts[:1], max_new_tokens=8)


def test_the_server_chooses_each_requests_adapter_by_model_name(slora_model, slora_exports):
    """The Lite SLoRA export served: /v1/models lists the base and each adapter; requests for the
    base model, a1 and a2, in flight together, each give peft's greedy tokens of that adapter; so does
    TGI's route with adapter_id."""
    from concurrent.futures import ThreadPoolExecutor
    from huggingface_hub import InferenceClient
    from support.lite_process import ensure_lite_installed
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.serve.text import TokenText
    from support.serving import client, served
    ensure_lite_installed()
    prompts = json.loads((slora_model / "prompts.json").read_text())
    with served(slora_exports("lite_packed"), "mslite", "base") as (url, _):
        c = client(url)
        assert sorted(m.id for m in c.models.list().data) == ["a1", "a2", "base"]
        jobs = [(name, i) for name in ("base", "a1", "a2") for i in range(len(prompts))]

        def ask(job):
            name, i = job
            answer = c.completions.create(model=name, prompt=prompts[i], max_tokens=6, temperature=0, logprobs=1)
            return answer.choices[0].logprobs.tokens
        with ThreadPoolExecutor(len(jobs)) as pool:
            answers = dict(zip(jobs, pool.map(ask, jobs)))
        tgi = InferenceClient(model=url)       # TGI's route names the adapter by adapter_id (it takes text)
        by_id = {a: [t.id for t in tgi.text_generation("one two three", max_new_tokens=6, adapter_id=a,
                                                      details=True).details.tokens] for a in ("a2", None)}
        by_model = c.completions.create(model="a2", prompt="one two three", max_tokens=6, temperature=0,
                                        logprobs=0).choices[0].logprobs.tokens
    text = TokenText(export_tokenizer(load_manifest(slora_exports("lite_packed")))).text    # logprobs name tokens by text
    for (name, i), pieces in answers.items():
        expected = np.load(slora_model / f"reference_{name}.npz")["tokens"][i][:len(pieces)]
        assert pieces == [text(int(t)) for t in expected], (name, i)
    assert [text(t) for t in by_id["a2"]] == by_model and by_id["a2"] != by_id[None]
