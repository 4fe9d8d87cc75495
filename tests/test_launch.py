"""The launcher's preparation for the Lite/Ascend path: per-rank GE ini files carrying the rank
table, and argument handling. (Full launched runs are in test_distributed.py.)"""
import configparser
import json
import os
import subprocess
import sys

import pytest

from lite_runtime.ascend.ge_config import read_ge_config
from lite_runtime.distributed.launch import _option, _without, rank_ini_files
from support.tiny_models import REPO

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`


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


def test_listeners_sit_on_the_server_of_the_replicas_first_rank(tmp_path):
    """dp=2 x mp=2 over two servers (ranks 0-1 on 127.0.0.2, 2-3 on 127.0.0.1): each replica's
    scheduler and MPI publication on its first rank's server, the job's channel on rank 0's;
    with a master port every launcher derives the same ports, the first scheduler on the master port."""
    from lite_runtime.ascend.rank_table import load_rank_table
    from lite_runtime.distributed.job_layout import JobLayout
    from lite_runtime.distributed.servers import rank_hosts
    servers = [{"server_id": ip, "host_nic_ip": "reserve",
                "device": [{"device_id": str(d), "device_ip": f"192.98.9{s}.{d}", "rank_id": str(2 * s + d)}
                           for d in range(2)]} for s, ip in enumerate(("127.0.0.2", "127.0.0.1"))]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"version": "1.0", "server_count": "2", "status": "completed", "server_list": servers}))
    hosts = rank_hosts(load_rank_table(str(path)))
    assert hosts == ["127.0.0.2", "127.0.0.2", "127.0.0.1", "127.0.0.1"]
    for ms in (True, False):
        layout = JobLayout(2, 2, hosts, ms_cluster=ms, mpi=not ms, master_port=9000, linked=True)
        again = JobLayout(2, 2, hosts, ms_cluster=ms, mpi=not ms, master_port=9000, linked=True)
        assert [again.env(r) for r in range(4)] == [layout.env(r) for r in range(4)]
        env = [layout.env(r) for r in range(4)]
        assert {e["LITE_CHANNEL"] for e in env} == {env[0]["LITE_CHANNEL"]} and env[0]["LITE_CHANNEL"].startswith("127.0.0.2:")
        assert not any("LITE_REPLICA_CHANNEL" in e for e in env)     # every rank talks to rank 0 (mirrored.py)
        assert [e["RANK_ID"] for e in env] == ["0", "1", "2", "3"] and {e["RANK_SIZE"] for e in env} == {"4"}
        if ms:
            assert [(e["MS_SCHED_HOST"], e["MS_SCHED_PORT"], e["MS_NODE_ID"], e["MS_WORKER_NUM"]) for e in env] == [
                ("127.0.0.2", "9000", "0", "2"), ("127.0.0.2", "9000", "1", "2"),
                ("127.0.0.1", "9001", "0", "2"), ("127.0.0.1", "9001", "1", "2")]
            assert [s["MS_SCHED_HOST"] for s in layout.schedulers([2, 3])] == ["127.0.0.1"]
        else:
            assert env[1]["LITE_MPI_CHANNEL"].startswith("127.0.0.2:") and env[2]["LITE_MPI_CHANNEL"].startswith("127.0.0.1:")
            assert layout.schedulers(range(4)) == []
        ports = sorted(layout.ports.values())
        assert ports == list(range(9000, 9000 + len(ports)))


def test_a_jobs_own_ports_are_outside_the_range_outgoing_connections_take():
    """The ports a launcher gives its ranks are bound later, by them: one from the ephemeral range could be
    taken meanwhile by any outgoing connection (a CI run's rank 0 failed so: "Address already in use")."""
    from lite_runtime.distributed.job_layout import JobLayout
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    layout = JobLayout(2, 2, ["127.0.0.1"] * 4, ms_cluster=True, mpi=False)
    ports = list(layout.ports.values())
    assert len(set(ports)) == len(ports) and all(1024 < p <= low - 16 for p in ports), (ports, low)


def test_a_script_on_more_ranks_than_its_replicas_hold_is_refused_naming_the_data_parallel_that_fits(monkeypatch):
    """pipeline() or run_infer_main started on 2 ranks with a one-rank export and no data_parallel: one
    line, before any channel is opened (each rank used to answer every prompt again)."""
    from lite_runtime.contract.errors import ConfigError
    from lite_runtime.distributed.data_parallel import launched_ranks
    monkeypatch.setenv("RANK_SIZE", "2")
    monkeypatch.setenv("RANK_ID", "0")
    with pytest.raises(ConfigError, match=r"^data_parallel 1 with an export of 1 rank\(s\) needs 1 ranks; this job "
                                          r"has RANK_SIZE 2 \(data_parallel 2 fits it\)$"):
        launched_ranks(1, 1, "the export")
    monkeypatch.setenv("RANK_SIZE", "1")
    assert launched_ranks(1, 1, "the export") is None


def test_the_launchers_old_command_names_the_new_one_instead_of_doing_nothing(tmp_path):
    """`python -m lite_runtime.distributed.launch` (the launcher's command until it moved to cli/) used to
    exit 0 printing nothing."""
    table = write_table(tmp_path / "table.json", 2)
    result = subprocess.run([sys.executable, "-m", "lite_runtime.distributed.launch", "--rank_table", table, "--",
                             "run_infer_main.py", "--model_dir", "out"], cwd=REPO, capture_output=True, text=True,
                            timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
    assert result.returncode == 2 and result.stdout == "", result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "python -m lite_runtime.cli.launch" in lines[0] and "lite-launch" in lines[0], lines[0]
