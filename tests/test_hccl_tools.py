"""Making and merging rank tables (lite_runtime/ascend/rank_table_writer.py) on a fake hccn.conf, through
`lite-rank-table make | merge` and its upstream-named shims tools/hccl_tools.py and tools/merge_hccl.py."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lite_runtime.ascend import rank_table_writer as writer
from lite_runtime.ascend.rank_table import load_rank_table
from lite_runtime.contract.errors import ConfigError

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

REPO = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hccl_tools = _load("hccl_tools")


def device_ip(d: int) -> str:
    return f"192.168.{d // 8}.{100 + d}"


@pytest.fixture
def hccn_conf(tmp_path) -> str:
    lines = []
    for d in range(16):
        lines += [f"address_{d}={device_ip(d)}", f"netmask_{d}=255.255.255.0", f"netdetect_{d}=192.168.{d // 8}.1"]
    path = tmp_path / "hccn.conf"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def run_main(tmp_path, hccn_conf, device_num, visible="0,1,2,3,4,5,6,7", server_ip="10.0.0.1", **extra):
    argv = ["--device_num", device_num, "--visible_devices", visible, "--server_ip", server_ip,
            "--hccn_conf", hccn_conf, "--output_dir", str(tmp_path / "out")]
    for key, value in extra.items():
        argv += [f"--{key}", str(value)]
    assert hccl_tools.main(argv) == 0
    return tmp_path / "out"


def test_eight_devices(tmp_path, hccn_conf):
    out = run_main(tmp_path, hccn_conf, "[0,8)")
    path = out / "hccl_8p_01234567_10.0.0.1.json"
    table = load_rank_table(str(path))
    assert [(r.rank_id, r.device_id, r.device_ip) for r in table.ranks] == \
        [(i, i, device_ip(i)) for i in range(8)]
    raw = json.loads(path.read_text())
    assert raw["server_count"] == "1" and raw["server_list"][0]["host_nic_ip"] == "reserve"
    assert all(isinstance(v, str) for dev in raw["server_list"][0]["device"] for v in dev.values())


def test_two_devices(tmp_path, hccn_conf):
    out = run_main(tmp_path, hccn_conf, "[0,2)")
    table = load_rank_table(str(out / "hccl_2p_01_10.0.0.1.json"))
    assert [r.device_id for r in table.ranks] == [0, 1]


def test_two_digit_device_ids(tmp_path, hccn_conf):
    visible = ",".join(str(d) for d in range(16))
    out = run_main(tmp_path, hccn_conf, "[8,16)", visible=visible)
    table = load_rank_table(str(out / "hccl_8p_89101112131415_10.0.0.1.json"))
    assert [r.device_id for r in table.ranks] == list(range(8, 16))
    assert [r.rank_id for r in table.ranks] == list(range(8))
    assert table.ranks[7].device_ip == device_ip(15)


def test_visible_device_remapping_looks_ips_up_by_physical_id(tmp_path, hccn_conf):
    out = run_main(tmp_path, hccn_conf, "[0,2)", visible="4,5,6,7")
    table = load_rank_table(str(out / "hccl_2p_45_10.0.0.1.json"))
    assert [(r.device_id, r.device_ip) for r in table.ranks] == [(4, device_ip(4)), (5, device_ip(5))]


def test_device_range_parsing_and_node_fit():
    assert writer.parse_device_range("[8,16)") == range(8, 16)
    assert writer.select_devices(range(2, 4), [0, 1, 2, 3, 4, 5, 6, 7], 8) == [2, 3]
    with pytest.raises(ConfigError, match="half-open range"):
        writer.parse_device_range("0-8")
    with pytest.raises(ConfigError, match="is empty"):
        writer.parse_device_range("[4,4)")
    with pytest.raises(ConfigError, match=r"does not fit in one node .* inside \[0,8\)"):
        writer.select_devices(range(4, 12), list(range(16)), 8)
    with pytest.raises(ConfigError, match="needs 8 visible devices"):
        writer.select_devices(range(0, 8), [0, 1, 2, 3], 8)
    # no hard-coded groups of four: [2,6) is fine on an 8-device node
    assert writer.select_devices(range(2, 6), list(range(8)), 8) == [2, 3, 4, 5]


def test_device_ip_sources(tmp_path, hccn_conf):
    assert writer.collect_device_ips([3, 9], device_ips="10.1.0.3,10.1.0.9") == {3: "10.1.0.3", 9: "10.1.0.9"}
    assert writer.collect_device_ips([9], device_ips=hccn_conf) == {9: device_ip(9)}
    with pytest.raises(ConfigError, match="2 IP.* for 1 device"):
        writer.collect_device_ips([3], device_ips="10.1.0.3,10.1.0.9")
    short = tmp_path / "short.conf"
    short.write_text("address_0=192.168.0.100\n")
    with pytest.raises(ConfigError, match=r"no IP for device\(s\) 1 .*address_1=IP"):
        writer.collect_device_ips([0, 1], hccn_conf=str(short))
    broken = tmp_path / "broken.conf"
    broken.write_text("netmask_0=255.0.0.0\naddress_0=192.168.0.1000\n")
    with pytest.raises(ConfigError, match=r"broken.conf: line 2: address_0: '192.168.0.1000' is not a valid IP"):
        writer.read_hccn_conf(str(broken))


def test_hccn_tool_output_is_parsed(tmp_path):
    fake = tmp_path / "hccn_tool"
    fake.write_text("#!/bin/sh\necho \"ipaddr:192.168.7.$2\"\necho \"netmask:255.255.255.0\"\n")
    fake.chmod(0o755)
    assert writer.collect_device_ips([1, 12], hccn_tool=str(fake)) == {1: "192.168.7.1", 12: "192.168.7.12"}


@pytest.mark.parametrize("make, merge", [
    ([str(REPO / "tools" / "hccl_tools.py")], [str(REPO / "tools" / "merge_hccl.py")]),
    (["-m", "lite_runtime.cli.rank_table", "make"], ["-m", "lite_runtime.cli.rank_table", "merge"]),
], ids=["upstream_scripts", "rank_table_command"])
def test_make_and_merge_in_subprocesses(tmp_path, hccn_conf, make, merge):
    out = tmp_path / "tables"
    for ip, rng, visible in (("10.0.0.1", "[0,8)", "0,1,2,3,4,5,6,7"),
                             ("10.0.0.2", "[8,16)", ",".join(str(d) for d in range(16)))):
        run = subprocess.run([sys.executable, *make, "--device_num", rng,
                              "--visible_devices", visible, "--server_ip", ip, "--hccn_conf", hccn_conf,
                              "--output_dir", str(out)], capture_output=True, text=True, cwd=REPO)
        assert run.returncode == 0, run.stderr
    first, second = out / "hccl_8p_01234567_10.0.0.1.json", out / "hccl_8p_89101112131415_10.0.0.2.json"
    run = subprocess.run([sys.executable, *merge, str(first), str(second), "--output_dir", str(out)],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    merged = Path(run.stdout.strip())
    assert merged == out / "hccl_2s_16p.json"
    table = load_rank_table(str(merged))
    assert [r.rank_id for r in table.ranks] == list(range(16))
    assert [r.server_id for r in table.ranks] == ["10.0.0.1"] * 8 + ["10.0.0.2"] * 8
    assert [r.device_id for r in table.ranks] == list(range(16))
    assert json.loads(merged.read_text())["server_count"] == "2"


def test_merge_refuses_the_same_server_twice(tmp_path, hccn_conf):
    out = run_main(tmp_path, hccn_conf, "[0,2)")
    path = str(out / "hccl_2p_01_10.0.0.1.json")
    with pytest.raises(ConfigError, match="server 10.0.0.1 is in both"):
        writer.merge_files([path, path], str(tmp_path))


@pytest.mark.parametrize("script,args,expected", [
    ("hccl_tools.py", ["--device_num", "[0,9)", "--server_ip", "10.0.0.1", "--device_ips", "1.1.1.1"],
     "needs 9 visible devices"),
    ("hccl_tools.py", ["--device_num", "[0,2)", "--server_ip", "10.0.0.999", "--device_ips", "1.1.1.1,1.1.1.2"],
     "--server_ip: '10.0.0.999' is not a valid IP"),
    ("hccl_tools.py", ["--device_num_per_node", "eight"], "'eight' is not a valid integer"),
    ("merge_hccl.py", ["missing.json"], "rank table missing.json does not exist"),
])
def test_cli_errors_are_one_line(tmp_path, script, args, expected):
    run = subprocess.run([sys.executable, str(REPO / "tools" / script)] + args, capture_output=True, text=True,
                         cwd=tmp_path)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert run.stderr.count("\n") == 1, run.stderr
    assert expected in run.stderr
