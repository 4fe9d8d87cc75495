"""GGUF input (`model.gguf`) against transformers' own GGUF loader (`from_pretrained(dir,
gguf_file=...)`, which dequantizes with its own code): tiny Llama and Qwen2 files written as
llama.cpp's converter writes them (tests/support/gguf_models.py), every linear layer in another tensor type.
The tensors equal transformers' (1e-6), the tokenizer gives its ids, the export's greedy tokens
are its greedy tokens (logits within 1e-4, backend ms), and what cannot be read is refused by name."""
import json
import os

import numpy as np
import pytest

from support.family_cases import TOLERANCE
from support.gguf_models import LINEAR_TYPES
from support.tiny_models import REPO, error_lines, export_in_subprocess, run_cli, write_yaml

PROMPTS = ["An increasing sequence: one, two", "The numbers are", "<|im_start|>user\nCount<|im_end|>\n"]
STEPS = 8
TEXTS = PROMPTS + [" leading  spaces\n\nnew lines 123 4567", "ï 中文 emoji 😀"]


@pytest.fixture(scope="session")
def gguf_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    out = {}
    for arch in ("llama", "qwen2"):
        result = run_cli([os.path.join(REPO, "tests", "support", "gguf_models.py"), arch, str(folder / arch)])
        assert result.returncode == 0, result.stderr[-3000:]
        out[arch] = str(folder / arch / "model.gguf")
    return out


