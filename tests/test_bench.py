"""`python tools/benchmark.py` on the tiny model (backend ms, a few steps): the JSON report has
every field and sane values. No timing thresholds: these machines are noisy."""
import json
import os
import sys

import pytest

from support.tiny_models import REPO, run_cli

FIELDS = ("backend", "batch", "graph_batch", "decode_steps", "ttft_ms", "step_ms", "graph_ms", "host_ms",
          "sample_ms", "detok_ms", "tok_s", "e2e_tok_s", "peak_rss_mb", "load_s", "bare_predict_ms",
          "step_over_bare", "detokenize", "mindspore_in_process")
STEPS = 5


def test_bench_reports_every_figure(tiny_exports, tmp_path):
    out = tmp_path / "bench.json"
    result = run_cli([os.path.join(REPO, "tools", "benchmark.py"), "--model_dir", tiny_exports["io"], "--backend", "ms",
                      "--steps", str(STEPS), "--prompt_len", "8", "--python", sys.executable,
                      "--json", str(out)], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "host ms/step" in result.stdout and "TTFT ms" in result.stdout
    [report] = json.loads(out.read_text())
    missing = [f for f in FIELDS if f not in report]
    assert not missing, missing
    assert report["backend"] == "ms" and report["batch"] == report["graph_batch"] == 3
    assert report["decode_steps"] == STEPS - 1 and report["new_tokens"] == STEPS
    assert report["ttft_ms"] > 0 and report["tok_s"] > 0 and report["peak_rss_mb"] > 10
    for key in ("step_ms", "graph_ms", "host_ms"):
        stats = report[key]
        assert 0 <= stats["min"] <= stats["median"] <= stats["p90"], (key, stats)
    assert report["graph_ms"]["median"] <= report["step_ms"]["median"]
    assert report["host_ms"]["min"] >= 0
    assert report["bare_predict_ms"] is None and report["step_over_bare"] is None  # ms has no bare hook
    assert len(report["tokens"]) == 3 and all(len(row) == STEPS for row in report["tokens"])


@pytest.mark.fast
def test_bench_parent_never_imports_mindspore():
    code = (f"import sys; sys.path.insert(0, {os.path.join(REPO, 'tools')!r}); import bench_decode as b; "
            "b.command; "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'mindspore']")
    result = run_cli(["-c", code])
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.fast
def test_peer_report_takes_same_round_ratios_and_drops_runtimes_with_other_tokens():
    """tools/compare_peers.py's summary on made-up rounds (its wiring; the runtimes are not run here)."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    from compare_peers import summarise

    def run(runtime, round_, step, tokens=((5, 6),)):
        return dict(runtime=runtime, batch=1, round=round_, step=step, ttft=2 * step, rss=100.0, load_s=0.1,
                    steps=1, tokens=[list(t) for t in tokens])
    # Per round mslite / ort = 0.5, 1.0, 0.125: their median is 0.5; the ratio of medians would be 0.25.
    results = []
    for round_, (mine, ort) in enumerate([(1.0, 2.0), (4.0, 4.0), (1.0, 8.0)]):
        results += [run("transformers", round_, 8.0), run("mslite", round_, mine), run("ort", round_, ort),
                    run("openvino", round_, 1.0, ((5, 7),) if round_ == 1 else ((5, 6),))]
    summary = summarise(results)
    assert summary["ratios"][("ort", 1)]["step"] == 0.5 and summary["ratios"][("ort", 1)]["ttft"] == 0.5
    assert summary["rows"][("ort", 1)]["step"] == 4.0 and summary["rows"][("ort", 1)]["rounds"] == 3
    assert not summary["rows"][("openvino", 1)]["same_tokens"] and ("openvino", 1) not in summary["ratios"]


@pytest.mark.fast
def test_slora_summary_takes_same_round_ratios_and_pairs_the_one_rank_llama_exports():
    """tools/bench_decode.py --slora: its summary and pairing on made-up results (nothing is run here)."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    from bench_decode import format_slora, slora_job, slora_pairs, slora_summary

    # Per round SLoRA / base = 1.5, 1.0, 1.25: their median is 1.25; the ratio of the medians would be 5 / 4.
    rounds = [dict(base_ms=b, slora_ms=s) for b, s in [(2.0, 3.0), (8.0, 8.0), (4.0, 5.0)]]
    results = [dict(backend="mslite", batch=8, rounds=rounds), dict(backend="ms", batch=8, error="timed out"),
               dict(backend="ms", batch=1, rounds=[])]
    summary = slora_summary(results)
    assert summary == {("mslite", 8): dict(base_ms=4.0, slora_ms=5.0, ratio=1.25, rounds=3)}
    assert "1.250x" in format_slora(summary).splitlines()[-1]

    def job(family, backend, batch, adapters, world_size=1):
        return dict(family=family, backend=backend, batch=batch, adapters=adapters, world_size=world_size)
    jobs = [job("llama", "ms", 1, 0), job("llama", "ms", 1, 2), job("llama", "ms", 1, 0, world_size=2),
            job("bloom", "ms", 1, 0), job("llama", "mslite", 8, 0), job("llama", "mslite", 8, 2),
            job("gpt2", "ms", 8, 0)]
    assert slora_pairs(jobs) == [(jobs[0], jobs[1]), (jobs[4], jobs[5])]
    pair = slora_job(dict(jobs[4], model_dir="base"), dict(jobs[5], model_dir="slora"), 5)
    assert pair["model_dirs"] == ["base", "slora"] and pair["rounds"] == 5 and pair["batch"] == 8


@pytest.mark.fast
def test_slora_adapters_are_peft_folders_of_random_non_zero_lora_matrices(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "tools"))
    from bench_decode import BENCH_MODELS
    from bench_export import SLORA_ADAPTERS, SLORA_RANK, write_slora_adapters
    from exporter.weights.adapters import read_peft_adapter

    model = dict(BENCH_MODELS["llama"], hidden_size=32, num_layers=2, n_heads=4, n_kv_heads=2)
    path = write_slora_adapters(str(tmp_path), model)
    assert path == str(tmp_path / "lora_adapter.json")
    assert json.loads((tmp_path / "lora_adapter.json").read_text()) == {name: name for name in SLORA_ADAPTERS}
    first, second = (read_peft_adapter(str(tmp_path / name)) for name in SLORA_ADAPTERS)
    assert first.r == SLORA_RANK and len(first.pairs) == 2 * 4      # q, k, v, o of both blocks
    a, b = first.pairs["model.layers.1.self_attn.k_proj.weight"]
    assert a.shape == (SLORA_RANK, 32) and b.shape == (16, SLORA_RANK)   # k: 2 kv heads of head_dim 8
    assert first.pairs["model.layers.0.self_attn.o_proj.weight"][1].shape == (32, SLORA_RANK)
    assert all((a != 0).all() and (b != 0).all() for a, b in first.pairs.values())
    assert first.sha256 != second.sha256


