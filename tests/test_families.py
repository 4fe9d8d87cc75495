"""Every family against an independent reference: Hugging Face transformers, or a numpy forward pass
written from the published formulas where transformers has no such model (tests/support/numpy_references.py).

For each case (a family, or one shape of a family: `baichuan2_13b`) a tiny random model is made
locally (tests/support/hf_models.py or tests/support/numpy_references.py, its own process) and exported from the
minimal HF-folder yaml (a family with no HF layout, PanguAlpha: from its MindFormers .ckpt with the
family and sizes in the yaml). Checked, on a batch of 3 prompts of
different lengths for 32 greedy steps: identical tokens and logits within 1e-4 of transformers on
the `ms` backend (MindSpore 2.10 export; kv modes io and packed, and in_graph on LAYOUT_CASES) and on real Lite (MindSpore 2.0 export,
run in a process without mindspore); a MindFormers-named .ckpt with a MindFormers run yaml gives
the HF folder's logits; TP=2 under the launcher gives TP=1's as segments on Lite (and on `ms` for GLM).
"""
import os
import re
from pathlib import Path

import numpy as np
import pytest

from lite_runtime.backends import load_session
from lite_runtime.contract.manifest import load_manifest
from support.family_cases import FAMILIES, STEPS, TOLERANCE, check_parity, family_of, lite_run, reference
from support.greedy_runner import greedy_run
from support.parity_runner import greedy_prompts
from support.tiny_models import REPO, rank_table, run_cli


# The other cache layouts (kv mode in_graph; Lite's static pair and segments) on one case of each kind of
# positions (rotary, ALiBi, learned, GLM's 2-D and GLM2's half rotary, PanGu's top query): internlm, qwen and
# the baichuan2 cases differ from llama and bloom in their weights and layers only, which io and packed check.
LAYOUT_CASES = ("llama", "bloom", "gpt2", "glm2", "glm", "pangualpha")


@pytest.mark.parametrize("family, kv_mode", [(family, kv_mode) for family in FAMILIES for kv_mode in ("io", "packed")] +
                         [(family, "in_graph") for family in LAYOUT_CASES])
def test_ms_backend_matches_transformers(hf_family, family_export, family, kv_mode):
    prompts, ref_logits, ref_tokens = reference(hf_family(family))
    export = family_export(family, kv_mode)
    assert load_manifest(export).family == family_of(family)
    logits, tokens = greedy_prompts(load_session("ms", load_manifest(export)), prompts, STEPS)
    check_parity(logits, tokens, ref_logits, ref_tokens, f"{family} ms {kv_mode}")


@pytest.mark.parametrize("family, variant", [(family, "lite_packed") for family in FAMILIES] +
                         [(family, variant) for family in LAYOUT_CASES for variant in ("lite", "lite_segments_packed")])
def test_lite_matches_transformers(hf_family, family_export, family, variant):
    """The Lite layouts: static MindIR pair; the packed step graph converted to .ms (`lite_ms`), whose
    cache grows through buckets of 16 rows (seq_length 48); one rank's step as segments of whole
    layers, each a .ms (what target cpu writes for a model too large for one .ms)."""
    folder = hf_family(family)
    prompts, ref_logits, ref_tokens = reference(folder)
    logits, tokens = lite_run(folder, family_export(family, variant), f"{variant}_run")
    check_parity(logits, tokens, ref_logits, ref_tokens, f"{family} Lite ({variant})")


LLAMA_OPS, GELU_OPS = {"LiteRMSNorm", "LiteSwiGLU", "LiteRotary"}, {"LiteLayerNorm", "LiteGELU"}


@pytest.mark.parametrize("family, variant, layer_ops", [
    ("llama", "lite_packed_cpu", LLAMA_OPS), ("bloom", "lite_packed_cpu", GELU_OPS),
    ("gpt2", "lite_packed_cpu", GELU_OPS), ("glm", "lite_packed_cpu", GELU_OPS | {"LiteRotary"}),
    ("glm2", "lite_packed_cpu", LLAMA_OPS), ("pangualpha", "lite_packed_cpu", GELU_OPS),
    ("qwen", "lite_segments_packed_cpu", LLAMA_OPS), ("qwen", "lite_segments_packed_kernel", LLAMA_OPS)])
