"""Rank table loading, validation and merging (lite_runtime/ascend/rank_table.py)."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lite_runtime.contract.errors import ConfigError
from lite_runtime.ascend.rank_table import load_rank_table, merge_rank_tables, validate_rank_table

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

REPO = Path(__file__).resolve().parent.parent


def server(ip: str, devices, first_rank: int = 0, subnet: int = 0) -> dict:
    return {"server_id": ip, "host_nic_ip": "reserve",
            "device": [{"device_id": str(d), "device_ip": f"192.168.{subnet}.{100 + d}",
                        "rank_id": str(first_rank + i)} for i, d in enumerate(devices)]}


def table(*servers) -> dict:
    return {"version": "1.0", "server_count": str(len(servers)), "server_list": list(servers),
            "status": "completed"}


def write(tmp_path: Path, data, name: str = "rt.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_valid_table_orders_ranks_by_rank_id(tmp_path):
    data = table(server("10.0.0.1", range(4)))
    # list the devices out of rank order: ranks must still come back 0..3
    data["server_list"][0]["device"].reverse()
    loaded = load_rank_table(write(tmp_path, data))
    assert [r.rank_id for r in loaded.ranks] == [0, 1, 2, 3]
    assert [r.device_id for r in loaded.ranks] == [0, 1, 2, 3]
    assert loaded.ranks[2].device_ip == "192.168.0.102"
    assert loaded.ranks[2].server_id == "10.0.0.1"
    assert len(loaded.servers) == 1


def _bad(mutate):
    data = table(server("10.0.0.1", range(4)), server("10.0.0.2", range(4), first_rank=4, subnet=1))
    mutate(data)
    return data


def _set_device(si, di, key, value):
    def mutate(d):
        d["server_list"][si]["device"][di][key] = value
    return mutate


BAD_TABLES = {
    "gap in rank ids": (_set_device(1, 3, "rank_id", "9"), "without gaps"),
    "duplicate rank id": (_set_device(1, 0, "rank_id", "0"), "rank_id 0 is already used by server_list[0].device[0]"),
    "duplicate device on a server": (_set_device(0, 1, "device_id", "0"), "device_id 0 repeats device[0]"),
    "duplicate device_ip": (_set_device(1, 2, "device_ip", "192.168.0.101"),
                            "device_ip 192.168.0.101 is already used by server_list[0].device[1]"),
    "malformed device_ip": (_set_device(0, 2, "device_ip", "192.168.0.300"), "'192.168.0.300' is not a valid IP"),
    "malformed server_id": (lambda d: d["server_list"][1].update(server_id="node-b"), "'node-b' is not a valid IP"),
    "integer value": (_set_device(0, 0, "rank_id", 0), "must be a JSON string"),
    "server_count disagrees": (lambda d: d.update(server_count="3"), "server_count is 3 but server_list has 2"),
    "status not completed": (lambda d: d.update(status="initializing"), "status 'initializing' must be 'completed'"),
    "missing top key": (lambda d: d.pop("server_list"), "missing key(s) server_list"),
    "missing device key": (lambda d: d["server_list"][0]["device"][1].pop("device_ip"), "missing key(s) device_ip"),
    "unknown version": (lambda d: d.update(version="1.2"), "version '1.2' is not supported; allowed: 1.0"),
    "same server twice": (lambda d: d["server_list"][1].update(server_id="10.0.0.1"),
                          "server_id 10.0.0.1 already listed as server_list[0]"),
    "empty device list": (lambda d: d["server_list"][0].update(device=[]), "device must be a non-empty list"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_malformed_tables_rejected(tmp_path, case):
    mutate, expected = BAD_TABLES[case]
    path = write(tmp_path, _bad(mutate))
    with pytest.raises(ConfigError) as err:
        load_rank_table(path)
    assert expected in str(err.value)
    assert path in str(err.value)


def test_the_unmutated_base_of_the_bad_cases_is_valid():
    assert len(validate_rank_table(_bad(lambda d: None)).ranks) == 8


def test_not_json_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"line 2: not valid JSON"):
        load_rank_table(write(tmp_path, '{"version": "1.0",\n oops}'))
    with pytest.raises(ConfigError, match="does not exist"):
        load_rank_table(str(tmp_path / "nope.json"))


def test_merge_renumbers_in_file_order(tmp_path):
    a = load_rank_table(write(tmp_path, table(server("10.0.0.1", range(8))), "a.json"))
    b = load_rank_table(write(tmp_path, table(server("10.0.0.2", range(8), subnet=1)), "b.json"))
    merged = validate_rank_table(merge_rank_tables([b, a]))
    assert [r.rank_id for r in merged.ranks] == list(range(16))
    assert [r.server_id for r in merged.ranks[:8]] == ["10.0.0.2"] * 8
    assert merged.ranks[8].device_ip == "192.168.0.100"


def test_merge_refuses_duplicates(tmp_path):
    a = load_rank_table(write(tmp_path, table(server("10.0.0.1", range(2))), "a.json"))
    same_ips = load_rank_table(write(tmp_path, table(server("10.0.0.2", range(2))), "b.json"))
    with pytest.raises(ConfigError, match="server 10.0.0.1 is in both"):
        merge_rank_tables([a, a])
    with pytest.raises(ConfigError, match=r"device_ip 192.168.0.100 .* already used in .*a.json"):
        merge_rank_tables([a, same_ips])


def test_cli_check(tmp_path):
    good = write(tmp_path, table(server("10.0.0.1", range(2))), "good.json")
    run = subprocess.run([sys.executable, "-m", "lite_runtime.cli.rank_table", "check", good],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "1 server(s), 2 rank(s)" in run.stdout and "rank 1: device 1" in run.stdout
    bad = copy.deepcopy(table(server("10.0.0.1", range(2))))
    bad["status"] = "pending"
    run = subprocess.run([sys.executable, "-m", "lite_runtime.cli.rank_table", "check", write(tmp_path, bad)],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert "status 'pending'" in run.stderr
