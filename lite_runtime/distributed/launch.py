"""The launcher (its command: `python -m lite_runtime.cli.launch`, console script `lite-launch`):
starts one process per rank of the rank table, with RANK_ID, DEVICE_ID, RANK_TABLE_FILE and
RANK_SIZE; on CPU (`--backend ms`) also MindSpore's scheduler/worker environment with a fixed
rank order; for `mslite` a per-rank GE ini carrying `rank_table_file`. Rank 0 keeps the console
(stdin and stdout); other ranks log to `--log_dir`. When any rank fails or the run exceeds
`--timeout`, every rank is stopped and the launcher exits non-zero naming the failing rank.

The program's `--model_dir` and `--data_parallel` tell the launcher the job's form: a table of
dp·mp devices runs dp replicas of an mp-rank export, consecutive ranks forming a replica (ranks
r·mp … r·mp+mp−1, as MindSpore's and upstream's layouts do), each replica with its own MindSpore
cluster (`ms`) or MPI join (Lite segments); see job_layout.py.

Several servers (a rank table merged by tools/merge_hccl.py): run the launcher on each server; it
starts the ranks of its server (`--server_id`, else the server whose address is this host's). The
ranks join through the same engines as on one server, listening on the first server's address at
ports from `--master_port` on, which every server's launcher derives alike; the launchers keep in
touch, so one server's failure stops them all (servers.py).
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from typing import List, Optional, Sequence

from lite_runtime.contract.errors import ConfigError, DistributedError
from lite_runtime.distributed.host_collectives import mpiexec
from lite_runtime.distributed.job_layout import JobLayout
from lite_runtime.distributed.process_group import run_ranks
from lite_runtime.distributed.servers import LauncherLink, pick_server, rank_hosts
from lite_runtime.ascend.rank_table import load_rank_table

log = logging.getLogger("lite_runtime.distributed.launch")
DEFAULT_MASTER_PORT = 8118      # msrun's


def _option(args: Sequence[str], name: str) -> Optional[str]:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _without(args: Sequence[str], name: str) -> List[str]:
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == name:
            skip = True
            continue
        if not a.startswith(name + "="):
            out.append(a)
    return out


def _manifest(program_args: Sequence[str]):
    model_dir = _option(program_args, "--model_dir")
    if not model_dir:
        return None
    from lite_runtime.contract.manifest import load_manifest
    return load_manifest(model_dir)


def check_world_size(table_size: int, program_args: Sequence[str], table_path: str, manifest=None) -> int:
    """Refuse, before anything starts, a rank table whose size is not data_parallel x the export's
    ranks; returns data_parallel."""
    text = _option(program_args, "--data_parallel") or "1"
    dp = int(text) if text.isdigit() else 0
    if dp < 1:
        raise ConfigError(f"--data_parallel {text!r} must be a positive integer")
    if manifest is None:
        if table_size % dp:
            raise ConfigError(f"rank table {table_path} has {table_size} ranks, which --data_parallel {dp} does "
                              "not divide into replicas of equal size")
        return dp
    model_dir = _option(program_args, "--model_dir")
    if dp * manifest.world_size != table_size:
        raise ConfigError(f"rank table {table_path} has {table_size} ranks but the export {model_dir} was "
                          f"written for {manifest.world_size}" + (f" x data_parallel {dp}" if dp > 1 else "") +
                          f"; use a rank table with {dp * manifest.world_size} devices or export with that "
                          "model_parallel")
    return dp


def rank_ini_files(program_args: Sequence[str], table_path: str, log_dir: str, world_size: int) -> Optional[List[str]]:
    """Per-rank copies of the GE ini(s) with `rank_table_file` set (Lite/Ascend path)."""
    from lite_runtime.ascend.ge_config_writer import with_rank_table
    source = _option(program_args, "--config_path")
    if not source:
        return None
    paths = []
    for rank in range(world_size):
        parts = [with_rank_table(p, table_path, os.path.join(log_dir, f"rank_{rank}_{i}.ini"))
                 for i, p in enumerate(source.split(","))]
        paths.append(",".join(parts))
    return paths


def launch(rank_table: str, program: Sequence[str], backend: Optional[str] = None, log_dir: Optional[str] = None,
           timeout: Optional[float] = None, server_id: Optional[str] = None, master_port: Optional[int] = None) -> float:
    """Run `program` once per rank of this server; returns the launcher's start-up seconds. `timeout`
    (seconds, 0: none) defaults to none for a server, 600 s for anything else."""
    if not program:
        raise ConfigError("give the program after --, e.g. -- run_infer_main.py --model_dir out/llama ...")
    table = load_rank_table(rank_table)
    world = len(table.ranks)
    server, chosen_by = pick_server(table, server_id)
    several = len(table.servers) > 1
    if master_port is not None and not 0 < master_port < 65536:
        raise ConfigError(f"--master_port {master_port} must be a port number, 1..65535")
    head = list(program[:2]) if program[0] == "-m" else list(program[:1])     # a script, or -m module
    args = list(program[len(head):])
    if timeout is None:
        timeout = 0 if head == ["-m", "lite_runtime.serve"] else 600.0
    manifest = _manifest(args)
    data_parallel = check_world_size(world, args, rank_table, manifest)
    backend = backend or _option(args, "--backend") or "mslite"
    # Segment exports reduce on the host through MPI: each rank its own one-process MPI job, joined
    # by the ranks of its replica themselves (host_collectives.py).
    mpi = backend == "mslite" and manifest is not None and manifest.collectives == "host"
    model_ranks = world // data_parallel
    layout = JobLayout(data_parallel, model_ranks, rank_hosts(table), ms_cluster=backend == "ms" and model_ranks > 1,
                       mpi=mpi, master_port=DEFAULT_MASTER_PORT if several and master_port is None else master_port,
                       linked=several)
    ranks = sorted(r.rank_id for r in server.ranks)
    if several:
        print(f"launcher: server {server.server_id} ({chosen_by}), ranks {', '.join(map(str, ranks))} of {world}",
              file=sys.stderr)
    args = _without(_without(args, "--backend"), "--distributed") + ["--backend", backend, "--distributed", "True"]
    log_dir = log_dir or tempfile.mkdtemp(prefix="launch-")
    os.makedirs(log_dir, exist_ok=True)
    inis = rank_ini_files(args, os.path.abspath(rank_table), log_dir, world) if backend == "mslite" else None
    wrapper = [mpiexec(), "-n", "1"] if mpi else []

    def command(rank: int) -> List[str]:
        rank_args = args if inis is None else _without(args, "--config_path") + ["--config_path", inis[rank]]
        return wrapper + [sys.executable] + head + rank_args

    def env(rank: int):
        return dict(layout.env(rank), DEVICE_ID=str(table.ranks[rank].device_id),
                    RANK_TABLE_FILE=os.path.abspath(rank_table))

    started = time.perf_counter()
    link = None
    if several:
        first = table.ranks[0].server_id
        servers = [first] + [s.server_id for s in table.servers if s.server_id != first]
        link = LauncherLink(server.server_id, servers, layout.address("launchers"), timeout)
    try:
        result = run_ranks(ranks, command, log_dir, env=env, schedulers=layout.schedulers(ranks), rank0_console=True,
                           timeout=timeout, watch=link.watch if link else None)
        if link is not None:
            link.finish()
    except DistributedError as e:
        if link is not None:
            link.report(str(e))
        raise
    finally:
        if link is not None:
            link.close()
    print(f"launcher: {len(ranks)} ranks, start-up {result.start_seconds * 1000:.0f} ms, whole run "
          f"{time.perf_counter() - started:.1f} s (logs: {log_dir})", file=sys.stderr)
    return result.start_seconds


if __name__ == "__main__":
    # This was the launcher's command; it moved up to cli/, which this library may not import (imports point
    # down, commands on top), so the old command names the new one instead of exiting 0 having done nothing.
    from lite_runtime.contract.command_line import fail
    sys.exit(fail("python -m lite_runtime.distributed.launch is now python -m lite_runtime.cli.launch (console "
                  "script lite-launch): run that with the same arguments", 2))