def test_target_cpus_kernels_match_transformers(hf_family, family_export, family, variant, layer_ops):
    """`target: cpu`: each layer's attention one node of the project's kernels (grouped heads and rotary,
    ALiBi, GLM's prefix context and 2-D positions, PanGu's top query layer, segments), its norms, MLP
    activations (SwiGLU; GELU's tanh form: Bloom, GPT-2, GLM; FastGeLU: PanGu) and rotary (rotate-half: Llama,
    Qwen; interleaved pairs over half the head: GLM2; GLM's 2-D) as nodes of the kernels too, and every linear
    layer's product on the float32 kernels (biases beside them: Bloom, GPT-2, GLM, Qwen's q, k, v), the head's
    too (a tied head reads the embedding's table in the kernels' panels, looked up by a kernel: GPT-2)."""
    folder = hf_family(family)
    prompts, ref_logits, ref_tokens = reference(folder)
    export = family_export(family, variant)
    manifest = load_manifest(export)
    kernels = set(manifest.kernels)
    attend = "LiteAttend" if variant.endswith("_kernel") else "LitePagedAttend"    # over host arrays, the store
    assert attend in kernels and kernels & (LLAMA_OPS | GELU_OPS) == layer_ops
    assert manifest.quantization["weights"] == "float32" and "LiteLinearF32P16" in kernels
    graphs = b"".join(path.read_bytes() for path in Path(export).rglob("*.ms"))     # Lite's node names, by scope
    on_kernels, on_matmul = (len(re.findall(rb"Linear/" + node, graphs)) for node in (rb"kernel-KernelProduct",
                                                                                       rb"MatMul"))
    assert on_kernels >= manifest.dims.num_layers and on_matmul == 0, (on_kernels, on_matmul)
    logits, tokens = lite_run(folder, export, f"{variant}_run")
    check_parity(logits, tokens, ref_logits, ref_tokens, f"{family} Lite ({variant})")


TARGET_CPU_PAGED = {"llama", "bloom", "gpt2", "glm", "glm2", "pangualpha"}    # paged above, as target cpu


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in TARGET_CPU_PAGED])
def test_the_paged_store_matches_transformers(hf_family, family_export, family):
    """`attention: paged`: the K/V of every layer in the kernels' store, here float32, written and read by the
    attention nodes; the cases' prompts, then 32 greedy steps, logits within the families' tolerance (float16
    K/V: tests/test_long_prompts.py, tests/test_real_model.py). The families target cpu runs on the store in
    one graph (test_target_cpus_kernels_match_transformers, PanGu's top query layer too) are not run again."""
    folder = hf_family(family)
    prompts, ref_logits, ref_tokens = reference(folder)
    export = family_export(family, "lite_packed_paged")
    assert "LitePagedAttend" in load_manifest(export).kernels
    logits, tokens = lite_run(folder, export, "lite_packed_paged_run", "kv_cache_dtype=float32")
    check_parity(logits, tokens, ref_logits, ref_tokens, f"{family} Lite (paged store)")


@pytest.mark.parametrize("variant", ["lite_packed_b1", "lite_segments_packed_b1"])
def test_lite_packed_step_at_batch_1_matches_transformers(hf_family, family_export, variant):
    """One cache row: the packed step whole and as segments. Lite 2.0 got the head segment's Gather
    of the hidden states by a (1,)-shaped index wrong (other logits than MindSpore from the same MindIR)."""
    folder = hf_family("llama")
    prompts, ref_logits, ref_tokens = reference(folder)
    logits, tokens = lite_run(folder, family_export("llama", variant), f"{variant}_run")
    check_parity(logits, tokens, ref_logits, ref_tokens, f"llama Lite ({variant})")


@pytest.mark.parametrize("family", ["llama", "bloom"])
def test_lite_ms_model_equals_its_mindir(hf_family, family_export, family):
    """The converter's .ms and the MindIR it came from give the same logits (rotary and ALiBi)."""
    folder = hf_family(family)
    export = family_export(family, "lite_packed")
    assert load_manifest(export).lite_files["step"] == ["mindir_step/rank_0_graph.ms"]
    ms_logits, ms_tokens = lite_run(folder, export, "as_ms", "lite_format=ms")
    ir_logits, ir_tokens = lite_run(folder, export, "as_mindir", "lite_format=mindir")
    np.testing.assert_array_equal(ms_tokens, ir_tokens)
    assert np.abs(ms_logits - ir_logits).max() <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_mindformers_checkpoint_and_yaml_give_the_hf_folders_logits(hf_family, family_export, family):
    prompts, _, _ = reference(hf_family(family))
    mf = load_manifest(family_export(family, "mindformers"))
    assert mf.family == family_of(family)
    got = greedy_prompts(load_session("ms", mf), prompts, STEPS)
    want = greedy_prompts(load_session("ms", load_manifest(family_export(family, "io"))), prompts, STEPS)
    np.testing.assert_array_equal(got[1], want[1])
    assert np.abs(got[0] - want[0]).max() <= 1e-6


