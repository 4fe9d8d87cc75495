"""The first export a newcomer writes: the README's smallest config says `target: cpu` (Ascend's form one
line away), the export's last line names the target it wrote for, also when the yaml gives none (then
upstream's two graphs, Ascend's form), and Lite on CPU refuses, in one line before building anything, an
export whose load would not fit in the memory available (`lite_runtime/backends/lite_memory.py`)
instead of being killed by the kernel half-way. The exports are the bundled demo model's, made with
MindSpore 2.0 without `kv_cache` and with or without `target: cpu`; the available memory is lowered
through the documented `LITE_MEMORY_LIMIT_GB`."""
import dataclasses
import os
import re

import pytest
import yaml

from exporter.config.schema import config_from_dict
from lite_runtime.backends import lite_memory
from lite_runtime.backends.lite_memory import (GB, LITE_FIXED_BYTES, LIMIT_ENV, available_memory, check_load_memory,
                                               estimate_load)
from lite_runtime.contract.errors import ConfigError, ResourceError
from lite_runtime.contract.manifest import load_manifest
from support.tiny_models import REPO, VENV_MS20_PYTHON, error_lines, run_cli, write_yaml

DEMO_YAML = os.path.join(REPO, "tools", "demo_model", "demo.yaml")
README = os.path.join(REPO, "README.md")
NO_TARGET_WORDS = ("kv_cache io: prefill + increment graphs, each with its own copy of the weights, for target "
                   "ascend (no target given; target: cpu writes the form for MindSpore Lite on CPU)")
IO_GRAPHS = ["mindir_full_checkpoint/rank_0_graph.mindir", "mindir_inc_checkpoint/rank_0_graph.mindir"]
CPU_WORDS = ("kv_cache packed: one step graph over a list of tokens of any rows, its K/V in the kernels' paged store, "
             "converted to Lite's .ms, for target cpu")


