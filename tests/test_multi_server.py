"""A rank table spanning two servers, each running its own launcher (`--server_id`), on one machine:
the "servers" are 127.0.0.2 and 127.0.0.1 (both loopback on Linux), their tables written by
tools/hccl_tools.py and merged by tools/merge_hccl.py; 127.0.0.2 comes first, so rank 0 and every
listener sit on an address other than 127.0.0.1. The TP=2 export's two ranks are on different
servers: they join through MindSpore's cluster (`ms`) or MPI (Lite segments) across them.
Reference: one launcher running the same 2 ranks on one server (same tokens)."""
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from lite_runtime.distributed.process_group import free_port
from support.tiny_models import REPO, error_lines, rank_table, run_cli

SERVERS = ("127.0.0.2", "127.0.0.1")


@pytest.fixture(scope="module")
def two_server_table(tmp_path_factory):
    folder = tmp_path_factory.mktemp("servers")
    tables = []
    for i, ip in enumerate(SERVERS):
        made = run_cli(["tools/hccl_tools.py", "--device_num", "[0,1)", "--visible_devices", "0", "--server_ip", ip,
                        "--device_ips", f"192.98.92.{100 + i}", "--output_dir", str(folder / ip)])
        assert made.returncode == 0, made.stderr
        (name,) = os.listdir(folder / ip)
        tables.append(str(folder / ip / name))
    merged = run_cli(["tools/merge_hccl.py"] + tables + ["--output_dir", str(folder)])
    assert merged.returncode == 0, merged.stderr
    return merged.stdout.strip()


def launcher(table, server, backend, master_port, logs, program):
    return subprocess.Popen(
        [sys.executable, "-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", backend,
         "--server_id", server, "--master_port", str(master_port), "--log_dir", str(logs), "--timeout", "300", "--"]
        + program, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_two_servers_give_the_tokens_of_one(two_server_table, tp_exports, backend, tmp_path):
    tp2, _ = tp_exports(backend)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one two three\nalpha beta\nfive six seven eight nine\n")
    program = ["run_infer_main.py", "--model_dir", tp2, "--predict_data", str(prompts), "--max_new_tokens", "8"]
    one = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", rank_table(tmp_path / "t2.json", 2),
                   "--backend", backend, "--log_dir", str(tmp_path / "one"), "--"] + program)
    assert one.returncode == 0, one.stderr[-2000:]
    expected = one.stdout.strip().splitlines()
    assert len(expected) == 3
    port = free_port()
    first, second = (launcher(two_server_table, s, backend, port, tmp_path / s, program) for s in SERVERS)
    out, err = first.communicate(timeout=300)
    _, err2 = second.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, err[-2000:] + err2[-2000:]
    assert out.strip().splitlines() == expected
    assert "launcher: server 127.0.0.2 (--server_id), ranks 0 of 2" in err
    assert "launcher: server 127.0.0.1 (--server_id), ranks 1 of 2" in err2
    rank1 = (tmp_path / SERVERS[1] / "rank_1.log").read_text()
    assert re.search(r"rank 1: replayed \d+ calls of rank 0", rank1), rank1[-2000:]   # on the other server
    assert not (tmp_path / SERVERS[1] / "rank_0.log").exists()


@pytest.mark.parametrize("backend", ["ms", "mslite"])
def test_a_failing_rank_stops_both_servers(two_server_table, tp_exports, backend, tmp_path):
    """Rank 1 (the second server's) killed while both wait for a prompt: both launchers exit 1, naming it;
    nothing is left running."""
    tp2, _ = tp_exports(backend)
    program = ["run_infer_main.py", "--model_dir", tp2, "--interactive"]
    port = free_port()
    first, second = (launcher(two_server_table, s, backend, port, tmp_path / s, program) for s in SERVERS)
    try:
        victim, started = None, time.monotonic()
        while victim is None and time.monotonic() - started < 120:
            for child in psutil.Process(second.pid).children(recursive=True):
                try:
                    if child.environ().get("RANK_ID") == "1" and child.cmdline()[1].endswith("run_infer_main.py"):
                        victim = child
                except (psutil.Error, IndexError):
                    pass
            time.sleep(0.5)
        assert victim is not None, "rank 1 never started"
        family = [p for launched in (first, second) for p in psutil.Process(launched.pid).children(recursive=True)]
        time.sleep(8)   # let the ranks load and wait for a prompt
        victim.send_signal(signal.SIGKILL)
        _, err2 = second.communicate(timeout=60)
        first.wait(timeout=60)      # rank 0's stdin stays open: it waits for a prompt, unaware by itself
        _, err = first.communicate()
    finally:
        for launched in (first, second):
            if launched.poll() is None:
                launched.kill()
    assert second.returncode == 1 and first.returncode == 1, err + err2
    assert "rank 1" in err2 and "signal 9" in err2, err2
    assert "rank 1" in err, err
    time.sleep(1)
    assert [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []


@pytest.mark.fast
@pytest.mark.parametrize("servers, server_id, facts", [
    (SERVERS, None, ["2 of the servers", "127.0.0.2, 127.0.0.1", "are addresses of this host", "--server_id"]),
    (("203.0.113.1", "203.0.113.2"), None, ["none of the servers", "203.0.113.1, 203.0.113.2", "--server_id"]),
    (SERVERS, "10.1.1.1", ["--server_id 10.1.1.1 is not a server", "127.0.0.2, 127.0.0.1"]),
], ids=["several_local", "none_local", "unknown_id"])
def test_server_choice_is_one_clear_line(tmp_path, servers, server_id, facts):
    tables = [rank_table(tmp_path / f"{ip}.json", 1, ip) for ip in servers]
    for i, path in enumerate(tables):     # distinct device IPs, as hccl_tools would write
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace("192.98.92.100", f"192.98.93.{100 + i}"))
    merged = run_cli(["tools/merge_hccl.py"] + tables + ["--output_dir", str(tmp_path)])
    assert merged.returncode == 0, merged.stderr
    logs = tmp_path / "logs"
    result = run_cli(["-m", "lite_runtime.cli.launch", "--rank_table", merged.stdout.strip(), "--log_dir",
                      str(logs)] + (["--server_id", server_id] if server_id else []) +
                     ["--", "run_infer_main.py", "--predict_data", "x"])
    assert result.returncode == 1 and len(error_lines(result.stderr)) == 1, result.stderr
    assert all(f in result.stderr for f in facts), result.stderr
    assert not logs.exists()
