"""int8 weights on Ascend (`target: ascend`, `quantization.weights: int8`): the export keeps float graphs
and ships MindSpore Lite's converter configuration (weight quantization, dequantized on the fly by GE,
the head left float32); `ge_config quantize` runs the converter on the Ascend server.

There is no Ascend here. What is real: the export (MindSpore 2.0), and MindSpore Lite 2.0's own
converter reading the configuration as written and quantizing every linear weight but the head it names
(checked by the sizes of its outputs). The converter's command line is checked against a RECORDING
STAND-IN for `converter_lite` (Lite for Ascend is not installable here): wiring, not Lite's behaviour.
"""
import configparser
import json
import os
import shutil
import subprocess
import sys

import pytest

from exporter.writing.lite_convert import converter_python
from support.family_cases import SEQ
from support.tiny_models import VENV_MS20_PYTHON, error_lines, export_in_subprocess, run_cli, write_yaml

CONVERT = """
import sys, mindspore_lite as mslite
src, dst, cfg = sys.argv[1:4]
c = mslite.Converter()
c.optimize = "general"
c.save_type = mslite.ModelType.MINDIR_LITE
c.convert(mslite.FmkType.MINDIR, src, dst, config_file=cfg)
"""

STAND_IN_CONVERTER = """#!{python}
# A RECORDING STAND-IN for MindSpore Lite's converter_lite (not the real tool): logs its arguments,
# writes the output file it was asked for, or fails as the real one would when told to.
import json, os, sys
with open(os.environ["STAND_IN_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if os.environ.get("STAND_IN_FAIL"):
    sys.stderr.write("ERROR [converter.cc] Convert failed: " + os.environ["STAND_IN_FAIL"] + "\\n")
    sys.exit(1)
out = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--outputFile=")][0]
open(out + ".mindir", "wb").close()
"""


