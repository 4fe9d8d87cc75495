"""Start one process per rank, watch them, and stop them all when one fails or time runs out.

Used by the run launcher (`python -m lite_runtime.cli.launch`). On CPU, MindSpore's
distributed engine needs a scheduler process plus one worker per rank (`MS_ROLE`, `MS_NODE_ID`
fixes the rank order); `schedulers` starts them (one per cluster: one per replica in data parallel).
Rank 0 may inherit stdin/stdout (it is the rank that talks to the user); every other rank writes
to `log_dir/rank_{r}.log`. Each process runs in its own session so it and its children can be
killed as a group; nothing is found or killed by name.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from lite_runtime.contract.errors import DistributedError

log = logging.getLogger("lite_runtime.distributed.launch")
# GRAPH mode first: MindSpore 2.0 refuses to join a cluster in PyNative mode ("PyNative mode is not
# supported in dynamic networking").
SCHEDULER_CODE = ("import mindspore as ms; ms.set_context(mode=ms.GRAPH_MODE); "
                  "from mindspore.communication import init; init()")


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768        # Linux's default


def free_port(span: int = 16) -> int:
    """A port of 127.0.0.1 that is free now, at least `span` ports below the ephemeral range (a job given
    a master port also uses the ports after it).

    The port is only chosen here and bound later by another process. Ports of the ephemeral range
    (what binding port 0 returns) are also what the kernel gives every outgoing connection meanwhile,
    so one of those could take it first ("Address already in use" at the rank's bind)."""
    top, chooser = _ephemeral_start() - span, random.SystemRandom()
    for port in (chooser.randrange(10000, top) for _ in range(200 if top > 10000 else 0)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankProcess:
    rank: int
    proc: subprocess.Popen
    log_path: str


@dataclass
class LaunchResult:
    start_seconds: float       # from the first spawn until every process was running
    run_seconds: float


def tail(path: str, lines: int = 12) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read().splitlines()
    except OSError:
        return ""
    useful = [l for l in text if l.strip() and "[WARNING]" not in l]
    return "\n".join(useful[-lines:])


_MPI_EXIT = re.compile(r"TERMINATED WITH THE EXIT STRING: (.+)")   # mpiexec's account of its process


def _error_line(path: str) -> str:
    """The most telling line of a failed rank's log: its `error:` line or exception, else mpiexec's
    account of how the rank's process ended (a rank of a segment export), else the last line."""
    text = tail(path, 200).splitlines()
    for line in reversed(text):
        if line.startswith("error:") or "Error" in line:
            return line.strip()
    ended = next((m.group(1).strip() for m in map(_MPI_EXIT.search, text) if m), None)
    if ended:
        return f"its process ended: {ended}"
    return text[-1].strip() if text else "(no output)"


def ms_cluster_env(host: str, port: int, workers: int) -> Dict[str, str]:
    """The environment shared by a MindSpore cluster's scheduler and workers (each worker adds
    MS_ROLE=MS_WORKER and MS_NODE_ID, its rank in the cluster)."""
    return {"MS_SCHED_HOST": host, "MS_SCHED_PORT": str(port), "MS_WORKER_NUM": str(workers)}


def run_ranks(ranks: Sequence[int], command: Callable[[int], List[str]], log_dir: str, *,
              env: Callable[[int], Dict[str, str]], schedulers: Sequence[Dict[str, str]] = (),
              rank0_console: bool = False, timeout: float = 600.0, poll: float = 0.1,
              failure_grace: float = 0.0, watch: Optional[Callable[[], None]] = None,
              stop_grace: float = 30.0) -> LaunchResult:
    """Run `command(rank)` with `env(rank)` for every rank of `ranks`, after a MindSpore scheduler
    for each environment of `schedulers` (ms_cluster_env); raise DistributedError naming the first
    rank that fails. `watch()` is called while they run and may raise to stop them all.

    On failure or timeout every process started here is killed (SIGKILL to its process group)
    before the error is raised, so nothing is left behind (`timeout` 0: no limit). `failure_grace` seconds after the first
    failure the other ranks may still end by themselves, so their logs hold their own errors too.
    SIGTERM or Ctrl-C to this process is passed on to the first of `ranks` (rank 0 on its server), which
    ends the run and tells the other ranks (a server finishes its requests and exits 0); ranks still
    running `stop_grace` seconds later are killed.
    """
    os.makedirs(log_dir, exist_ok=True)
    base = dict(os.environ)
    started = time.perf_counter()
    procs: List[RankProcess] = []
    started_schedulers: List[subprocess.Popen] = []
    try:
        for i, cluster in enumerate(schedulers):
            path = os.path.join(log_dir, "scheduler.log" if len(schedulers) == 1 else f"scheduler_{i}.log")
            started_schedulers.append(_spawn([sys.executable, "-c", SCHEDULER_CODE],
                                             dict(base, **cluster, MS_ROLE="MS_SCHED"), path, console=False))
        for rank in ranks:
            path = os.path.join(log_dir, f"rank_{rank}.log")
            procs.append(RankProcess(rank, _spawn(command(rank), dict(base, **env(rank)), path,
                                                  rank0_console and rank == 0), path))
        start_seconds = time.perf_counter() - started
        with _signals_passed_on(procs, stop_grace) as stop:
            _wait(procs, started_schedulers, timeout, started, poll, failure_grace, watch, stop)
        return LaunchResult(start_seconds, time.perf_counter() - started)
    finally:
        _kill_all([p.proc for p in procs] + started_schedulers)


def _spawn(argv: Sequence[str], env: Dict[str, str], log_path: str, console: bool) -> subprocess.Popen:
    logf = open(log_path, "w", encoding="utf-8")
    try:
        return subprocess.Popen(list(argv), env=env, start_new_session=True,
                                stdin=None if console else subprocess.DEVNULL,
                                stdout=None if console else logf, stderr=logf)
    finally:
        logf.close()


class _Stop:
    """A stop asked for by a signal: when, and how long the ranks get to end by themselves."""

    def __init__(self, grace: float):
        self.grace, self.since = grace, None


@contextlib.contextmanager
def _signals_passed_on(procs: List[RankProcess], grace: float):
    stop = _Stop(grace)
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, _frame):
        stop.since = stop.since or time.perf_counter()
        if procs[0].proc.poll() is None:
            try:
                os.killpg(procs[0].proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _wait(procs: List[RankProcess], schedulers: Sequence[subprocess.Popen], timeout: float, started: float,
          poll: float, grace: float = 0.0, watch: Optional[Callable[[], None]] = None,
          stop: Optional[_Stop] = None) -> None:
    pending = list(procs)
    failure: Optional[DistributedError] = None
    failed_at = 0.0
    while pending:
        for p in list(pending):
            code = p.proc.poll()
            if code is None:
                continue
            pending.remove(p)
            if code != 0 and failure is None:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                failure = DistributedError(f"rank {p.rank} {how}: {_error_line(p.log_path)} (log: {p.log_path})")
                failed_at = time.perf_counter()
        if failure is not None:
            if not pending or time.perf_counter() - failed_at >= grace:
                raise failure
        elif pending and any(s.poll() not in (None, 0) for s in schedulers):
            code = next(s.returncode for s in schedulers if s.returncode not in (None, 0))
            raise DistributedError(f"a MindSpore scheduler exited with code {code} "
                                   f"while ranks {', '.join(str(p.rank) for p in pending)} were running")
        elif pending and watch is not None:
            watch()
        if stop is not None and stop.since is not None and time.perf_counter() - stop.since > stop.grace:
            raise DistributedError(f"stopped by a signal; ranks {', '.join(str(p.rank) for p in pending)} did not "
                                   f"end within {stop.grace:.0f} s and were killed")
        if timeout and time.perf_counter() - started > timeout:
            raise failure or DistributedError(f"ranks {', '.join(str(p.rank) for p in pending)} still running after "
                                   f"{timeout:.0f} s; stopped them all (logs: {os.path.dirname(pending[0].log_path)})")
        if pending:
            time.sleep(poll)


def _kill_all(procs: Sequence[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.error("process %d did not stop after SIGKILL", proc.pid)
