"""Multi-rank figures for the decode benchmark (`python tools/benchmark.py --tp 2`).

A tensor-parallel export runs one measuring process per rank under the project's launcher
(MindSpore's distributed engine on CPU for ms; for mslite, step segments whose ranks reduce on the
host through MPI); rank 0 writes the result. The launcher's own start-up
time is reported apart from model load time. Greedy picks agree across ranks without a channel:
every rank sees the same all-gathered logits.
"""
from __future__ import annotations

import json
import os
import re
from typing import Optional

from lite_runtime.ascend.rank_table import RankEntry, ServerEntry, table_json

RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_rank.py")
_LAUNCHER_LINE = re.compile(r"launcher: \d+ ranks, start-up (\d+) ms")


def loopback_rank_table(path: str, world_size: int) -> str:
    """A one-server rank table of `world_size` devices on this machine (CPU runs ignore the IPs)."""
    ranks = tuple(RankEntry(r, "127.0.0.1", r, f"127.0.0.{r + 2}") for r in range(world_size))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(table_json([ServerEntry("127.0.0.1", ranks)]), f)
    return path


def launch_command(python: str, job_file: str, out_file: str, job: dict, tmp: str):
    """The launcher running RANK_SCRIPT on every rank (`--model_dir` tells it the export's form)."""
    table = loopback_rank_table(os.path.join(tmp, "rank_table.json"), job["world_size"])
    return [python, "-m", "lite_runtime.cli.launch", "--rank_table", table, "--backend", job["backend"],
            "--log_dir", os.path.join(tmp, "logs"), "--", RANK_SCRIPT, job_file, out_file,
            "--model_dir", job["model_dir"]]


def launcher_startup_ms(stderr: str) -> Optional[float]:
    found = _LAUNCHER_LINE.search(stderr)
    return float(found.group(1)) if found else None


def join_cluster() -> int:
    """In a rank's measuring process: join the job and return this rank (before loading graphs)."""
    from mindspore.communication import get_rank, init
    init()
    return get_rank()