def _transformers(path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, name = os.path.split(path)
    return (AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(folder, gguf_file=name))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tensors_and_tokenizer_are_transformers_gguf_loaders(gguf_files, arch, tmp_path):
    import gguf
    from exporter.weights.gguf_io import GGUFSource
    from lite_runtime.tokenizers import load_tokenizer
    model, tokenizer = _transformers(gguf_files[arch])
    kinds = {t.tensor_type.name for t in gguf.GGUFReader(gguf_files[arch]).tensors}
    assert set(LINEAR_TYPES) <= kinds
    source = GGUFSource(gguf_files[arch])
    ours, theirs = source.tensors(), {k: v.numpy() for k, v in model.state_dict().items()}
    assert set(ours) == set(theirs) - ({"lm_head.weight"} if arch == "llama" else set())   # llama: tied head
    for name, value in ours.items():
        np.testing.assert_allclose(value, theirs[name], atol=1e-6, err_msg=name)
    written = source.write_tokenizer(str(tmp_path))
    assert sorted(os.path.basename(p) for p in written) == ["chat_template.jinja", "tokenizer.json",
                                                            "tokenizer_config.json"]
    ours_tok = load_tokenizer(str(tmp_path))
    for text in TEXTS:
        for special in (True, False):
            assert ours_tok.encode(text, add_special_tokens=special) == \
                tokenizer(text, add_special_tokens=special).input_ids, (text, special)
    assert ours_tok.eos_token_id == tokenizer.eos_token_id


def _greedy_reference(model, tokenizer):
    import torch
    prompts, logits = [], []
    for text in PROMPTS:
        ids = tokenizer(text, add_special_tokens=True).input_ids
        prompts.append(ids)
        row, seq = [], list(ids)
        with torch.no_grad():
            for _ in range(STEPS + 1):
                step = model(torch.tensor([seq])).logits[0, -1].numpy()
                row.append(step)
                seq.append(int(step.argmax()))
        logits.append(np.stack(row))
    logits = np.stack(logits)
    return prompts, logits, logits.argmax(-1)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_gguf_exports_and_decodes_as_transformers(gguf_files, arch, tmp_path):
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from support.parity_runner import greedy_prompts
    prompts, ref_logits, ref_tokens = _greedy_reference(*_transformers(gguf_files[arch]))
    yaml_path = write_yaml(str(tmp_path / "gguf.yaml"), {"model": {"gguf": gguf_files[arch]}, "seq_length": 48,
                                                         "batch_size": 3, "kv_cache": "packed",
                                                         "output_dir": str(tmp_path / "out")})
    export = export_in_subprocess(yaml_path)
    assert os.path.isfile(os.path.join(export, "chat_template.jinja"))
    manifest = load_manifest(export)
    assert manifest.family == ("llama" if arch == "llama" else "qwen")
    logits, tokens = greedy_prompts(load_session("ms", manifest), prompts, STEPS)
    np.testing.assert_array_equal(tokens, ref_tokens)
    assert np.abs(logits - ref_logits).max() <= TOLERANCE


def test_q8_0_layers_exported_as_int8_keep_their_blocks_on_lite(tmp_path):
    """A Llama GGUF whose every linear layer and embedding is Q8_0 (its head tied to the embedding, as SmolLM2's),
    exported with `weights`, `head` and `embedding` int8 (target cpu, MindSpore 2.0): each is stored as its
    blocks are (int8 in groups of 32, the default, each with a float16 scale: LiteLinearI8GroupF16P16 and the
    table's lookup LiteGatherI8GroupF16P16: a Q8_0 block comes back as it is), so on Lite its greedy tokens are
    transformers' on the file and its logits within TOLERANCE of them (rounded again per channel they differ by
    more: checked below on the same weights)."""
    import gguf
    from exporter.weights import quantize as quantizers
    from lite_runtime.contract import quant
    from lite_runtime.contract.manifest import load_manifest
    from support.tiny_models import VENV_MS20_PYTHON
    result = run_cli([os.path.join(REPO, "tests", "support", "gguf_models.py"), "llama", str(tmp_path), "linear=Q8_0"])
    assert result.returncode == 0, result.stderr[-3000:]
    path = str(tmp_path / "model.gguf")
    model, tokenizer = _transformers(path)
    prompts, ref_logits, ref_tokens = _greedy_reference(model, tokenizer)
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    yaml_path = write_yaml(str(tmp_path / "q8.yaml"), {"model": {"gguf": path}, "seq_length": 48, "batch_size": 3,
                                                       "target": "cpu", "quantization": {
                                                           "weights": "int8", "head": "int8", "embedding": "int8"},
                                                       "output_dir": str(tmp_path / "out")})
    export = export_in_subprocess(yaml_path, python=VENV_MS20_PYTHON)
    assert {"LiteLinearI8GroupF16P16", "LiteGatherI8GroupF16P16"} <= set(load_manifest(export).kernels)
    out = str(tmp_path / "lite.npz")
    result = run_cli([os.path.join(REPO, "tests", "support", "parity_runner.py"), "mslite", export,
                      str(tmp_path / "prompts.json"), str(STEPS), out])
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(out)
    np.testing.assert_array_equal(got["tokens"][:len(prompts)], ref_tokens)
    assert np.abs(got["logits"][:len(prompts)] - ref_logits).max() <= TOLERANCE
    weights = {t.name: gguf.quants.dequantize(t.data, t.tensor_type)
               for t in gguf.GGUFReader(path).tensors if t.name.startswith("blk.")}
    w = weights["blk.0.ffn_down.weight"]
    again = quant.dequantize_int8(*quantizers.quantize_int8(w))          # by channel
    stored = quantizers.quantize(w, "int8")
    assert stored[0] == "int8_group" and np.array_equal(quant.dequantize(*stored, w.shape[1]), w)
    assert np.abs(again - w).max() > 1e-3 * np.abs(w).max()


def test_a_tensor_type_it_cannot_read_is_refused_by_name(tmp_path):
    result = run_cli([os.path.join(REPO, "tests", "support", "gguf_models.py"), "llama", str(tmp_path), "IQ4_NL"])
    assert result.returncode == 0, result.stderr[-3000:]
    yaml_path = write_yaml(str(tmp_path / "bad.yaml"), {"model": {"gguf": str(tmp_path / "model.gguf")},
                                                        "seq_length": 48, "output_dir": str(tmp_path / "out")})
    result = run_cli(["-m", "exporter", "--config", yaml_path])
    assert result.returncode != 0 and not os.path.exists(tmp_path / "out")
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "blk.1.ffn_down.weight has type IQ4_NL" in lines[0] and "Q4_K" in lines[0], lines


def test_an_architecture_it_does_not_map_is_refused_by_name(tmp_path):
    import gguf
    writer = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi3")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    yaml_path = write_yaml(str(tmp_path / "phi.yaml"), {"model": {"gguf": "phi.gguf"}, "seq_length": 48,
                                                        "output_dir": str(tmp_path / "out")})
    result = run_cli(["-m", "exporter", "--config", yaml_path])
    lines = error_lines(result.stderr)
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert "architecture 'phi3' is not supported; allowed: llama, qwen2" in lines[0]
    assert json.loads(json.dumps(lines))       # one plain line


