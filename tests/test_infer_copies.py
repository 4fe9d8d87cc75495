"""Upstream `infer.prefill_model_path` / `increment_model_path`: the graph copies the exporter writes
there run by their paths alone (`run_infer_main.py --prefill_model_path A --increment_model_path B`),
with the same output as the export folder (`--model_dir`)."""
import json
import os
import shutil

import pytest

from support.tiny_models import REPO, export_in_subprocess, make_tokenizer, run_cli, tiny_export_config, write_yaml

PROMPT = "one two three"


@pytest.fixture(scope="module")
def export_with_copies(tiny_ckpt, tmp_path_factory):
    """The tiny model exported into tree/out with its graph copies in tree/copies; returns the tree."""
    tree = tmp_path_factory.mktemp("copies") / "tree"
    tree.mkdir()
    tokenizer = make_tokenizer(str(tmp_path_factory.mktemp("tok")))
    config = tiny_export_config(tiny_ckpt[0], str(tree / "out"), model={"tokenizer": tokenizer},
                                infer={"prefill_model_path": str(tree / "copies" / "llama_prefill.mindir"),
                                       "increment_model_path": str(tree / "copies" / "llama_inc.mindir"),
                                       "model_type": "mindir"})
    export_in_subprocess(write_yaml(str(tree.parent / "export.yaml"), config))
    return tree


def infer(*source):
    result = run_cli(["run_infer_main.py", "--backend", "ms", *source, "--predict_data", PROMPT,
                      "--max_new_tokens", "8"], timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def copies(tree):
    return ["--prefill_model_path", str(tree / "copies" / "llama_prefill.mindir"),
            "--increment_model_path", str(tree / "copies" / "llama_inc.mindir")]


def test_graph_copies_run_like_the_export_folder(export_with_copies):
    tree = export_with_copies
    expected = infer("--model_dir", str(tree / "out"))
    assert expected.startswith(PROMPT) and len(expected.strip()) > len(PROMPT)
    assert infer(*copies(tree)) == expected


def test_copy_manifest_points_by_relative_paths_and_moves_with_the_tree(export_with_copies, tmp_path):
    with open(export_with_copies / "copies" / "llama_prefill.mindir.manifest.json", encoding="utf-8") as f:
        pointer = json.load(f)
    assert pointer["graphs"]["prefill"]["files"] == ["llama_prefill.mindir"]
    assert pointer["graphs"]["increment"]["files"] == ["llama_inc.mindir"]
    assert pointer["tokenizer"] == os.path.join("..", "out", "tokenizer.model")
    assert sorted(pointer["sha256"]) == ["llama_inc.mindir", "llama_prefill.mindir"]
    expected = infer("--model_dir", str(export_with_copies / "out"))
    moved = tmp_path / "elsewhere"
    shutil.copytree(export_with_copies, moved)
    assert infer(*copies(moved)) == expected


@pytest.fixture(scope="module")
def upstream_model_folder(tiny_ckpt, tmp_path_factory):
    """MindFormers' Lite guide's model folder: one yaml, xxx_prefill_graph.mindir, xxx_inc_graph.mindir and
    config.ini; the graphs are the exporter's infer: copies (each with its .manifest.json). Returns
    (the folder, the export folder)."""
    tree = tmp_path_factory.mktemp("upstream")
    folder = tree / "llama2_7b_lite"
    tokenizer = make_tokenizer(str(tmp_path_factory.mktemp("tok")))
    config = tiny_export_config(tiny_ckpt[0], str(tree / "out"), model={"tokenizer": tokenizer},
                                infer={"prefill_model_path": str(folder / "llama2_7b_prefill_graph.mindir"),
                                       "increment_model_path": str(folder / "llama2_7b_inc_graph.mindir")})
    export_in_subprocess(write_yaml(str(tree / "run_llama2_7b.yaml"), config))
    shutil.copy(tree / "run_llama2_7b.yaml", folder)
    shutil.copy(os.path.join(REPO, "ge_configs", "cpu.ini"), folder / "config.ini")
    return folder, tree / "out"


def test_pipeline_runs_upstreams_model_folder_of_graph_copies(upstream_model_folder):
    from lite_runtime import pipeline
    folder, export = upstream_model_folder
    answers = []
    for model in (export, folder):
        pipe = pipeline(model=str(model), backend="ms")
        try:
            answers.append(pipe(PROMPT, max_new_tokens=8))
        finally:
            pipe.close()
    assert answers[0][0]["text_generation_text"][0].startswith(PROMPT)
    assert answers[1] == answers[0]


def test_model_folder_without_the_copy_manifest_says_what_is_missing(upstream_model_folder, tmp_path):
    from lite_runtime import pipeline
    from lite_runtime.contract.errors import ArtifactError
    folder = tmp_path / "llama2_7b_lite"
    shutil.copytree(upstream_model_folder[0], folder, ignore=shutil.ignore_patterns("*.manifest.json"))
    with pytest.raises(ArtifactError) as info:
        pipeline(model=str(folder), backend="ms")
    assert str(info.value) == (
        f"{folder} is not an export: it has no manifest.json, and llama2_7b_prefill_graph.mindir has no "
        "llama2_7b_prefill_graph.mindir.manifest.json beside it; export with infer.prefill_model_path / "
        "increment_model_path naming this folder, which writes it")
