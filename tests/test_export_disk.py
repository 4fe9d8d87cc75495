"""What an export keeps on disk: only files the manifest lists (the graphs or `.ms` models the runtime
loads, their weight data, the tokenizer files, the GE config, the manifest itself). A `target: cpu`
export's MindIR is only the input of Lite's converter (the runtime loads the `.ms`; backend `ms` runs
no MindSpore 2.0 MindIR): it is removed once converted, which halves the export (the 135M model wrote
1.08 GB, 0.54 GB so). A MindIR kept beside its `.ms` has its reason in the manifest (`mindir_kept`):
upstream's infer: copies are copies of it, and `lite_ms: true` without `target: cpu` keeps both forms
(lite_format 'mindir'). Real MindSpore 2.0 exports of the tiny Llama, converted by Lite 2.0's converter."""
import json
import os

import pytest

from support.export_scripts import LOWERED_LIMIT_EXPORT
from support.tiny_models import REPO, VENV_MS20_PYTHON, make_tokenizer, run_cli, tiny_export_config, write_yaml

FORMS = {   # name -> (yaml keys over the tiny config, the exporter's script)
    "cpu": ({"target": "cpu"}, None),
    "cpu_segments": ({"target": "cpu"}, LOWERED_LIMIT_EXPORT),
    "cpu_infer_copies": ({"target": "cpu", "infer": {"prefill_model_path": "COPIES/tiny_prefill_graph.mindir",
                                                     "increment_model_path": "COPIES/tiny_inc_graph.mindir"}}, None),
    "lite_ms": ({"kv_cache": "packed", "lite_ms": True}, None),
}


@pytest.fixture(scope="module")
def exports(tiny_ckpt, tmp_path_factory):
    """form -> (export folder, its manifest as json), exported on first use."""
    made = {}
    tokenizer = make_tokenizer(str(tmp_path_factory.mktemp("tok")))

    def get(name):
        if name not in made:
            keys, script = FORMS[name]
            folder = tmp_path_factory.mktemp(name)
            keys = json.loads(json.dumps(keys).replace("COPIES", str(folder / "copies")))
            config = tiny_export_config(tiny_ckpt[0], str(folder / "out"), model={"tokenizer": tokenizer})
            if "target" in keys:
                del config["kv_cache"]        # the target chooses it
            config.update(keys)
            yaml = write_yaml(str(folder / "export.yaml"), config)
            command = ["-c", script] if script else ["-m", "exporter"]
            result = run_cli(command + ["--config", yaml], python=str(VENV_MS20_PYTHON), timeout=600)
            assert result.returncode == 0, result.stderr[-3000:]
            with open(folder / "out" / "manifest.json", encoding="utf-8") as f:
                made[name] = str(folder / "out"), json.load(f)
        return made[name]
    return get


def on_disk(folder: str) -> set:
    return {os.path.relpath(os.path.join(root, name), folder) for root, _, files in os.walk(folder) for name in files}


def listed(manifest: dict) -> set:
    """Every file the manifest names and the runtime reads: the hashed graphs, models and weight data,
    the tokenizer files, the GE config, the manifest."""
    names = {"manifest.json", manifest["tokenizer"], *manifest["tokenizer_files"], *manifest["sha256"]}
    return names | ({manifest["ge_config"]} if manifest["ge_config"] else set())


@pytest.mark.parametrize("name", ["cpu", "cpu_segments"])
def test_a_cpu_export_holds_only_its_ms_models_and_what_else_the_runtime_reads(exports, name):
    export, manifest = exports(name)
    files = on_disk(export)
    assert files == listed(manifest), (files ^ listed(manifest))
    assert not [f for f in files if f.endswith(".mindir") or "_variables" in f]
    graphs = manifest["segments"] if name == "cpu_segments" else manifest["graphs"]
    assert sorted(manifest["lite_files"]) == sorted(graphs) and manifest["mindir_kept"] == ""
    assert all(f.endswith(".ms") for files in manifest["lite_files"].values() for f in files)
    assert manifest["external_data"] == {}


def test_a_cpu_export_without_its_mindir_runs_on_lite(exports):
    export, _ = exports("cpu")
    result = run_cli(["run_infer_main.py", "--model_dir", export, "--backend", "mslite", "--predict_data",
                      "one two three", "--max_new_tokens", "4"], cwd=REPO, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("one two three")
    from lite_runtime.contract.manifest import load_manifest
    load_manifest(export).verify_files()


@pytest.mark.parametrize("name, reason", [
    ("cpu_infer_copies", "the infer: copies (prefill_model_path, increment_model_path) are copies of the MindIR"),
    ("lite_ms", "lite_ms: true without target: cpu keeps both forms"),
])
def test_a_mindir_beside_its_ms_is_kept_only_for_the_reason_the_manifest_gives(exports, name, reason):
    export, manifest = exports(name)
    files = on_disk(export)
    assert files == listed(manifest), (files ^ listed(manifest))
    beside = [f for f in files if f.endswith(".mindir") and f[: -len(".mindir")] + ".ms" in files]
    assert beside and reason in manifest["mindir_kept"], manifest["mindir_kept"]


def test_asking_for_the_mindir_of_a_target_cpu_export_is_refused_in_one_line(exports):
    """Its MindIR was removed once converted: lite_format 'mindir' names why and what to do, instead of
    a missing file."""
    folder, _ = exports("cpu")
    script = ("import sys\nfrom lite_runtime.backends.mslite_backend import MSLiteSession\n"
              "from lite_runtime.contract.errors import ArtifactError\n"
              "from lite_runtime.contract.manifest import load_manifest\n"
              "try:\n    MSLiteSession(load_manifest(sys.argv[1]), lite_format='mindir')\n"
              "except ArtifactError as e:\n    print(e)\n")
    result = run_cli(["-c", script, folder])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "lite_format 'mindir' needs the export's MindIR" in result.stdout and "lite_format 'auto'" in result.stdout
