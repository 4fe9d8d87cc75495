"""Large models: MindSpore writes a net whose weights exceed 1 GiB as a graph file plus external data
(`rank_0_graph.mindir` + `rank_0_variables/data_0`). The exports here take that real path on the
tiny Llama: the export process lowers MindSpore's threshold (`TOTAL_SAVE` of
mindspore/train/serialization.py) to 0, so every graph with weights is split. Checked: upstream's
file names, the manifest listing and hashing every data file, the split export giving exactly the
unsplit export's tokens and logits on `ms` and on real Lite (MindIR and `.ms`) run from another
working directory, damaged data refused in one line before any graph runs, and `infer:` copies of a
split export running on their own."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

from support.export_scripts import SPLIT_EXPORT
from support.family_cases import STEPS
from support.lite_process import ensure_lite_installed
from support.tiny_models import REPO, VENV_MS20_PYTHON, error_lines, run_cli, write_yaml

VARIANTS = {"lite": ("io", False), "lite_packed": ("packed", True), "io": ("io", False)}


@pytest.fixture(scope="module")
def split_export(hf_family, tmp_path_factory):
    """variant -> the llama case exported with every graph split (as family_export's variant)."""
    made = {}

    def get(variant):
        if variant not in made:
            folder = hf_family("llama")
            out = tmp_path_factory.mktemp("split") / variant
            kv_cache, lite_ms = VARIANTS[variant]
            from support.family_cases import BATCH, SEQ
            cfg = {"model": {"hf_dir": str(folder / "hf")}, "seq_length": SEQ, "batch_size": BATCH,
                   "kv_cache": kv_cache, "lite_ms": lite_ms, "output_dir": str(out)}
            if variant == "lite":      # upstream's graph copies, in one folder
                cfg["infer"] = {"prefill_model_path": str(out.parent / "copies" / "llama_prefill_graph.mindir"),
                                "increment_model_path": str(out.parent / "copies" / "llama_inc_graph.mindir")}
            python = str(VENV_MS20_PYTHON) if variant.startswith("lite") else sys.executable
            yaml = write_yaml(str(out.parent / f"{variant}.yaml"), cfg)
            result = run_cli(["-c", SPLIT_EXPORT, "--config", yaml], python=python)
            assert result.returncode == 0, result.stderr[-3000:]
            made[variant] = str(out)
        return made[variant]
    return get


def test_split_graphs_have_upstream_names_and_every_data_file_is_hashed(split_export):
    export = split_export("lite")
    manifest = json.load(open(os.path.join(export, "manifest.json")))
    for folder in ("mindir_full_checkpoint", "mindir_inc_checkpoint"):
        assert sorted(os.listdir(os.path.join(export, folder))) == ["rank_0_graph.mindir", "rank_0_variables"]
        graph, data = f"{folder}/rank_0_graph.mindir", f"{folder}/rank_0_variables/data_0"
        assert manifest["external_data"][graph] == [data]
        assert graph in manifest["sha256"] and data in manifest["sha256"]
        # the weights are in the data file, not in the graph file
        assert os.path.getsize(os.path.join(export, data)) > 2 * os.path.getsize(os.path.join(export, graph))


def lite_greedy(export, folder, name, cwd):
    out = str(folder / f"{name}.npz")
    result = run_cli([os.path.join(REPO, "tests", "support", "parity_runner.py"), "mslite", export,
                      str(folder / "prompts.json"), str(STEPS), out], cwd=str(cwd))
    assert result.returncode == 0, result.stderr[-3000:]
    got = np.load(out)
    return got["logits"], got["tokens"]


@pytest.mark.parametrize("variant", ["lite", "lite_packed"])
def test_split_export_equals_the_unsplit_one_on_lite_from_another_directory(
        hf_family, family_export, split_export, variant, tmp_path):
    ensure_lite_installed()
    folder = hf_family("llama")
    logits, tokens = lite_greedy(split_export(variant), folder, f"split_{variant}", tmp_path)
    ref_logits, ref_tokens = lite_greedy(family_export("llama", variant), folder, f"whole_{variant}", tmp_path)
    np.testing.assert_array_equal(tokens, ref_tokens)
    assert np.abs(logits - ref_logits).max() <= 1e-6


def test_split_export_equals_the_unsplit_one_on_ms(hf_family, family_export, split_export, monkeypatch, tmp_path):
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from support.parity_runner import greedy_prompts
    prompts = json.load(open(hf_family("llama") / "prompts.json"))
    monkeypatch.chdir(tmp_path)
    logits, tokens = greedy_prompts(load_session("ms", load_manifest(split_export("io"))), prompts, STEPS)
    ref_logits, ref_tokens = greedy_prompts(load_session("ms", load_manifest(family_export("llama", "io"))),
                                            prompts, STEPS)
    np.testing.assert_array_equal(tokens, ref_tokens)
    assert np.abs(logits - ref_logits).max() <= 1e-6


def infer(*source, cwd=REPO):
    return run_cli([os.path.join(REPO, "run_infer_main.py"), "--backend", "mslite", *source, "--predict_data", "hello world",
                    "--max_new_tokens", "6"], cwd=cwd, timeout=180)


@pytest.mark.parametrize("damage", ["missing", "truncated", "altered"])
def test_a_damaged_data_file_is_refused_in_one_line_before_any_graph_runs(split_export, damage, tmp_path):
    ensure_lite_installed()
    export = str(tmp_path / "export")
    shutil.copytree(split_export("lite"), export)
    data = os.path.join(export, "mindir_inc_checkpoint", "rank_0_variables", "data_0")
    os.chmod(data, 0o644)
    if damage == "missing":
        os.remove(data)
    else:
        blob = bytearray(open(data, "rb").read())
        blob = blob[: len(blob) // 2] if damage == "truncated" else blob[:-64] + bytes(64)
        open(data, "wb").write(bytes(blob))
    result = infer("--model_dir", export)
    assert result.returncode != 0
    (line,) = error_lines(result.stderr)
    assert f"weight data file {data}" in line, line
    assert ("does not exist" if damage == "missing" else "does not match the sha256") in line


def test_infer_copies_of_a_split_export_run_on_their_own(split_export, tmp_path):
    ensure_lite_installed()
    export = split_export("lite")
    copies = os.path.join(os.path.dirname(export), "copies")
    assert sorted(os.listdir(copies)) == [
        "llama_inc_graph.mindir", "llama_inc_graph.mindir.manifest.json", "llama_inc_variables",
        "llama_prefill_graph.mindir", "llama_prefill_graph.mindir.manifest.json", "llama_prefill_variables"]
    expected = infer("--model_dir", export)
    assert expected.returncode == 0, expected.stderr[-2000:]
    moved = tmp_path / "copies"
    shutil.copytree(copies, moved)      # the copies alone: the export's own graphs are not read
    shutil.copy(os.path.join(export, "tokenizer.model"), moved)
    got = infer("--prefill_model_path", str(moved / "llama_prefill_graph.mindir"),
                "--increment_model_path", str(moved / "llama_inc_graph.mindir"),
                "--tokenizer_path", str(moved / "tokenizer.model"), cwd=str(tmp_path))
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout == expected.stdout


def test_unchanged_files_are_hashed_once_and_a_file_rewritten_since_is_hashed_again(split_export, monkeypatch,
                                                                                   tmp_path):
    from lite_runtime.contract import hashes
    from lite_runtime.contract.errors import ArtifactError
    from lite_runtime.contract.manifest import load_manifest
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    export = str(tmp_path / "export")
    shutil.copytree(split_export("lite"), export)
    hashed = []
    real = hashes.file_sha256
    monkeypatch.setattr(hashes, "file_sha256", lambda path: hashed.append(path) or real(path))
    load_manifest(export).verify_files()
    assert len(hashed) == len(load_manifest(export).sha256) > 2
    hashed.clear()
    load_manifest(export).verify_files()
    assert hashed == []
    data = os.path.join(export, "mindir_full_checkpoint", "rank_0_variables", "data_0")
    os.chmod(data, 0o644)
    blob = bytearray(open(data, "rb").read())
    blob[-1] ^= 1                             # same size, one bit: only a new hash tells
    open(data, "wb").write(bytes(blob))
    with pytest.raises(ArtifactError, match=f"weight data file {data} does not match the sha256"):
        load_manifest(export).verify_files()
    assert hashed == [data]
