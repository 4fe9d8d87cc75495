"""Multi-rank export: graphs with collectives must be traced inside a launched job, after the
communication group exists (an export without it records a group of one rank). The exporter starts that job itself:
one worker per rank under MindSpore's distributed engine, each tracing its own rank's graphs.
When the job fails its rank logs are kept in `<output_dir>.export-logs/` and each failed rank's
first error line goes into the error.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
from typing import Optional

from lite_runtime.contract.errors import DistributedError
from lite_runtime.distributed.process_group import run_ranks
from exporter.config.schema import NOT_YAML_KEYS, ExportConfig, config_from_dict

JOB_FILE = "export_job.json"
LOGS_SUFFIX = ".export-logs"   # <output_dir>.export-logs: the rank logs of a failed export
FAILURE_GRACE = 5.0            # seconds the other ranks get to fail on their own after the first
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception): ")


def trace_distributed(config: ExportConfig, folder: str, timeout: float = 900.0) -> None:
    """Trace every rank's graphs into `folder` with one MindSpore worker process per rank."""
    job = os.path.join(folder, JOB_FILE)
    data = dataclasses.asdict(config)
    for key in NOT_YAML_KEYS:
        data.pop(key)
    with open(job, "w", encoding="utf-8") as f:
        json.dump({"config": data, "source": config.source}, f)
    logs = os.path.join(folder, "logs")
    kept = config.output_dir + LOGS_SUFFIX
    try:
        for attempt in (1, 2):
            try:
                run_ranks(config.world_size,
                          lambda rank: [sys.executable, "-m", "exporter.build.distributed", job, folder],
                          logs, with_ms_cluster=True, timeout=timeout, failure_grace=FAILURE_GRACE)
                break
            except DistributedError:
                # MindSpore 2.0 sometimes fails to form its cluster ("Failed to AllGather host's hash
                # name due to timeout", "The state of the cluster is error": a node's heartbeat timed
                # out during init): that, and only that, is tried again once.
                if attempt == 2 or not _cluster_timeout(logs, config.world_size):
                    raise
                shutil.rmtree(logs, ignore_errors=True)
    except DistributedError as e:
        # `folder` is removed with the failed export: the rank logs move next to the output first.
        shutil.rmtree(kept, ignore_errors=True)
        shutil.move(logs, kept)
        raise DistributedError(_failure_message(e, config.world_size, kept)) from None
    finally:
        os.remove(job)
    # Logs of a successful export are not part of the artifact; those of an earlier failure are stale.
    shutil.rmtree(logs)
    shutil.rmtree(kept, ignore_errors=True)


def _cluster_timeout(logs: str, world_size: int) -> bool:
    lines = [first_error_line(os.path.join(logs, f"rank_{rank}.log")) or "" for rank in range(world_size)]
    return any(m in line for line in lines for m in ("hash name due to timeout", "The state of the cluster is error"))


def _failure_message(error: DistributedError, world_size: int, kept: str) -> str:
    """Each failed rank's first error line, and where its log is."""
    errors = []
    for rank in range(world_size):
        line = first_error_line(os.path.join(kept, f"rank_{rank}.log"))
        if line:
            errors.append(f"rank {rank}: {line}")
    if not errors:   # no rank wrote an error of its own (killed, timed out): the launcher's account
        errors = [re.sub(r" \((logs?): [^)]*\)", "", str(error))]
    return f"the {world_size}-rank export failed: {'; '.join(errors)} (rank logs: {kept})"


def first_error_line(log_path: str) -> Optional[str]:
    """A rank's own error: its first `error:` line, else the first Python exception line."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f]
    except OSError:
        return None
    for line in lines:
        if line.startswith("error:"):
            return line[len("error:"):].strip()
    return next((line for line in lines if _EXCEPTION_LINE.match(line)), None)


def _worker(job_path: str, folder: str) -> None:
    """One rank of the export job. MindSpore's scheduler process runs this script too and has no
    graph to trace. GRAPH mode is set before `init()`: MindSpore 2.0 refuses to join the cluster in
    PyNative mode ("PyNative mode is not supported in dynamic networking")."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return
    import mindspore as ms
    from mindspore.communication import get_rank, init
    from lite_runtime.contract.mindir import cpu_graph_mode
    from exporter.build.trace import trace_rank
    from exporter.model_source import resolve_model
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    config = config_from_dict(job["config"], source=job["source"])
    cpu_graph_mode(ms)
    init()
    trace_rank(config, resolve_model(config), get_rank(), folder)


if __name__ == "__main__":
    from lite_runtime.contract.errors import ToolchainError
    try:
        _worker(sys.argv[1], sys.argv[2])
    except ToolchainError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