@pytest.mark.fast
def test_multi_rank_runs_are_checked_against_the_one_rank_tokens():
    """tools/bench_decode.py: a TP run's line says whether it chose the one-rank run's tokens."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    from bench_decode import one_rank_agreement

    def run(ranks, tokens, batch=1, backend="mslite"):
        return dict(family="llama", backend=backend, batch=batch, world_size=ranks, tokens=tokens)
    results = [run(1, [[5, 6]]), run(2, [[5, 6]]), run(2, [[5, 7]]), run(2, [[5, 6]], batch=8),
               run(1, [[5, 7]], backend="ms")]
    assert one_rank_agreement(results[1], results) == "tokens identical to 1 rank"
    assert one_rank_agreement(results[2], results) == "TOKENS DIFFER FROM 1 RANK"
    assert one_rank_agreement(results[3], results) == "no one-rank run to compare tokens with"


@pytest.mark.fast
def test_scale_bench_counts_refuses_and_compares_tokens(tmp_path):
    """tools/bench_scale.py's pieces that run no model: TinyLlama-1.1B's parameter count, a shape too
    large for the memory limit refused by name and a form too large skipped, the tokens check, and the watchdog killing a child
    that passes its resident limit (with its peak RSS still reported)."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import pytest
    from bench_export import timed_process
    from bench_scale import SHAPES, check_memory, command, compare_tokens, weight_counts
    from lite_runtime.contract.command_line import parse_options
    from lite_runtime.contract.errors import ToolchainError

    assert weight_counts(SHAPES["1b"])["total"] == 1_100_048_384      # TinyLlama-1.1B's
    args = parse_options(command, ["--shape", "3b"])
    with pytest.raises(ToolchainError, match=r"shape 3b: 12\.8 GiB .* mslite would need .* above --rss_limit_gb 20: refused"):
        check_memory(args, SHAPES["3b"], args.runtime)
    assert check_memory(args, SHAPES["3b"], ["ort"]) == {}      # 1.3x the weights fits in 20 GB
    skipped = check_memory(args, SHAPES["1b"], args.runtime)    # the io MindIR form's two graphs do not
    assert list(skipped) == ["mslite_io"] and skipped["mslite_io"].startswith("skipped: needs about 20.5 GiB")
    assert compare_tokens([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) == "same"
    assert compare_tokens([[1, 2, 3], [4, 9, 6]], [[1, 2, 3], [4, 5, 6]]) == "DIFFER: 1/2 rows, row 1 from token 1"
    grow = "import time\nx = bytearray(300 * 2 ** 20)\nx[::4096] = b'1' * len(x[::4096])\ntime.sleep(60)\n"
    r = timed_process([sys.executable, "-c", grow], str(tmp_path / "log"), 30, rss_limit_mb=200)
    assert r["error"].startswith("killed at") and r["wall_s"] < 20 and r["peak_rss_mb"] > 200


def test_bench_checkpoint_holds_every_weight_at_the_models_full_shape(tmp_path):
    """make bench's random checkpoint: the network is built with one-element weight placeholders, so
    the writer must take each weight's full shape (it once wrote (1, 1) tensors no export could load)."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    from bench_decode import BENCH_MODELS, WRITE_CKPT

    model = dict(BENCH_MODELS["llama"], vocab_size=64, hidden_size=32, num_layers=1, n_heads=4, n_kv_heads=2,
                 intermediate_size=48)
    ckpt = tmp_path / "bench.ckpt"
    check = ("import json, sys, mindspore as ms; "
             "print(json.dumps({k: v.shape for k, v in ms.load_checkpoint(sys.argv[1]).items()}))")
    assert run_cli(["-c", WRITE_CKPT, str(ckpt), json.dumps(model)]).returncode == 0
    result = run_cli(["-c", check, str(ckpt)])
    assert result.returncode == 0, result.stderr[-2000:]
    shapes = {k: tuple(v) for k, v in json.loads(result.stdout.strip().splitlines()[-1]).items()}
    assert shapes["model.tok_embeddings.embedding_weight"] == (64, 32)
    assert shapes["model.layers.0.attention.wk.weight"] == (16, 32)          # 2 kv heads of head_dim 8
    assert shapes["model.layers.0.feed_forward.w1.weight"] == (48, 32)
    assert all(len(s) == 1 or min(s) > 1 for s in shapes.values()), shapes


@pytest.mark.fast
def test_shape_gguf_has_its_shape_and_the_real_tokenizer_padded(tmp_path, monkeypatch):
    """tools/shape_gguf.py: the exporter reads the file back as the shape's config, every tensor at its size,
    SmolLM2's tokens first and control tokens up to the shape's vocabulary."""
    sys.path.insert(0, os.path.join(REPO, "tools"))
    import shape_gguf
    from exporter.weights.gguf_io import GGUFSource
    small = dict(shape_gguf.SHAPES["qwen2-0.5b"], hidden=64, ffn=96, layers=2, heads=4, kv_heads=2, vocab=49200)
    monkeypatch.setitem(shape_gguf.SHAPES, "small", small)
    tokenizer = os.path.join(REPO, "build", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    out = str(tmp_path / "small.F16.gguf")
    shape_gguf.write_shape_gguf("small", out, tokenizer)
    source = GGUFSource(out)
    config = source.hf_config()
    assert (config["model_type"], config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
            config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == \
        ("qwen2", 64, 96, 2, 4, 2, 49200)
    assert config["tie_word_embeddings"] and config["eos_token_id"] == 2
    tensors = source.tensors()
    assert tensors["model.embed_tokens.weight"].shape == (49200, 64)
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    assert tensors["model.layers.1.self_attn.k_proj.bias"].shape == (32,)
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (64, 96)
    real, padded = GGUFSource(tokenizer), source
    tokens = padded._field("tokenizer.ggml.tokens")
    assert tokens[:49152] == real._field("tokenizer.ggml.tokens") and len(tokens) == 49200
    assert set(padded._field("tokenizer.ggml.token_type")[49152:]) == {3}    # control: never made from text
    monkeypatch.setitem(shape_gguf.SHAPES, "small", dict(small, vocab=1000))
    with pytest.raises(shape_gguf.click.UsageError, match="49152 tokens, more than small's vocabulary of 1000"):
        shape_gguf.write_shape_gguf("small", str(tmp_path / "none.F16.gguf"), tokenizer)
    assert not os.path.exists(tmp_path / "none.F16.gguf") and not os.path.exists(tmp_path / "none.F16.gguf.part")