@pytest.mark.fast
def test_a_truncated_file_names_the_tensor_where_the_file_ends_and_the_bytes_it_needs(tmp_path):
    """A file cut short (an interrupted download) is refused when opened, naming the first tensor that lies
    past its end, not with the reader's `cannot reshape array of size ...`."""
    import gguf
    path = tmp_path / "cut.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), np.float32))
    writer.add_tensor("output_norm.weight", np.ones(32, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    norm = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "output_norm.weight")
    cut = norm.data_offset + 28      # 7 of its 32 floats left
    os.truncate(path, cut)
    yaml_path = write_yaml(str(tmp_path / "cut.yaml"), {"model": {"gguf": str(path)}, "seq_length": 48,
                                                        "output_dir": str(tmp_path / "out")})
    result = run_cli(["-m", "exporter", "--config", yaml_path])
    lines = error_lines(result.stderr)
    assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fact in (str(path), f"the file ends at byte {cut}", "tensor output_norm.weight", "needs 128 bytes",
                 f"from byte {norm.data_offset}", "truncated"):
        assert fact in lines[0], lines[0]
    assert "reshape" not in lines[0]


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_int4_in_groups_of_32_holds_a_q4_tensor_on_its_own_grid(kind):
    """A Q4_0 or Q4_1 tensor (as the gguf package quantizes, llama.cpp's rules), exported as int4 g32, keeps its
    values (up to float32's rounding of d q + m): such blocks seldom reach both ends of their grid, and a grid
    from a block's min and max would round it a second time; their d and m (Q4_0's -8 d) are float16s, as
    int4's scales and mins are. Q4_0's is stored as Q4_0 is, without mins (int4_sym), and the general form
    holds it too (with a negative scale where d is). Random Q4_K blocks, whose steps and mins are 6-bit
    multiples of float16s, stay within float16's rounding of their grid (1 % of a step; a second rounding
    moves values up to half a step)."""
    from gguf import GGMLQuantizationType, quants
    from exporter.weights import quantize as quantizers
    from lite_runtime.contract import quant
    from support.gguf_models import k_blocks
    rng = np.random.default_rng(5)
    qtype = GGMLQuantizationType[kind]
    blocks = (k_blocks(kind, (24, 256), rng) if kind == "Q4_K"
              else quants.quantize(rng.standard_normal((24, 256)).astype(np.float32), qtype))
    values = quants.dequantize(blocks, qtype)
    values[3, 64:96] = 0        # a block of zeros (d 0)
    storage, constants = quantizers.quantize(values, "int4", 32)
    assert storage == ("int4_sym" if kind == "Q4_0" else "int4_min")
    general = quantizers.quantize_int4(values, 32)
    for error in (np.abs(quant.dequantize(storage, constants, 256, 32) - values),
                  np.abs(quant.dequantize_int4(*general, 256, 32) - values)):
        if kind == "Q4_K":
            assert (error <= 1e-2 * np.abs(np.repeat(quant.unpack_halves(general[1]), 32, axis=1))).all()
        else:
            assert error.max() <= 1e-6 * np.abs(values).max()


def test_int4_grids_of_other_weights_stay_min_to_max():
    """Weights on no 4-bit grid keep 15 steps from each group's min to its max."""
    from exporter.weights import quantize as quantizers
    from lite_runtime.contract import quant
    w = np.random.default_rng(6).standard_normal((64, 256)).astype(np.float32)
    assert quantizers.quantize(w, "int4", 32)[0] == "int4_min"
    _, scale, _ = quantizers.quantize_int4(w, 32)
    groups = w.reshape(64, 8, 32)
    assert np.array_equal(np.abs(quant.unpack_halves(scale)),      # up from the min or down from the max
                          ((groups.max(2) - groups.min(2)) / np.float32(15)).astype(np.float16).astype(np.float32))