# Each family's split is checked on Lite (the same rank graphs, cut at their all-reduces); the `ms` backend,
# with MindSpore's collectives in the graphs, on GLM here (2-D positions, a bidirectional prefix) and on
# llama in test_distributed.py.
TP2_CASES = [("glm", "tp2")] + [(family, "lite_tp2_packed") for family in FAMILIES]
# target cpu: each rank's K/V in its own paged store (GQA and rotary, ALiBi slopes split across the ranks, GLM's
# prefix and DeepNorm, PanGu's top query layer)
TP2_CASES += [(family, "lite_tp2_packed_cpu") for family in ("llama", "bloom", "glm", "pangualpha")]


@pytest.mark.parametrize("family, variant", TP2_CASES)
def test_tp2_equals_tp1(hf_family, family_export, family, variant, tmp_path):
    """2 ranks under the launcher give TP=1's greedy tokens and logits: on `ms` with the collectives
    in the rank graphs, and on Lite (CPU) with each rank's step in segments and the all-reduces on the
    host (MPI)."""
    export = family_export(family, variant)
    manifest = load_manifest(export)
    lite = variant.startswith("lite")
    assert manifest.world_size == 2 and manifest.collectives == ("host" if lite else "graph")
    assert ("LitePagedAttend" in manifest.kernels) == variant.endswith("_cpu")
    table = rank_table(tmp_path / "table2.json", 2)
    result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", table,
                      "--backend", "mslite" if lite else "ms",
                      "--log_dir", str(tmp_path / "logs"), "--", os.path.join(REPO, "tests", "support", "tp_worker.py"),
                      str(tmp_path), str(STEPS), "--model_dir", export])
    assert result.returncode == 0, result.stderr[-2000:]
    ref_logits, ref_tokens = greedy_run(load_session("ms", load_manifest(family_export(family, "io"))), STEPS)
    for rank in range(2):
        got = np.load(tmp_path / f"rank_{rank}.npz")
        np.testing.assert_array_equal(got["tokens"], ref_tokens)
        assert np.abs(got["logits"] - ref_logits).max() <= TOLERANCE


@pytest.mark.parametrize("backend", ["ms", "mslite"])
@pytest.mark.parametrize("family, model_name", [("bloom", "bloom_560m"), ("gpt2", "gpt2"), ("llama", "llama2_7b"),
                                                ("qwen", "qwen_7b")])
def test_text_generation_with_the_models_own_tokenizer(hf_family, family_export, family, model_name, backend):
    """run_infer_main.py with an upstream model name: the prompt is encoded by the export's tokenizer
    (tokenizer.json / tokenizer.model shipped from the HF folder) and the continuation is what greedy
    decoding of those ids gives, decoded; both checked with the tokenizer libraries used directly."""
    folder = hf_family(family)
    prompt, new = "An increasing sequence: one, two,", 8
    hf = folder / "hf"
    if (hf / "qwen.tiktoken").exists():        # Qwen's pattern and special tokens, with tiktoken itself
        import base64
        import tiktoken
        lines = (hf / "qwen.tiktoken").read_bytes().splitlines()
        ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in lines)}
        pattern = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                   r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
        specials = {"<|endoftext|>": len(ranks), "<|im_start|>": len(ranks) + 1, "<|im_end|>": len(ranks) + 2}
        enc = tiktoken.Encoding("qwen_test", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
        # generated special ids (<|extra_N|> ...) are left out of the text, as Qwen's decode does
        ids, decode = enc.encode(prompt), lambda t: enc.decode([i for i in t if i < len(ranks)])
    elif (hf / "tokenizer.json").exists():
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
        ids, decode = tok.encode(prompt, add_special_tokens=False).ids, lambda t: tok.decode(t)
    else:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(hf / "tokenizer.model"))
        ids, decode = sp.encode(prompt), lambda t: sp.decode(t)
    _, tokens = greedy_prompts(load_session("ms", load_manifest(family_export(family, "io"))), [ids], new)
    expected_ids = tokens[0][:new].tolist()
    stops = [i for i, t in enumerate(expected_ids) if t in load_manifest(family_export(family, "io")).eos_token_id]
    expected_ids = expected_ids[:stops[0]] if stops else expected_ids       # eos ends generation
    export = family_export(family, "lite" if backend == "mslite" else "io")
    result = run_cli(["run_infer_main.py", "--model_dir", export, "--backend", backend, "--model_name", model_name,
                      "--predict_data", prompt, "--max_new_tokens", str(new)])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[0] == prompt + decode(expected_ids)
