"""Each family's own settings, tokenizers and refusals (the shared parity matrix is
tests/test_families.py): config.json switches, other Hugging Face layouts of a family, prompt formats,
MindFormers names, and what a family refuses, each in one line."""
import json
import os
import sys

import numpy as np
import pytest

from lite_runtime.backends import load_session
from lite_runtime.contract.manifest import load_manifest
from support.family_cases import (BATCH, SEQ, STEPS, TOLERANCE, check_parity, mindformers_ckpt, mindformers_yaml,
                                  reference)
from support.parity_runner import greedy_prompts
from support.tiny_models import REPO, VENV_MS20_PYTHON, export_in_subprocess, run_cli, save_ckpt, write_yaml
from lite_runtime.tokenizers import export_tokenizer


@pytest.mark.fast
def test_internlm_config_json_bias_and_dynamic_rotary():
    """config.json `bias: false` (InternLM-20B) drops the q, k, v, o biases; `rotary.type: dynamic` is
    plain rotary with `rotary.base` up to max_position_embeddings, so longer exports are refused."""
    from exporter.families import family_by_hf_type
    from lite_runtime.contract.errors import ConfigError, UnsupportedError
    hf = {"model_type": "internlm", "vocab_size": 320, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "intermediate_size": 96, "max_position_embeddings": 64, "bias": False,
          "rotary": {"base": 20000, "type": "dynamic"}}
    family = family_by_hf_type("internlm", "config.json")
    cfg = family.config(family.from_hf(hf, "config.json"), "export.yaml")
    assert (cfg.qkv_bias, cfg.o_bias, cfg.rope_theta) == (False, False, 20000)
    cfg.check_seq_length(64)
    with pytest.raises(ConfigError, match="seq_length 65 exceeds 64"):
        cfg.check_seq_length(65)
    cfg = family.config(family.from_hf(dict(hf, bias=True, rotary={"base": 10000, "type": "origin"}), "c"), "e")
    assert (cfg.qkv_bias, cfg.o_bias, cfg.seq_length_limit) == (True, True, None)
    with pytest.raises(UnsupportedError, match="rotary type 'linear'"):
        family.from_hf(dict(hf, rotary={"base": 10000, "type": "linear"}), "config.json")


