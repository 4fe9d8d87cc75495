"""User mistakes in an export, through `python -m exporter` as a user runs it.

Every mistake must give exactly one `error:` line on stderr naming the key/argument, the bad value
and what is allowed, a non-zero exit, no traceback, and leave no output folder (nor any `.export-*`
temporary folder) behind. Plus the registry contract: the upstream-style input maps, the runtime's
`InputOfInfer.MAPPING` and the model implementations all cover exactly `FAMILIES`.
"""
import json
import os
import shutil

import numpy as np
import pytest

from support.export_checks import assert_nothing_left
from support.tiny_models import (KNOWN_FAMILIES, VENV_MS20_PYTHON, error_lines, run_cli, save_ckpt, tiny_export_config,
                                 write_yaml)



# --- helpers ------------------------------------------------------------------------------------------
def export_cli(*args):
    return run_cli(["-m", "exporter", *args], timeout=180)


def assert_one_line_error(result, *facts):
    """Exit != 0, stderr is one `error:` line holding every fact, no traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("error:"), line
    for fact in facts:
        assert str(fact) in line, f"{fact!r} missing from: {line}"
    return line


def export_with(tmp_path, config, name="export.yaml"):
    """Write `config` as a yaml in its own folder and export it; returns (result, yaml path)."""
    folder = tmp_path / "config"
    folder.mkdir(exist_ok=True)
    path = write_yaml(str(folder / name), config)
    return export_cli("--config", path), path


@pytest.fixture
def out_dir(tmp_path):
    return str(tmp_path / "out")


@pytest.fixture(scope="module")
def bad_ckpts(tiny_ckpt, tmp_path_factory):
    """Checkpoints that do not fit the tiny model: a missing, an unexpected, a misshapen tensor."""
    folder = tmp_path_factory.mktemp("bad_ckpts")
    weights = tiny_ckpt[1]
    missing = {k: v for k, v in weights.items() if k != "model.norm_out.weight"}
    unexpected = dict(weights, **{"extra_head.weight": np.zeros((4, 32), np.float32)})
    misshapen = dict(weights, **{"model.layers.0.attention.wq.weight": np.zeros((16, 32), np.float32)})
    return {name: save_ckpt(w, str(folder / f"{name}.ckpt"))
            for name, w in (("missing", missing), ("unexpected", unexpected), ("misshapen", misshapen))}


# --- the yaml: keys, types, values --------------------------------------------------------------------
@pytest.mark.parametrize("change, facts", [
    (dict(foo=1), ["unknown key foo", "allowed keys", "output_dir", "seq_length", "kv_cache"]),
    (dict(model=dict(foo=1)), ["unknown key model.foo", "allowed keys in model", "hidden_size", "n_kv_heads"]),
    (dict(seq_length="abc"), ["seq_length", "'abc'", "int"]),
    (dict(batch_size=1.5), ["batch_size", "1.5", "int"]),
    (dict(use_past="yes"), ["use_past", "'yes'", "bool"]),
    (dict(kv_cache="paged"), ["kv_cache", "'paged'", "allowed: io, in_graph, packed"]),
    (dict(kv_cache="dynamic"), ["kv_cache dynamic is retired", "kv_cache packed does the same for every family",
                                "allowed: io, in_graph, packed"]),
    (dict(kv_cache="packed", parallel=dict(model_parallel=2)),
     ["kv_cache packed", "parallel.model_parallel 2", "parallel.collectives: host", "use kv_cache io"]),
    (dict(parallel=dict(collectives="mpi")), ["parallel.collectives 'mpi'", "graph", "host"]),
    (dict(parallel=dict(model_parallel=2, collectives="host")),
     ["parallel.collectives: host", "kv_cache packed and compute_dtype", "this config has kv_cache io"]),
    (dict(kv_cache="packed", compute_dtype="float16", parallel=dict(collectives="host")),
     ["parallel.collectives: host", "this config has compute_dtype float16"]),
    (dict(kv_cache="packed", infer=dict(prefill_model_path="p.mindir")),
     ["infer.prefill_model_path", "kv_cache packed writes one graph"]),
    (dict(lite_ms=True, kv_cache="in_graph"), ["lite_ms: true", "kv_cache in_graph", "io or packed"]),
    (dict(lite_ms=True), ["lite_ms: true", "MindSpore 2.10", "make export-lite"]),
    (dict(compute_dtype="bfloat16"), ["compute_dtype", "'bfloat16'", "float32", "float16"]),
    (dict(model=dict(family="gpt5")), ["'gpt5'", "model.family", KNOWN_FAMILIES]),
    (dict(model=dict(family="llama2x")), ["'llama2x'", KNOWN_FAMILIES]),
    (dict(infer=dict(model_type="onnx")), ["infer.model_type 'onnx'", "allowed: mindir"]),
    (dict(parallel=dict(model_parallel=4)), ["parallel.model_parallel 4", "model.n_kv_heads 2"]),
    (dict(model=dict(positions="alibi")),
     ["model.positions", "llama", "families with a choice of model.positions: baichuan2"]),
], ids=["unknown_top_key", "unknown_nested_key", "seq_length_str", "batch_size_float", "use_past_str",
        "kv_cache", "dynamic_retired", "packed_with_tp", "collectives", "host_collectives_io", "host_collectives_one_rank_fp16",
        "packed_with_graph_copies", "lite_ms_in_graph", "lite_ms_new_mindspore",
        "compute_dtype", "unknown_family", "family_no_prefix_match", "infer_model_type",
        "model_parallel_kv_heads", "variant_key_of_another_family"])
def test_bad_yaml_value(tiny_ckpt, tmp_path, out_dir, change, facts):
    config = tiny_export_config(tiny_ckpt[0], out_dir)
    for key, value in change.items():
        if isinstance(value, dict):
            config[key] = dict(config.get(key, {}), **value)
        else:
            config[key] = value
    result, path = export_with(tmp_path, config)
    assert_one_line_error(result, path, *facts)
    assert_nothing_left(out_dir)


@pytest.mark.parametrize("key", ["output_dir", "seq_length"])
def test_missing_required_key(tiny_ckpt, tmp_path, out_dir, key):
    config = tiny_export_config(tiny_ckpt[0], out_dir)
    del config[key]
    result, path = export_with(tmp_path, config)
    assert_one_line_error(result, path, f"missing required key {key}")
    assert_nothing_left(out_dir)
    assert sorted(os.listdir(tmp_path)) == ["config"]


@pytest.mark.fast
def test_invalid_yaml_syntax(tmp_path, out_dir):
    folder = tmp_path / "config"
    folder.mkdir()
    path = folder / "export.yaml"
    path.write_text(f"output_dir: {out_dir}\nmodel: [llama\nseq_length: 48\n", encoding="utf-8")
    result = export_cli("--config", str(path))
    assert_one_line_error(result, str(path), "not valid yaml", "line 3")
    assert_nothing_left(out_dir)


@pytest.mark.fast
def test_config_file_missing(tmp_path):
    path = str(tmp_path / "nope.yaml")
    assert_one_line_error(export_cli("--config", path), path, "does not exist")


@pytest.mark.parametrize("where, facts", [
    ("a_folder", ["infer.prefill_model_path", "is a folder", ".mindir"]),
    ("under_a_file", ["infer.prefill_model_path", "is a file, not a folder"]),
])
def test_infer_copy_path_that_cannot_be_written_is_refused_before_tracing(tiny_ckpt, tmp_path, out_dir, where, facts):
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("")
    dest = {"a_folder": tmp_path / "a_folder", "under_a_file": tmp_path / "a_file" / "x" / "p.mindir"}[where]
    result, _ = export_with(tmp_path, tiny_export_config(tiny_ckpt[0], out_dir, infer={"prefill_model_path": str(dest)}))
    assert_one_line_error(result, str(dest), *facts)
    assert "traced" not in result.stderr
    assert_nothing_left(out_dir)


# --- the weights --------------------------------------------------------------------------------------
def test_load_checkpoint_missing(tiny_ckpt, tmp_path, out_dir):
    missing = str(tmp_path / "no_such.ckpt")
    result, _ = export_with(tmp_path, tiny_export_config(missing, out_dir))
    assert_one_line_error(result, "load_checkpoint", missing, "does not exist")
    assert_nothing_left(out_dir)


@pytest.mark.parametrize("case, facts", [
    ("missing", ["missing model.norm_out.weight (final_norm.weight)", "1 problem)"]),
    ("unexpected", ["extra_head.weight", "no meaning in a llama model"]),
    ("misshapen", ["model.layers.0.attention.wq.weight", "(16, 32)", "(32, 32)"]),
])
def test_checkpoint_does_not_fit(bad_ckpts, tmp_path, out_dir, case, facts):
    result, _ = export_with(tmp_path, tiny_export_config(bad_ckpts[case], out_dir))
    assert_one_line_error(result, bad_ckpts[case], *facts)
    assert_nothing_left(out_dir)


def test_failed_export_removes_the_folders_it_created(bad_ckpts, tmp_path):
    out = str(tmp_path / "new" / "nested" / "out")
    result, _ = export_with(tmp_path, tiny_export_config(bad_ckpts["missing"], out))
    assert_one_line_error(result, "missing model.norm_out.weight")
    assert not os.path.exists(tmp_path / "new")


@pytest.mark.fast
def test_hf_dir_without_config_json(tmp_path, out_dir):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "model.safetensors").write_bytes(b"")
    config = {"model": {"hf_dir": str(hf_dir)}, "seq_length": 48, "output_dir": out_dir}
    result, _ = export_with(tmp_path, config)
    assert_one_line_error(result, "model.hf_dir", str(hf_dir), "config.json")
    assert_nothing_left(out_dir)


def _hf_copy(hf_family, tmp_path, drop=()):
    hf_dir = tmp_path / "hf"
    shutil.copytree(hf_family("llama") / "hf", hf_dir, ignore=shutil.ignore_patterns(*drop))
    return hf_dir


@pytest.mark.parametrize("name, content, facts", [
    ("tokenizer.model", b"not a sentencepiece model", ["cannot read sentencepiece model"]),
    ("tokenizer.json", b'{"version": "1.0", "model": {"ty', ["cannot read"]),
], ids=["model_not_sentencepiece", "json_truncated"])
def test_bad_tokenizer_is_named_before_tracing(hf_family, tmp_path, out_dir, name, content, facts):
    hf_dir = _hf_copy(hf_family, tmp_path, drop=["tokenizer.model"])
    (hf_dir / name).write_bytes(content)
    result, _ = export_with(tmp_path, {"model": {"hf_dir": str(hf_dir)}, "seq_length": 48, "output_dir": out_dir})
    assert_one_line_error(result, repr(str(hf_dir / name)), *facts)
    assert "traced" not in result.stderr, result.stderr
    assert_nothing_left(out_dir)


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_before_tracing(hf_family, tmp_path, out_dir):
    """Every run would refuse it (more pieces than the model has logits): say so at export time."""
    from support.tiny_models import make_tokenizer
    hf_dir = _hf_copy(hf_family, tmp_path, drop=["tokenizer.model"])
    vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    (tmp_path / "big").mkdir()
    shutil.copy(make_tokenizer(str(tmp_path / "big"), vocab_size=vocab + 9), hf_dir / "tokenizer.model")
    result, _ = export_with(tmp_path, {"model": {"hf_dir": str(hf_dir)}, "seq_length": 48, "output_dir": out_dir})
    assert_one_line_error(result, str(hf_dir / "tokenizer.model"), f"has {vocab + 9} pieces",
                          f"the model's vocabulary is {vocab}")
    assert "traced" not in result.stderr, result.stderr
    assert_nothing_left(out_dir)


def test_hf_dir_without_tokenizer_exports_with_a_warning(hf_family, tmp_path, out_dir):
    hf_dir = _hf_copy(hf_family, tmp_path, drop=["tokenizer.model"])
    result, _ = export_with(tmp_path, {"model": {"hf_dir": str(hf_dir)}, "seq_length": 48, "output_dir": out_dir})
    assert result.returncode == 0, result.stderr
    [warning] = [ln for ln in error_lines(result.stderr) if "no tokenizer" in ln]
    assert warning == (f"exporter: the export has no tokenizer (model.hf_dir {hf_dir} has none and no "
                       "model.tokenizer is given): every run needs one, given with --tokenizer_path "
                       "(tokenizer_path= in Python)")
    assert _manifest(out_dir)["tokenizer"] is None


@pytest.mark.fast
def test_hf_dir_that_does_not_exist(tmp_path, out_dir):
    hf_dir = str(tmp_path / "no_such_hf")
    result, _ = export_with(tmp_path, {"model": {"hf_dir": hf_dir}, "seq_length": 48, "output_dir": out_dir})
    line = assert_one_line_error(result, f"model.hf_dir {hf_dir} does not exist")
    assert "config.json" not in line
    assert_nothing_left(out_dir)


@pytest.mark.fast
def test_unsupported_model_type_lists_each_type_once(tmp_path):
    from exporter.families.base import family_by_hf_type
    from lite_runtime.contract.errors import UnsupportedError
    with pytest.raises(UnsupportedError) as info:
        family_by_hf_type("mistral", "config.json")
    listed = str(info.value).split("supported: ")[1].split(", ")
    assert "chatglm" in listed and len(listed) == len(set(listed)), listed


# --- the command line ---------------------------------------------------------------------------------
@pytest.mark.parametrize("yamls, facts", [
    (["a.yaml", "b.yml"], ["exactly one .yaml", "found 2", "a.yaml", "b.yml"]),
    ([], ["exactly one .yaml", "found 0", "none"]),
], ids=["two_yamls", "no_yaml"])
def test_model_dir_needs_exactly_one_yaml(tiny_ckpt, tmp_path, yamls, facts):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    out_dir = str(tmp_path / "out")
    for name in yamls:
        write_yaml(str(model_dir / name), tiny_export_config(tiny_ckpt[0], out_dir))
    result = export_cli("--model_dir", str(model_dir))
    assert_one_line_error(result, "--model_dir", str(model_dir), *facts)
    assert_nothing_left(out_dir)


@pytest.mark.fast
def test_model_dir_that_does_not_exist(tmp_path):
    missing = str(tmp_path / "no_such_model")
    assert_one_line_error(export_cli("--model_dir", missing), "--model_dir", missing, "is not a folder")


@pytest.mark.fast
@pytest.mark.parametrize("args, facts", [
    ([], ["exactly one of --config and --model_dir"]),
    (["--config", "x.yaml", "--model_dir", "m"], ["exactly one of --config and --model_dir"]),
    (["--config", "x.yaml", "--batch_size", "abc"], ["--batch_size", "'abc'", "integer"]),
    (["--config", "x.yaml", "--no_such_flag"], ["--no_such_flag"]),
], ids=["no_source", "both_sources", "batch_size_not_int", "unknown_option"])
def test_bad_arguments(args, facts):
    result = export_cli(*args)
    assert_one_line_error(result, *facts)
    assert "Usage:" not in result.stdout


def test_command_line_override_is_validated(tiny_ckpt, tmp_path, out_dir):
    path = write_yaml(str(tmp_path / "export.yaml"), tiny_export_config(tiny_ckpt[0], out_dir))
    result = export_cli("--config", path, "--batch_size", "0")
    assert_one_line_error(result, "batch_size must be at least 1, got 0")
    assert_nothing_left(out_dir)


# --- the output folder --------------------------------------------------------------------------------
def test_refuses_to_overwrite_a_folder_that_is_not_an_export(tiny_ckpt, tmp_path, out_dir):
    os.makedirs(os.path.join(out_dir, "sub"))
    with open(os.path.join(out_dir, "notes.txt"), "w", encoding="utf-8") as f:
        f.write("precious")
    before = sorted(os.listdir(out_dir))
    result, _ = export_with(tmp_path, tiny_export_config(tiny_ckpt[0], out_dir))
    assert_one_line_error(result, "output_dir", out_dir, "not an export", "manifest.json")
    assert sorted(os.listdir(out_dir)) == before
    with open(os.path.join(out_dir, "notes.txt"), encoding="utf-8") as f:
        assert f.read() == "precious"
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".export-")]


def _manifest(folder):
    with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def test_reexport_replaces_an_existing_export_whole(tiny_ckpt, tiny_exports, tmp_path, out_dir):
    shutil.copytree(tiny_exports["io"], out_dir)
    assert _manifest(out_dir)["batch_size"] == 3
    with open(os.path.join(out_dir, "stale.txt"), "w", encoding="utf-8") as f:
        f.write("from the old export")
    result, _ = export_with(tmp_path, tiny_export_config(tiny_ckpt[0], out_dir, batch_size=2))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == out_dir
    manifest = _manifest(out_dir)
    assert manifest["batch_size"] == 2
    assert manifest["graphs"]["prefill"]["inputs"][0]["shape"] == [2, 48]
    assert not os.path.exists(os.path.join(out_dir, "stale.txt"))
    assert sorted(os.listdir(tmp_path)) == ["config", "out"]   # no .export-* / .old-* folder


def test_failed_reexport_keeps_the_existing_export(bad_ckpts, tiny_exports, tmp_path, out_dir):
    shutil.copytree(tiny_exports["io"], out_dir)
    before = _manifest(out_dir)
    result, _ = export_with(tmp_path, tiny_export_config(bad_ckpts["misshapen"], out_dir, batch_size=2))
    assert_one_line_error(result, "model.layers.0.attention.wq.weight")
    assert _manifest(out_dir) == before
    assert sorted(os.listdir(tmp_path)) == ["config", "out"]


# A stand-in for a full disk (a unit test of the check's wiring): the exporter's process is told its
# file system has 1 KiB free, which no export of the tiny model's weights as MindIR and .ms fits in.
FULL_DISK_EXPORT = """
import collections, runpy, shutil, sys
shutil.disk_usage = lambda path: collections.namedtuple("usage", "total used free")(2**40, 2**40 - 1024, 1024)
sys.argv = ["exporter"] + sys.argv[1:]
runpy.run_module("exporter", run_name="__main__")
"""


def test_an_export_the_disk_has_no_room_for_is_refused_before_its_graphs_are_written(tiny_ckpt, tmp_path,
                                                                                       out_dir):
    yaml = write_yaml(str(tmp_path / "export.yaml"), dict(tiny_export_config(tiny_ckpt[0], out_dir), target="cpu"))
    result = run_cli(["-c", FULL_DISK_EXPORT, "--config", yaml], python=VENV_MS20_PYTHON, timeout=180)
    assert_one_line_error(result, "writing the graphs (MindIR, then .ms) needs about", "0.0 GiB free",
                          "free some space or give an output_dir on a larger disk")
    assert_nothing_left(out_dir)
