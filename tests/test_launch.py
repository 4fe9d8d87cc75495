"""The launcher's preparation for the Lite/Ascend path: per-rank GE ini files carrying the rank
table, and argument handling. (Full launched runs are in test_distributed.py.)"""
import configparser
import json

from lite_runtime.ascend.ge_config import read_ge_config
from lite_runtime.distributed.launch import _option, _without, rank_ini_files
from tiny_models import REPO


def write_table(path, n):
    devices = [{"device_id": str(i), "device_ip": f"192.98.92.{100 + i}", "rank_id": str(i)} for i in range(n)]
    path.write_text(json.dumps({"version": "1.0", "server_count": "1", "status": "completed",
                                "server_list": [{"server_id": "10.0.0.1", "device": devices,
                                                 "host_nic_ip": "reserve"}]}))
    return str(path)


def test_each_rank_gets_its_own_ini_pair_with_the_rank_table(tmp_path):
    table = write_table(tmp_path / "table.json", 2)
    preset = f"{REPO}/ge_configs/atlas_800t_a2.ini"
    args = ["--model_dir", "x", "--config_path", f"{preset},{preset}"]
    per_rank = rank_ini_files(args, table, str(tmp_path), 2)
    assert len(per_rank) == 2
    for rank, pair in enumerate(per_rank):
        files = pair.split(",")
        assert len(files) == 2 and all(f"rank_{rank}_" in f for f in files)
        for path in files:
            parser = configparser.ConfigParser()
            parser.read(path)
            assert parser["ascend_context"]["rank_table_file"] == table
            assert parser["ascend_context"]["provider"] == "ge"
            assert read_ge_config(path).rank_table_file == table     # and it validates


def test_no_ini_means_no_per_rank_files(tmp_path):
    assert rank_ini_files(["--model_dir", "x"], write_table(tmp_path / "t.json", 2), str(tmp_path), 2) is None


def test_argument_helpers():
    args = ["--model_dir", "out", "--backend=ms", "--distributed", "True", "--x", "1"]
    assert _option(args, "--model_dir") == "out" and _option(args, "--backend") == "ms"
    assert _option(args, "--missing") is None
    assert _without(_without(args, "--backend"), "--distributed") == ["--model_dir", "out", "--x", "1"]