@pytest.mark.fast
def test_baichuan2_shape_from_config_json_or_model_positions():
    """Rotary when config.json has max_position_embeddings (the 7B configuration), ALiBi when it has
    model_max_length only (the 13B one); `model.positions` overrides; Baichuan-7B v1 is refused."""
    from exporter.families import family_by_hf_type, family_by_name
    from lite_runtime.contract.errors import ConfigError, UnsupportedError
    hf = {"model_type": "baichuan", "vocab_size": 320, "hidden_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 6, "intermediate_size": 96, "model_max_length": 64}
    family = family_by_hf_type("baichuan", "config.json")
    shape = lambda sizes: (lambda c: (c.positions, c.alibi))(family.config(sizes, "export.yaml"))  # noqa: E731
    assert shape(family.from_hf(hf, "config.json")) == ("none", True)
    assert shape(family.from_hf(dict(hf, max_position_embeddings=64), "config.json")) == ("rotary", False)
    assert shape(dict(family.from_hf(hf, "config.json"), positions="rotary")) == ("rotary", False)
    with pytest.raises(ConfigError, match="model.positions 'learned' is not allowed for baichuan2; "
                                          "allowed: rotary, alibi"):
        family.config(dict(family.from_hf(hf, "config.json"), positions="learned"), "export.yaml")
    with pytest.raises(ConfigError, match="model.positions is not read for a llama model"):
        family_by_name("llama", "x").config(dict(family.from_hf(hf, "c"), positions="alibi"), "export.yaml")
    with pytest.raises(UnsupportedError, match="'BaiChuanForCausalLM'"):
        family.from_hf(dict(hf, architectures=["BaiChuanForCausalLM"]), "config.json")


@pytest.mark.fast
def test_qwen_config_json_switches():
    """Qwen v1: the MLP is half of config.json's intermediate_size; use_dynamic_ntk / use_logn_attn
    (on by default upstream) limit seq_length to config.json's seq_length, naming the switch; what
    changes the math otherwise is refused by name. Qwen2: sliding window and rope scaling refused.
    MindFormers: the rotary base is `theta` (QwenConfig is a LlamaConfig), not `rotary_emb_base`."""
    from exporter.families import family_by_hf_type, family_by_mindformers_type
    from lite_runtime.contract.errors import ConfigError, UnsupportedError
    hf = {"model_type": "qwen", "vocab_size": 320, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "kv_channels": 16, "intermediate_size": 192, "layer_norm_epsilon": 1e-6,
          "rotary_emb_base": 20000, "rotary_pct": 1.0, "seq_length": 64, "use_dynamic_ntk": True,
          "use_logn_attn": True}
    family = family_by_hf_type("qwen", "config.json")
    cfg = family.config(family.from_hf(hf, "config.json"), "export.yaml")
    assert (cfg.intermediate_size, cfg.rope_theta, cfg.qkv_bias, cfg.o_bias) == (96, 20000, True, False)
    cfg.check_seq_length(64)
    with pytest.raises(ConfigError, match=r"seq_length 65 exceeds 64, past which use_dynamic_ntk and "
                                          r"use_logn_attn \(on in config.json\) change the attention"):
        cfg.check_seq_length(65)
    logn_only = family.config(family.from_hf(dict(hf, use_dynamic_ntk=False), "config.json"), "e")
    with pytest.raises(ConfigError, match=r"past which use_logn_attn \(on in config.json\) changes"):
        logn_only.check_seq_length(65)
    off = {k: v for k, v in hf.items() if k not in ("use_dynamic_ntk", "use_logn_attn")}
    assert family.config(family.from_hf(off, "c"), "e").seq_length_limit == 64      # upstream's default: on
    off.update(use_dynamic_ntk=False, use_logn_attn=False)
    assert family.config(family.from_hf(off, "c"), "e").seq_length_limit is None
    with pytest.raises(UnsupportedError, match="use_dynamic_ntk and use_logn_attn need seq_length"):
        family.from_hf({k: v for k, v in hf.items() if k != "seq_length"}, "config.json")
    for bad, pattern in [({"rotary_pct": 0.5}, "rotary_pct 0.5"), ({"no_bias": False}, "no_bias false"),
                         ({"rope_scaling": {"type": "dynamic"}}, "rope scaling"),
                         ({"use_cache_quantization": True}, "use_cache_quantization True"),
                         ({"kv_channels": 32}, "kv_channels 32")]:
        with pytest.raises(UnsupportedError, match=pattern):
            family.from_hf(dict(hf, **bad), "config.json")
    qwen2 = {"model_type": "qwen2", "vocab_size": 320, "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "rope_theta": 1e6,
             "use_sliding_window": False, "sliding_window": 32}
    cfg = family.config(family.from_hf(qwen2, "config.json"), "e")
    assert (cfg.n_kv_heads, cfg.intermediate_size, cfg.rope_theta, cfg.seq_length_limit) == (2, 96, 1e6, None)
    for bad, pattern in [({"use_sliding_window": True}, "use_sliding_window True"),
                         ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope scaling")]:
        with pytest.raises(UnsupportedError, match=pattern):
            family.from_hf(dict(qwen2, **bad), "config.json")
    mf = family_by_mindformers_type("QwenForCausalLM", "run.yaml")
    mc = {"vocab_size": 320, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 96,
          "kv_channels": 16, "rotary_pct": 1.0, "rotary_emb_base": 10000}
    assert "rope_theta" not in mf.from_mindformers(mc, "run.yaml")                 # LlamaConfig's 10000
    assert mf.from_mindformers(dict(mc, theta=50000.0), "run.yaml")["rope_theta"] == 50000.0
    with pytest.raises(UnsupportedError, match="rotary_pct 0.5"):
        mf.from_mindformers(dict(mc, rotary_pct=0.5), "run.yaml")


@pytest.mark.parametrize("family, layout", [("glm2", "hf_glm"), ("qwen", "hf_qwen2")])
def test_other_hf_layout_of_a_family_is_the_same_model(hf_family, family, layout, tmp_path):
    """transformers' own folder (GlmForCausalLM, Qwen2ForCausalLM names and config) exports the network
    the remote-code folder of the family does."""
    folder = hf_family(family)
    prompts, ref_logits, ref_tokens = reference(folder)
    cfg = {"model": {"hf_dir": str(folder / layout)}, "seq_length": SEQ, "batch_size": BATCH, "kv_cache": "io",
           "output_dir": str(tmp_path / "export")}
    export = export_in_subprocess(write_yaml(str(tmp_path / "layout.yaml"), cfg))
    logits, tokens = greedy_prompts(load_session("ms", load_manifest(export)), prompts, STEPS)
    check_parity(logits, tokens, ref_logits, ref_tokens, f"{family} from {layout}")


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_chatglm_prompt_prefix_role_tokens_and_stop_ids(hf_family, family_export, backend):
    """A ChatGLM3 export encodes text as [gMASK] sop + the sentencepiece ids, role tokens as single ids
    after the model's pieces, stops at eos, <|user|> and <|observation|> (generation_config.json), and
    run_infer_main.py continues the prompt with what greedy decoding of those ids gives."""
    import sentencepiece as spm
    folder = hf_family("glm2")
    sp = spm.SentencePieceProcessor(model_file=str(folder / "hf" / "tokenizer.model"))
    n = sp.get_piece_size()
    gmask, sop, user, observation = n + 1, n + 3, n + 6, n + 8    # ChatGLM's order of special tokens
    manifest = load_manifest(family_export("glm2", "io"))
    tok = export_tokenizer(manifest)
    prompt = "An increasing sequence: one, two,"
    ids = [gmask, sop] + sp.encode(prompt)
    assert tok.encode(prompt, add_special_tokens=True) == ids and tok.encode(prompt) == ids[2:]
    assert tok.encode("<|user|>one<|observation|>") == [user] + sp.encode("one") + [observation]
    assert manifest.eos_token_id == [2, user, observation]
    new = 8
    _, tokens = greedy_prompts(load_session("ms", manifest), [ids], new)
    expected = tokens[0][:new].tolist()
    stops = [i for i, t in enumerate(expected) if t in (2, user, observation)]
    expected = expected[:stops[0]] if stops else expected
    export = family_export("glm2", "lite" if backend == "mslite" else "io")
    result = run_cli(["run_infer_main.py", "--model_dir", export, "--backend", backend, "--model_name", "glm3_6b",
                      "--predict_data", prompt, "--max_new_tokens", str(new)])
    assert result.returncode == 0, result.stderr[-2000:]
    # the other special ids ([MASK] ... sop, eop) are skipped in the text, as ChatGLM's decode(skip_special_tokens)
    assert result.stdout.splitlines()[0] == prompt + sp.decode([t for t in expected if t < n])


@pytest.mark.fast
def test_glm2_refuses_what_it_does_not_compute():
    """ChatGLM-6B (v1) folders, settings that change ChatGLM2's math, rearranged-rope MindFormers
    checkpoints and other rotary fractions are refused by name; ChatGLM's rope_ratio scales the base."""
    from exporter.families import family_by_hf_type
    from lite_runtime.contract.errors import UnsupportedError
    family = family_by_hf_type("chatglm", "config.json")
    hf = {"model_type": "chatglm", "padded_vocab_size": 336, "hidden_size": 64, "num_layers": 2,
          "num_attention_heads": 4, "kv_channels": 16, "ffn_hidden_size": 96, "multi_query_attention": True,
          "multi_query_group_num": 2, "rope_ratio": 50}
    cfg = family.config(family.from_hf(hf, "config.json"), "export.yaml")
    assert (cfg.n_kv_heads, cfg.rope_theta, cfg.rotary_dim) == (2, 500000.0, 8)
    assert family.config(family.from_hf(dict(hf, multi_query_attention=False), "c"), "e").n_kv_heads == 4
    for bad, match in [({"position_encoding_2d": True}, "ChatGLM-6B \\(v1\\)"),
                       ({"add_bias_linear": True}, "add_bias_linear True"), ({"pre_seq_len": 8}, "pre_seq_len 8"),
                       ({"kv_channels": 32}, "kv_channels 32")]:
        with pytest.raises(UnsupportedError, match=match):
            family.from_hf(dict(hf, **bad), "config.json")
    with pytest.raises(UnsupportedError, match="use_rearrange_rope True"):
        family.from_mindformers({"num_attention_heads": 4, "use_rearrange_rope": True}, "run.yaml")
    glm = family_by_hf_type("glm", "config.json")
    with pytest.raises(UnsupportedError, match="partial_rotary_factor 1.0"):
        glm.from_hf({"model_type": "glm", "hidden_size": 64, "num_attention_heads": 4,
                     "partial_rotary_factor": 1.0}, "config.json")


def pangu_encode(sp, text):
    """MindFormers' PanguAlphaTokenizer on `text`, written here from its description: jieba words,
    spaces and newlines inside them as U+2582 / U+2583, joined by spaces, then sentencepiece."""
    import jieba
    marks = str.maketrans(" \n", "\u2582\u2583")
    return sp.encode(" ".join(word.translate(marks) for word in jieba.cut(text, cut_all=False)))


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_pangualpha_text_generation_with_vocab_model(hf_family, family_export, backend):
    """run_infer_main.py --model_name pangualpha_2_6b on MindFormers' couplet prompt: the shipped
    vocab.model encodes it as upstream's tokenizer does (jieba, then sentencepiece), greedy decoding
    continues those ids until <eot>, and the text is upstream's decode of them (spaces dropped)."""
    import sentencepiece as spm
    folder = hf_family("pangualpha")
    sp = spm.SentencePieceProcessor(model_file=str(folder / "vocab.model"))
    manifest = load_manifest(family_export("pangualpha", "io"))
    assert manifest.tokenizer == "vocab.model" and manifest.eos_token_id == [sp.piece_to_id("<eot>")]
    prompt, new = "上联：欢天喜地度佳节 下联：", 12
    ids = pangu_encode(sp, prompt)
    assert export_tokenizer(manifest).encode(prompt) == ids
    _, tokens = greedy_prompts(load_session("ms", manifest), [ids], new)
    expected = tokens[0][:new].tolist()
    stops = [i for i, t in enumerate(expected) if t in manifest.eos_token_id]
    expected = expected[:stops[0]] if stops else expected
    specials = {sp.piece_to_id(t) for t in ("<eod>", "<pad>")} | {sp.unk_id(), sp.bos_id(), sp.eos_id()}
    text = sp.decode([t for t in expected if t not in specials]).replace(" ", "")
    text = text.replace("\u2582", " ").replace("\u2583", "\n")
    export = family_export("pangualpha", "lite" if backend == "mslite" else "io")
    result = run_cli(["run_infer_main.py", "--model_dir", export, "--backend", backend, "--model_name",
                      "pangualpha_2_6b", "--predict_data", prompt, "--max_new_tokens", str(new)])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[0] == prompt + text


def segment_io(export):
    """segment name -> (input names, output names) from the export's manifest."""
    segments = load_manifest(export).segments
    return {name: ([s.name for s in e.inputs], [s.name for s in e.outputs]) for name, e in segments.items()}


def test_pangualpha_top_query_layer_is_its_own_segments(family_export):
    """Lite TP (`collectives: host`): the top query layer runs as two segments after the blocks, its
    query reading the tokens' positions (a step input) and its residual the final norm's output (returned)."""
    io = segment_io(family_export("pangualpha", "lite_tp2_packed"))
    layers = load_manifest(family_export("pangualpha", "lite_tp2_packed")).dims.num_layers
    assert sorted(io) == sorted(["embed", "head", "top_query.attn", "top_query.mlp"] +
                                [f"layer{l}.{p}" for l in range(layers - 1) for p in ("attn", "mlp")])
    assert io["top_query.attn"] == (["hidden", "token_positions", "token_rows", "past", "row", "position",
                                     "key_cache", "value_cache"], ["attn_part", "residual", "key_new", "value_new"])
    assert io["top_query.mlp"] == (["hidden"], ["mlp_part"])


def test_pangualpha_run_yaml_with_use_past_false_exports_the_incremental_graphs(hf_family, family_export, tmp_path):
    """Upstream's PanguAlpha run yamls say `use_past: False` (as the case's does): the export writes the
    prefill and increment graphs anyway, says so in one line, and gives the HF-style export's logits."""
    folder = hf_family("pangualpha")
    run = mindformers_yaml("pangualpha", folder, mindformers_ckpt(folder), str(tmp_path / "out"))
    assert run["model"]["model_config"]["use_past"] is False
    result = run_cli(["-m", "exporter", "--config", write_yaml(str(tmp_path / "run_pangualpha_2_6b.yaml"), run)])
    assert result.returncode == 0, result.stderr[-2000:]
    said = [line for line in result.stderr.splitlines() if "use_past" in line]
    assert len(said) == 1, result.stderr
    for fact in ("run_pangualpha_2_6b.yaml", "use_past False", "writes the incremental (KV cache) graphs anyway",
                 "the runtime needs them"):
        assert fact in said[0], said[0]
    manifest = load_manifest(str(tmp_path / "out"))
    assert manifest.kv_cache == "io" and sorted(manifest.graphs) == ["increment", "prefill"]
    prompts, _, _ = reference(folder)
    got = greedy_prompts(load_session("ms", manifest), prompts, 4)
    want = greedy_prompts(load_session("ms", load_manifest(family_export("pangualpha", "io"))), prompts, 4)
    np.testing.assert_array_equal(got[1], want[1])
    assert np.abs(got[0] - want[0]).max() <= 1e-6


@pytest.mark.fast
def test_pangualpha_mindformers_names_and_settings():
    """The three tables also under the names upstream's convert_weight.py saves them with; run yaml
    settings that change the network (another activation, post-layernorm residuals, MoE) refused by name;
    num_layers counts the top query layer, seq_length sizes both position tables."""
    from exporter.families import family_by_mindformers_type
    from lite_runtime.contract.errors import UnsupportedError
    family = family_by_mindformers_type("PanguAlphaHeadModel", "run.yaml")
    mc = {"vocab_size": 320, "hidden_size": 64, "ffn_hidden_size": 96, "num_layers": 3, "num_heads": 4,
          "seq_length": 48}
    cfg = family.config(family.from_mindformers(mc, "run.yaml"), "run.yaml")
    assert (cfg.num_layers, cfg.num_blocks, cfg.max_position_embeddings, cfg.intermediate_size, cfg.mlp) == \
        (3, 2, 48, 96, "fast_gelu")
    tables = {"backbone.embedding.word_embedding.embedding_table": "word_embedding_table",
              "backbone.embedding.position_embedding.embedding_table": "position_embedding_table",
              "backbone.top_query_embedding.embedding_table": "query_embedding_table"}
    rng = np.random.default_rng(0)
    named = {k: rng.standard_normal((4, 3)).astype(np.float32) for k in tables}
    plan = family.mindformers_weights
    got = plan.apply(dict(named), cfg, "a.ckpt", family.name)
    assert sorted(got) == ["embed.weight", "pos_embed.weight", "top_query.query_embed.weight"]
    converted = plan.apply({tables[k]: v for k, v in named.items()}, cfg, "b.ckpt", family.name)
    assert all(np.array_equal(got[k], converted[k]) for k in got)
    for bad, match in [({"hidden_act": "gelu"}, "hidden_act 'gelu'"), ({"use_moe": True}, "use_moe True"),
                       ({"post_layernorm_residual": True}, "post_layernorm_residual True")]:
        with pytest.raises(UnsupportedError, match=match):
            family.from_mindformers(dict(mc, **bad), "run.yaml")


def test_glm_prefix_attention_and_block_positions_change_the_output(hf_family, family_export):
    """GLM's prompts are ones where a causal prompt or block positions off by one change the logits far
    beyond the tolerance (numpy reference variants), and the export's graphs take their row inputs
    from the feed builder: wrong ones give other logits, the right ones the reference's."""
    from support import numpy_references as nr
    from lite_runtime.decode.inputs import InputOfInfer
    folder = hf_family("glm")
    prompts, ref_logits, _ = reference(folder)
    weights = {k: v.astype(np.float64) for k, v in nr.glm_weights(nr.GLM, np.random.default_rng(0)).items()}
    for i, prompt in enumerate(prompts):
        right = nr.glm_logits(weights, nr.GLM, prompt, len(prompt))
        assert np.abs(right - ref_logits[i, 0]).max() <= 1e-5
        for wrong in ({"causal": True}, {"block_shift": 1}):
            assert np.abs(nr.glm_logits(weights, nr.GLM, prompt, len(prompt), **wrong) - right).max() > 100 * TOLERANCE
    manifest = load_manifest(family_export("glm", "io"))
    session = load_session("ms", manifest)
    feeds = InputOfInfer.get_inputs("glm_6b", manifest)
    ids = np.zeros((BATCH, SEQ), np.int32)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = p
    lengths = np.array([len(p) for p in prompts], np.int32)
    inputs = feeds.prefill_inputs(ids, lengths)
    np.testing.assert_array_equal(inputs[2], [len(p) - 1 for p in prompts])      # <sop> ends every prompt
    np.testing.assert_array_equal(inputs[3], [len(prompts[0]) - 2, len(prompts[1]) - 2, 3])
    assert np.abs(session.prefill(*inputs) - ref_logits[:, 0]).max() <= TOLERANCE
    for row_input in (2, 3):
        shifted = list(inputs)
        shifted[row_input] = inputs[row_input] - 1
        assert np.abs(session.prefill(*shifted) - ref_logits[:, 0]).max() > 100 * TOLERANCE


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_glm_float16_run_yaml_matches_the_float64_reference(hf_family, family_export, backend, tmp_path):
    """Upstream runs ChatGLM-6B in float16 (run_glm_6b_infer.yaml: compute_dtype and param_init_type
    float16, LayerNorm and softmax in float32): such a run yaml gives float16 graphs which, on `ms`
    (MindSpore 2.10, CPU) and on real Lite (a MindSpore 2.0 export), give the float64 numpy reference's
    greedy tokens for 32 steps and logits within 5e-3 of the largest logit (float16 rounds to 11
    significant bits, ~5e-4 relative per operation; measured 1.5e-3 on `ms`, 6e-4 on Lite). The float32
    export is more than 10x closer on `ms`: this one computes in float16."""
    folder = hf_family("glm")
    run = mindformers_yaml("glm", folder, mindformers_ckpt(folder), str(tmp_path / "out"))
    run["model"]["model_config"].update(compute_dtype="float16", param_init_type="float16")
    python = str(VENV_MS20_PYTHON) if backend == "mslite" else sys.executable
    export = export_in_subprocess(write_yaml(str(tmp_path / "fp16.yaml"), run), python=python)
    assert load_manifest(export).compute_dtype == "float16"
    prompts, ref_logits, ref_tokens = reference(folder)
    out = tmp_path / "fp16.npz"
    result = run_cli([os.path.join(REPO, "tests", "support", "parity_runner.py"), backend, export, str(folder / "prompts.json"),
                      str(STEPS), str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    logits, tokens = np.load(out)["logits"], np.load(out)["tokens"]
    np.testing.assert_array_equal(tokens, ref_tokens)
    error = np.abs(logits - ref_logits).max()
    assert error <= 5e-3 * np.abs(ref_logits).max(), error
    if backend == "ms":
        fp32, _ = greedy_prompts(load_session("ms", load_manifest(family_export("glm", "io"))), prompts, STEPS)
        assert np.abs(fp32 - ref_logits).max() < error / 10


def test_glm_segments_take_the_row_inputs_where_they_are_used(family_export):
    """Lite TP (`collectives: host`): GLM's row inputs are inputs of embed alone (its 2-D positions),
    which hands each token's row's context length to the attention segments (prefix attention); DeepNorm's
    segments return their residual (alpha x the normed input)."""
    io = segment_io(family_export("glm", "lite_tp2_packed"))
    assert io["embed"] == (["input_ids", "token_rows", "token_positions", "past_length", "context_length",
                            "mask_position"], ["hidden", "cos", "sin", "past", "row", "position", "context"])
    assert [n for n, (inputs, _) in io.items() if {"context_length", "mask_position"} & set(inputs)] == ["embed"]
    assert io["layer0.attn"] == (["hidden", "token_rows", "past", "row", "position", "key_cache", "value_cache",
                                  "cos", "sin", "context"], ["attn_part", "residual", "key_new", "value_new"])
    assert io["layer0.mlp"] == (["hidden"], ["mlp_part", "residual"])


@pytest.mark.fast
def test_glm_config_routing_and_settings(tmp_path):
    """`model_type: chatglm` folders with position_encoding_2d are GLM v1's, the others ChatGLM2/3's;
    the MindFormers run yaml's ids and sizes are read, settings that change the network refused by name."""
    from exporter.families import family_by_hf_type, family_by_mindformers_type
    from lite_runtime.contract.errors import ConfigError, UnsupportedError
    v1 = {"model_type": "chatglm", "vocab_size": 320, "hidden_size": 64, "num_layers": 2, "num_attention_heads": 4,
          "inner_hidden_size": 96, "layernorm_epsilon": 1e-5, "position_encoding_2d": True, "mask_token_id": 300,
          "gmask_token_id": 301}
    v2 = {"model_type": "chatglm", "padded_vocab_size": 336, "hidden_size": 64, "num_layers": 2,
          "num_attention_heads": 4, "kv_channels": 16, "ffn_hidden_size": 96, "multi_query_group_num": 2}
    assert family_by_hf_type("chatglm", "c", v1).name == "glm" and family_by_hf_type("chatglm", "c", v2).name == "glm2"
    glm = family_by_hf_type("chatglm", "c", v1)
    cfg = glm.config(glm.from_hf(v1, "config.json"), "e")
    assert (cfg.positions, cfg.rotary_dim, cfg.prefix_attention, cfg.deepnorm, cfg.deepnorm_alpha, cfg.mlp) == \
        ("rotary_2d", 8, True, True, 2.0, "gelu_tanh")
    assert (cfg.intermediate_size, cfg.row_inputs) == (96, 2)
    assert glm.spec.token_ids(glm.from_hf(v1, "config.json")) == {"mask_token_id": 300, "gmask_token_id": 301}
    for bad, match in [({"quantization_bit": 4}, "quantization_bit 4"), ({"pre_seq_len": 8}, "pre_seq_len 8")]:
        with pytest.raises(UnsupportedError, match=match):
            glm.from_hf(dict(v1, **bad), "config.json")
    mf = family_by_mindformers_type("GLMChatModel", "run.yaml")
    assert mf is glm and family_by_mindformers_type("GLMForPreTraining", "run.yaml") is glm
    mc = {"vocab_size": 130528, "hidden_size": 4096, "num_layers": 28, "num_heads": 32, "inner_hidden_size": 16384,
          "layernorm_epsilon": 1e-5, "position_encoding_2d": True, "activation_func": "GELU", "mask_token_id": 130000,
          "gmask_token_id": 130001, "hidden_size_per_attention_head": None}
    cfg = mf.config(mf.from_mindformers(mc, "run.yaml"), "run.yaml")
    assert (cfg.head_dim, cfg.intermediate_size) == (128, 16384)
    assert mf.spec.token_ids(mf.from_mindformers(dict(mc, mask_token_id=7), "run.yaml")) == \
        {"mask_token_id": 7, "gmask_token_id": 130001}
    for bad, match in [({"position_encoding_2d": False}, "position_encoding_2d False"),
                       ({"activation_func": "GEGLU"}, "activation_func 'GEGLU'"),
                       ({"layernorm_order": "sandwich"}, "layernorm_order 'sandwich'"),
                       ({"hidden_size_per_attention_head": 64}, "hidden_size_per_attention_head 64")]:
        with pytest.raises(UnsupportedError, match=match):
            mf.from_mindformers(dict(mc, **bad), "run.yaml")
    from exporter.model_source import _tokenizer_in
    (tmp_path / "ice_text.model").write_bytes(b"")          # a ChatGLM-6B folder's tokenizer is found
    assert _tokenizer_in(str(tmp_path)) == str(tmp_path / "ice_text.model")
    with pytest.raises(ConfigError, match="e: model.mask_token_id is not read for a llama model; families that "
                                          "read it: glm"):
        family_by_hf_type("llama", "c").config({"vocab_size": 8, "hidden_size": 8, "num_layers": 1, "n_heads": 2,
                                                "mask_token_id": 5}, "e")


@pytest.fixture(scope="module")
def glm_6b_export(tmp_path_factory):
    """backend -> export of a tiny GLM with ChatGLM-6B's vocabulary (130528 rows) and its ice_text.model
    (tests/test_tokenizer_chatglm6b.py's released layout), from a MindFormers .ckpt and a
    run_glm_6b_infer.yaml-style run yaml whose processor names the vocab file."""
    from support import numpy_references as nr
    from support.chatglm6b_model import trained_model, with_glm_layout
    folder = tmp_path_factory.mktemp("glm_6b")
    (folder / "ice_text.model").write_bytes(with_glm_layout(trained_model()))
    cfg = dict(vocab_size=130528, hidden_size=16, inner_hidden_size=32, num_layers=1, num_attention_heads=2)
    weights = nr.glm_weights(cfg, np.random.default_rng(1))
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(folder / "ice_text.model"))
    text_pieces = next(i for i in range(sp.get_piece_size()) if sp.id_to_piece(i).startswith("<filler_"))
    weights["lm_head.weight"][text_pieces:] = 0.0      # fillers, specials, bytes: the trained pieces win the argmax
    ckpt = save_ckpt(nr.glm_mindformers_names(weights), str(folder / "glm_6b.ckpt"))
    mc = dict(type="GLMConfig", vocab_size=130528, hidden_size=16, num_layers=1, num_heads=2, inner_hidden_size=32,
              seq_length=SEQ, batch_size=1, layernorm_order="post", layernorm_epsilon=1e-5, use_final_layernorm=True,
              use_past=True, activation_func="GELU", position_encoding_2d=True, compute_dtype="float32",
              bos_token_id=130004, eos_token_id=130005, mask_token_id=130000, gmask_token_id=130001, pad_token_id=3)
    made = {}

    def get(backend):
        if backend not in made:
            out = str(folder / f"export_{backend}")
            run = {"model": {"model_config": mc, "arch": {"type": "GLMChatModel"}},
                   "processor": {"tokenizer": {"type": "ChatGLMTokenizer", "vocab_file": str(folder / "ice_text.model")},
                                 "type": "GLMProcessor"},
                   "load_checkpoint": ckpt, "output_dir": out}
            python = str(VENV_MS20_PYTHON) if backend == "mslite" else sys.executable
            made[backend] = export_in_subprocess(write_yaml(str(folder / f"{backend}.yaml"), run), python=python)
        return made[backend]
    return folder, get


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_glm_6b_text_generation_with_ice_text_model(glm_6b_export, backend):
    """run_infer_main.py --model_name glm_6b on MindFormers' example question: the shipped ice_text.model
    encodes it as upstream's ChatGLMTokenizer does (sentencepiece ids, then [gMASK] <sop>), greedy
    decoding continues those ids, and the text is upstream's decode of them."""
    import sentencepiece as spm
    from support.chatglm6b_model import upstream_ids, upstream_text
    folder, export = glm_6b_export
    sp = spm.SentencePieceProcessor(model_file=str(folder / "ice_text.model"))
    manifest = load_manifest(export("ms"))
    assert manifest.family == "glm" and manifest.tokenizer == "ice_text.model" and manifest.eos_token_id == [130005]
    prompt, new = "中国的首都是哪个城市？", 8
    ids = upstream_ids(sp, prompt) + [130001, 130004]
    assert export_tokenizer(manifest).encode(prompt, add_special_tokens=True) == ids
    _, tokens = greedy_prompts(load_session("ms", manifest), [ids], new)
    expected = tokens[0][:new].tolist()
    stops = [i for i, t in enumerate(expected) if t in manifest.eos_token_id]
    expected = expected[:stops[0]] if stops else expected
    result = run_cli(["run_infer_main.py", "--model_dir", export(backend), "--backend", backend, "--model_name",
                      "glm_6b", "--predict_data", prompt, "--max_new_tokens", str(new)])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[0] == prompt + upstream_text(sp, expected)


@pytest.mark.parametrize("kv_mode", ["io", "packed"])
def test_glm_decode_loop_with_padding_rows_and_two_batches(hf_family, family_export, kv_mode):
    """The runtime's decode loop (generate_batches, the feed builder made from the manifest): 4 prompts
    on a batch of 3 (the second batch padded with inert rows, which have no <sop>) give the reference's
    greedy tokens, up to the first <eop>."""
    from lite_runtime.decode.generation import generate_batches
    from lite_runtime.decode.inputs import GlmInputsOfInfer, InputOfInfer
    folder = hf_family("glm")
    prompts, _, ref_tokens = reference(folder)
    manifest = load_manifest(family_export("glm", kv_mode))
    inputs = InputOfInfer.get_inputs("chatglm_6b", manifest)
    assert isinstance(inputs, GlmInputsOfInfer) and (inputs.mask, inputs.gmask, inputs.sop) == (300, 301, 304)
    eos = manifest.eos_token_id
    assert eos == [305]
    rows = [0, 1, 2, 0]
    got = generate_batches(load_session("ms", manifest), inputs, [prompts[r] for r in rows], [STEPS + 1] * 4, eos,
                           manifest.pad_token_id, lambda logits, ids, lengths, prompt_lengths: logits.argmax(-1))
    for row, tokens in zip(rows, got):
        want = ref_tokens[row].tolist()
        stop = [i for i, t in enumerate(want) if t in eos]
        assert tokens == (want[:stop[0] + 1] if stop else want)


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_glm_gelu_is_upstreams_at_a_larger_weight_scale(tmp_path_factory, backend):
    """With the weight matrices twice the family case's, the GELU's inputs reach its curved range: the
    tanh-form GELU (MindSpore's GeLU primitive, which upstream's MLPWithGEGLU runs) computed through the
    Tanh kernels of MindSpore 2.10 / Lite 2.0 on CPU (approximations) moved the logits by 1.4e-3 from
    the float64 reference; computed through Sigmoid, the export stays within the tolerance."""
    folder = tmp_path_factory.mktemp("glm_scale2")
    steps = 8
    result = run_cli([os.path.join(REPO, "tests", "support", "numpy_references.py"), "glm", str(folder), str(steps), "2.0"])
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = {"model": {"hf_dir": str(folder / "hf")}, "seq_length": SEQ, "batch_size": BATCH, "kv_cache": "io",
           "output_dir": str(folder / "export")}
    python = str(VENV_MS20_PYTHON) if backend == "mslite" else sys.executable
    export = export_in_subprocess(write_yaml(str(folder / "export.yaml"), cfg), python=python)
    out = str(folder / "run.npz")
    result = run_cli([os.path.join(REPO, "tests", "support", "parity_runner.py"), backend, export, str(folder / "prompts.json"),
                      str(steps), out])
    assert result.returncode == 0, result.stderr[-3000:]
    _, ref_logits, ref_tokens = reference(folder)
    check_parity(np.load(out)["logits"], np.load(out)["tokens"], ref_logits, ref_tokens, f"glm x2 on {backend}")


def test_llama_with_attention_and_mlp_biases_matches_transformers(tmp_path):
    """transformers' LlamaForCausalLM with attention_bias and mlp_bias (biases on q, k, v, o, gate, up,
    down): the folder exports with those biases and gives transformers' greedy tokens and logits."""
    steps = 8
    result = run_cli([os.path.join(REPO, "tests", "support", "hf_models.py"), "llama_bias", str(tmp_path), str(steps)])
    assert result.returncode == 0, result.stderr[-3000:]
    cfg = {"model": {"hf_dir": str(tmp_path / "hf")}, "seq_length": SEQ, "batch_size": BATCH, "kv_cache": "io",
           "output_dir": str(tmp_path / "export")}
    manifest = load_manifest(export_in_subprocess(write_yaml(str(tmp_path / "export.yaml"), cfg)))
    assert manifest.family == "llama"
    assert all(manifest.model_config[k] for k in ("qkv_bias", "o_bias", "mlp_bias"))
    prompts, ref_logits, ref_tokens = reference(tmp_path)
    logits, tokens = greedy_prompts(load_session("ms", manifest), prompts, steps)
    check_parity(logits, tokens, ref_logits, ref_tokens, "llama with attention_bias and mlp_bias")


def test_mindformers_qwen2_as_llama_with_qkv_has_bias(hf_family, tmp_path):
    """MindFormers runs Qwen1.5 / Qwen2 as LlamaForCausalLM with qkv_has_bias: True: the qwen case's
    transformers Qwen2 weights under Llama's MindFormers names (biases on wq, wk, wv; none on wo) and such
    a run yaml export the qwen family (what --model_name qwen1_5_7b / qwen2_7b name) with transformers'
    tokens and logits."""
    from safetensors.numpy import load_file
    from support.hf_models import llama_mf_name
    from lite_runtime.contract.families import family_from_model_name, get_family
    folder = hf_family("qwen")
    hf = json.loads((folder / "hf_qwen2" / "config.json").read_text())
    tensors = load_file(str(folder / "hf_qwen2" / "model.safetensors"))
    ckpt = save_ckpt({llama_mf_name(k): v for k, v in tensors.items()}, str(tmp_path / "qwen2.ckpt"))
    assert not any(".wo.bias" in k for k in map(llama_mf_name, tensors))
    mc = dict(type="LlamaConfig", batch_size=BATCH, seq_length=SEQ, hidden_size=hf["hidden_size"],
              num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
              n_kv_heads=hf["num_key_value_heads"], intermediate_size=hf["intermediate_size"],
              vocab_size=hf["vocab_size"], rms_norm_eps=hf["rms_norm_eps"], qkv_has_bias=True,
              theta=hf.get("rope_theta") or hf["rope_parameters"]["rope_theta"], compute_dtype="float32",
              bos_token_id=1, eos_token_id=2, pad_token_id=0, use_past=True)
    run = {"model": {"model_config": mc, "arch": {"type": "LlamaForCausalLM"}}, "load_checkpoint": ckpt,
           "output_dir": str(tmp_path / "out")}
    manifest = load_manifest(export_in_subprocess(write_yaml(str(tmp_path / "run_qwen2_7b.yaml"), run)))
    assert manifest.family == "qwen" and manifest.model_config["qkv_bias"] and not manifest.model_config["o_bias"]
    for name in ("qwen1_5_7b", "qwen2_7b", "qwen_7b"):
        assert get_family(family_from_model_name(name)).name == "qwen"
    prompts, ref_logits, ref_tokens = reference(folder)
    logits, tokens = greedy_prompts(load_session("ms", manifest), prompts, STEPS)
    check_parity(logits, tokens, ref_logits, ref_tokens, "qwen2 from a MindFormers llama run yaml")