def readme_first_export_yaml():
    """The first yaml block of the README's "## Export" section: (its text, the parsed mapping)."""
    text = open(README, encoding="utf-8").read()
    section = text.split("\n## Export\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return block, yaml.safe_load(block)


@pytest.fixture(scope="module")
def first_exports(tmp_path_factory):
    """name -> (export folder, the export's last stderr line): the demo model as a newcomer's yaml
    would have it (no kv_cache), without a target ("none": two MindIR graphs) and with `target: cpu`."""
    folder = tmp_path_factory.mktemp("first_export")
    with open(DEMO_YAML) as f:
        config = yaml.safe_load(f)
    demo_dir = os.path.dirname(DEMO_YAML)
    config["model"]["tokenizer"] = os.path.join(demo_dir, config["model"]["tokenizer"])
    config["load_checkpoint"] = os.path.join(demo_dir, config["load_checkpoint"])
    del config["kv_cache"]
    out = {}
    for name, keys in (("none", {}), ("cpu", {"target": "cpu"})):
        path = write_yaml(str(folder / f"{name}.yaml"), dict(config, output_dir=str(folder / name), **keys))
        result = run_cli(["-m", "exporter", "--config", path], python=str(VENV_MS20_PYTHON))
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip().splitlines()[-1] == str(folder / name)
        out[name] = str(folder / name), error_lines(result.stderr)[-1]
    return out


@pytest.mark.fast
def test_the_readmes_first_export_is_for_cpu_with_ascend_one_line_away():
    block, data = readme_first_export_yaml()
    assert data["target"] == "cpu", block
    line = next(ln for ln in block.splitlines() if ln.startswith("target:"))
    assert "ascend" in line, line              # the Ascend form in the same line's comment
    config = config_from_dict(data)
    assert (config.kv_cache, config.lite_ms, config.segments_by_size) == ("packed", True, True)


def test_the_last_line_names_the_target_and_the_readme_says_so(first_exports):
    for name, words in (("none", NO_TARGET_WORDS), ("cpu", CPU_WORDS)):
        export, last = first_exports[name]
        assert last.startswith(f"exporter: exported llama to {export} (1 rank(s), {words}; weights float32; "), last
    readme = " ".join(open(README, encoding="utf-8").read().split())
    assert CPU_WORDS in readme and "for target ascend (no target given" in readme


def test_the_load_estimate_is_a_multiple_of_the_weight_files_the_manifest_lists(first_exports):
    io = load_manifest(first_exports["none"][0])
    estimate = estimate_load(io)
    assert estimate.form == "mindir" and estimate.files == IO_GRAPHS     # each graph with its own weights
    size = sum(os.path.getsize(os.path.join(io.root, g)) for g in IO_GRAPHS)
    assert estimate.weight_bytes == size and size > 2 * 400_000        # the demo's 0.5 MB of weights, twice
    assert estimate.peak_bytes == int(3.9 * size) + LITE_FIXED_BYTES
    assert estimate_load(io, lite_format="mindir").files == IO_GRAPHS

    cpu = load_manifest(first_exports["cpu"][0])
    estimate = estimate_load(cpu)
    assert cpu.quantization["head_on_kernel"]     # target cpu's products on the kernels, reading Lite's copy
    assert estimate.form == "ms" and estimate.files == ["mindir_step/rank_0_graph.ms"] and estimate.multiple == 1.5
    matmul = dataclasses.replace(cpu, quantization=dict(cpu.quantization, head_on_kernel=False))
    assert estimate_load(matmul).multiple == 2.0       # Lite's MatMul keeps a packed copy beside its own
    assert estimate.weight_bytes == os.path.getsize(os.path.join(cpu.root, "mindir_step/rank_0_graph.ms"))
    mindir = estimate_load(cpu, lite_format="mindir")
    assert mindir.form == "mindir" and mindir.files == ["mindir_step/rank_0_graph.mindir"]


def test_the_load_estimate_of_other_forms_and_what_each_refusal_advises(first_exports, monkeypatch):
    """Float16 counts twice (Lite widens it on CPU); .ms segments 1.2x with the weight release, 2.0x
    without, one .ms on the kernels 2.0x without (on Lite's MatMul 3.0x). A refusal advises what loads
    with less: target cpu for MindIR, segments for one .ms, nothing to export for segments."""
    cpu = load_manifest(first_exports["cpu"][0])
    base = estimate_load(cpu)
    assert estimate_load(dataclasses.replace(cpu, compute_dtype="float16")).weight_bytes == 2 * base.weight_bytes
    segments = dataclasses.replace(cpu, collectives="host", segments={"embed": cpu.graphs["step"]},
                                   lite_files={"embed": cpu.lite_files["step"]})
    assert (estimate_load(segments).form, estimate_load(segments).multiple) == ("ms_segments", 1.2)
    monkeypatch.setenv(LIMIT_ENV, "0.1")
    for manifest, advice in ((load_manifest(first_exports["none"][0]), "add `target: cpu` to its export yaml"),
                             (cpu, "`parallel: {collectives: host}`"), (segments, "free memory")):
        with pytest.raises(ResourceError, match=re.escape(advice)):
            check_load_memory(manifest)
    monkeypatch.setenv("LITE_RELEASE_WEIGHTS", "0")
    assert estimate_load(cpu).multiple == 2.0 and estimate_load(segments).multiple == 2.0
    matmul = dataclasses.replace(cpu, quantization=dict(cpu.quantization, head_on_kernel=False))
    assert estimate_load(matmul).multiple == 3.0


@pytest.mark.fast
def test_the_available_memory_is_memavailable_or_a_lower_limit(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    8000000 kB\n")
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    assert available_memory(str(meminfo)) == (8_192_000_000, "MemAvailable")
    monkeypatch.setenv(LIMIT_ENV, "0.5")
    assert available_memory(str(meminfo))[0] == int(0.5 * GB)
    monkeypatch.setenv(LIMIT_ENV, "100")           # never raises it: no way around the check
    assert available_memory(str(meminfo))[0] == 8_192_000_000
    monkeypatch.setenv(LIMIT_ENV, "lots")
    with pytest.raises(ConfigError, match="LITE_MEMORY_LIMIT_GB='lots' is not a number of GB"):
        available_memory(str(meminfo))
    monkeypatch.delenv(LIMIT_ENV)
    assert available_memory(str(tmp_path / "absent"))[0] is None      # no /proc: no check
    assert lite_memory.MEMINFO == "/proc/meminfo"


def test_a_load_that_would_not_fit_is_refused_in_one_line(first_exports, monkeypatch):
    """run_infer_main.py on the two-graph export with 0.1 GB available (the estimate is Lite's 0.25 GB
    and the weights'): one `error:` line naming the export, the estimate, the memory and the yaml key
    to export again with; non-zero exit, nothing loaded. With the machine's own memory it runs."""
    export = first_exports["none"][0]
    args = ["run_infer_main.py", "--model_dir", export, "--backend", "mslite", "--predict_data", "one two",
            "--max_new_tokens", "2"]
    monkeypatch.setenv(LIMIT_ENV, "0.1")
    result = run_cli(args)
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    size = sum(os.path.getsize(os.path.join(export, g)) for g in IO_GRAPHS)
    assert line.startswith(f"error: {export} needs about 0.3 GB to load on MindSpore Lite on CPU (2 MindIR graphs "
                           f"with {size / 1e6:.1f} MB of weights, which Lite converts at Build: 3.9x that + Lite's "
                           "0.25 GB), "
                           f"more than the 0.1 GB available ({LIMIT_ENV}=0.1, below MemAvailable "), line
    assert "add `target: cpu` to its export yaml" in line and "make export-lite" in line, line
    monkeypatch.delenv(LIMIT_ENV)
    result = run_cli(args)
    assert result.returncode == 0, result.stderr[-3000:]