@pytest.fixture(scope="module", params=["llama", "gpt2"])     # its own head; a head tied to the embedding
def ascend_int8(request, hf_family, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ascend_int8")
    yaml = write_yaml(str(folder / "x.yaml"), {"output_dir": str(folder / "out"), "seq_length": SEQ,
                                               "target": "ascend", "quantization": {"weights": "int8"},
                                               "model": {"hf_dir": str(hf_family(request.param) / "hf")}})
    export_in_subprocess(yaml, python=VENV_MS20_PYTHON)
    return folder / "out"


def read_config(path):
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read(path)
    return parser


def test_the_export_keeps_float_graphs_and_ships_the_converters_configuration(ascend_int8):
    manifest = json.loads((ascend_int8 / "manifest.json").read_text())
    assert manifest["quantization"] == {"weights": "int8", "by": "lite_converter", "dequant": "on_the_fly",
                                        "converter_config": "ascend_quant.ini", "head": "float32",
                                        "embedding": "float32"}
    assert manifest["kernels"] == [] and manifest["kv_cache"] == "io"
    config = read_config(ascend_int8 / "ascend_quant.ini")
    assert dict(config["common_quant_param"]) == {
        "quant_type": "WEIGHT_QUANT", "bit_num": "8", "min_quant_weight_size": "0", "min_quant_weight_channel": "16",
        "skip_quant_node": config["common_quant_param"]["skip_quant_node"]}
    assert dict(config["weight_quant_param"]) == {"dequant_strategy": "ON_THE_FLY"}
    assert dict(config["ascend_context"]) == {"provider": "ge"}
    skipped = config["common_quant_param"]["skip_quant_node"].split(",")
    assert len(skipped) == 4 and len(set(skipped)) == 4      # the head and the embedding of each of two graphs


def test_lites_converter_quantizes_every_linear_weight_but_the_head_it_is_told_to_skip(ascend_int8, tmp_path):
    """Lite 2.0's converter on CPU, on the prefill graph: with the configuration as written, and with its
    skip_quant_node line removed. The head's and the embedding's tables (vocab x hidden float32 each, one
    when tied) must be the difference, kept float32: their int8 form takes a quarter of the bytes
    (measured 0.64 of the float bytes saved, with Lite's own packing); a wrong node name would make the
    two files equal. (On CPU Lite quantizes a Gather's table too; on Ascend only one feeding a MatMul.)"""
    manifest = json.loads((ascend_int8 / "manifest.json").read_text())
    graph = str(ascend_int8 / manifest["graphs"]["prefill"]["files"][0])
    written = ascend_int8 / "ascend_quant.ini"
    unskipped = tmp_path / "unskipped.ini"
    unskipped.write_text("".join(line for line in written.read_text().splitlines(True)
                                 if not line.startswith("skip_quant_node=")))
    float_cfg = tmp_path / "float.ini"
    float_cfg.write_text("[ascend_context]\nprovider=ge\n")
    python = converter_python("test")
    sizes = {}
    for name, cfg in (("written", written), ("unskipped", unskipped), ("float", float_cfg)):
        result = subprocess.run([python, "-c", CONVERT, graph, str(tmp_path / name), str(cfg)],
                                capture_output=True, text=True, env=dict(os.environ, GLOG_v="3", PYTHONPATH=""))
        assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
        sizes[name] = os.path.getsize(tmp_path / f"{name}.ms")
    dims = manifest["graph_dims"]
    tables = 1 if manifest["model_config"]["tie_word_embeddings"] else 2
    table_bytes = tables * dims["vocab_size"] * manifest["model_config"]["hidden_size"] * 4
    assert 0.5 * table_bytes < sizes["written"] - sizes["unskipped"] < 0.8 * table_bytes, (sizes, table_bytes)
    assert sizes["written"] < 0.75 * sizes["float"], sizes


def stand_in_converter(tmp_path):
    path = tmp_path / "stand_in_converter_lite"
    path.write_text(STAND_IN_CONVERTER.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def test_quantize_runs_lites_converter_on_every_graph_for_ascend(ascend_int8, tmp_path, monkeypatch):
    export = tmp_path / "export"
    shutil.copytree(ascend_int8, export)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("STAND_IN_LOG", str(log))
    converter = stand_in_converter(tmp_path)
    result = run_cli(["-m", "lite_runtime.cli.ge_config", "quantize", "--model_dir", str(export),
                      "--converter", converter])
    assert result.returncode == 0, result.stderr
    manifest = json.loads((export / "manifest.json").read_text())
    graphs = [str(export / manifest["graphs"][kind]["files"][0]) for kind in ("prefill", "increment")]
    outputs = [g[: -len(".mindir")] + "_ascend_int8" for g in graphs]
    assert result.stdout.split() == [o + ".mindir" for o in outputs]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls == [["--fmk=MINDIR", f"--modelFile={g}", f"--outputFile={o}", "--optimize=ascend_oriented",
                      f"--configFile={export / 'ascend_quant.ini'}"] for g, o in zip(graphs, outputs)]

    monkeypatch.setenv("STAND_IN_FAIL", "unsupported op")
    result = run_cli(["-m", "lite_runtime.cli.ge_config", "quantize", "--model_dir", str(export),
                      "--converter", converter])
    (line,) = error_lines(result.stderr)
    assert result.returncode == 1 and f"failed on {graphs[0]}: ERROR [converter.cc] Convert failed: unsupported op" \
        in line, result.stderr


def test_quantize_refuses_an_export_without_the_scheme_and_a_missing_converter(ascend_int8, tmp_path):
    export = tmp_path / "export"
    shutil.copytree(ascend_int8, export)
    result = run_cli(["-m", "lite_runtime.cli.ge_config", "quantize", "--model_dir", str(export),
                      "--converter", str(tmp_path / "no_converter_lite")])
    (line,) = error_lines(result.stderr)
    assert result.returncode != 0 and "cannot run MindSpore Lite's converter" in line and "--converter" in line, line
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["quantization"] = {}
    (export / "manifest.json").write_text(json.dumps(manifest))
    result = run_cli(["-m", "lite_runtime.cli.ge_config", "quantize", "--model_dir", str(export)])
    (line,) = error_lines(result.stderr)
    assert result.returncode != 0 and "does not ask for Lite's weight quantization on Ascend" in line, line
