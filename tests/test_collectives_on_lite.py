"""Tensor-parallel exports with the MindSpore 2.0 (Lite) environment, and Lite never running a graph
whose collectives it cannot execute: Lite 2.0 on CPU drops AllReduce with only a warning and
returns one rank's partial sums, so the runtime refuses such a graph itself."""
import json
import os

import pytest

from support.lite_process import ensure_lite_installed
from support.tiny_models import VENV_MS20_PYTHON, export_in_subprocess, run_cli, tiny_export_config, write_yaml

LOAD_ON_LITE = """
import sys
from lite_runtime.backends import load_session
from lite_runtime.contract.errors import ToolchainError
from lite_runtime.contract.manifest import load_manifest
try:
    load_session("mslite", load_manifest(sys.argv[1]))
except ToolchainError as e:
    print(e)
    sys.exit(3)
"""


@pytest.fixture(scope="module")
def ms20_tp2_export(tiny_ckpt, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ms20_tp2")
    cfg = tiny_export_config(tiny_ckpt[0], str(folder / "tp2"), parallel={"model_parallel": 2})
    return export_in_subprocess(write_yaml(str(folder / "tp2.yaml"), cfg), python=str(VENV_MS20_PYTHON))


def test_tp_export_with_the_mindspore_20_environment(ms20_tp2_export):
    manifest = json.load(open(os.path.join(ms20_tp2_export, "manifest.json")))
    assert manifest["world_size"] == 2 and manifest["mindspore_version"].startswith("2.0")
    for kind in ("mindir_full_checkpoint", "mindir_inc_checkpoint"):
        assert sorted(os.listdir(os.path.join(ms20_tp2_export, kind))) == ["rank_0_graph.mindir", "rank_1_graph.mindir"]


def test_rank_graphs_for_lite_name_the_hccl_world_group(ms20_tp2_export):
    """Lite runs collectives only on Ascend (GE with HCCL): the graphs name HCCL's world group, not
    the CPU library's group a MindSpore cluster on this machine would have given them."""
    for rank in range(2):
        data = open(os.path.join(ms20_tp2_export, "mindir_inc_checkpoint", f"rank_{rank}_graph.mindir"), "rb").read()
        assert b"hccl_world_group" in data and b"mccl_world_group" not in data


def test_lite_refuses_a_rank_graph_with_collectives(ms20_tp2_export, tmp_path):
    """One rank's graph presented as a single-rank export (as a user copying rank_0 files would):
    the manifest no longer tells, the graph's own nodes do."""
    ensure_lite_installed()
    path = os.path.join(ms20_tp2_export, "manifest.json")
    manifest = json.load(open(path))
    manifest["world_size"] = 1
    for entry in manifest["graphs"].values():
        entry["files"] = entry["files"][:1]
    manifest["sha256"] = {k: v for k, v in manifest["sha256"].items() if "rank_0" in k}
    single = tmp_path / "single"
    single.mkdir()
    for name in ("mindir_full_checkpoint", "mindir_inc_checkpoint"):
        os.symlink(os.path.join(ms20_tp2_export, name), single / name)
    (single / "manifest.json").write_text(json.dumps(manifest))
    result = run_cli(["-c", LOAD_ON_LITE, str(single)])
    assert result.returncode == 3, result.stdout + result.stderr[-2000:]
    assert "AllReduce" in result.stdout and "cannot execute" in result.stdout


def test_lite_refuses_a_multi_rank_export_by_its_manifest(ms20_tp2_export):
    ensure_lite_installed()
    result = run_cli(["-c", LOAD_ON_LITE, ms20_tp2_export])
    assert result.returncode == 3 and "2 ranks" in result.stdout, result.stdout + result.stderr[-2000:]


@pytest.mark.fast
def test_segments_run_in_the_contracts_order_whatever_the_manifests_key_order():
    """A manifest keeps its segments sorted by name (head before layer0, layer10 before layer2): the
    runtime's order comes from the names, the one the exporter traced them in."""
    from lite_runtime.contract.families import GraphDims
    from lite_runtime.contract.segments import SegmentLayout, run_order, segment_specs
    dims = GraphDims(2, 32, 12, 2, 8, 64, hidden_size=32, rotary=1)
    for layout in (SegmentLayout(), SegmentLayout(top_query=True), SegmentLayout(deepnorm=True, prefix_attention=True,
                                                                                  row_inputs=("context_length",))):
        specs = segment_specs(dims, 2, layout)
        assert run_order(sorted(specs)) == list(specs)
    one_rank = segment_specs(dims, 1, SegmentLayout(blocks_per_segment=5))       # 12 layers in 5 + 5 + 2
    assert run_order(sorted(one_rank)) == list(one_rank) == ["embed", "layer0.blocks", "layer5.blocks",
                                                              "layer10.blocks", "head"]
    assert [s.name for s in one_rank["layer10.blocks"][0]][:9] == ["hidden", "token_rows", "past", "row", "position"] + \
        ["key_cache", "value_cache"] * 2
