"""Multi-rank export: graphs with collectives must be traced inside a launched job, after the
communication group exists (notes/distributed-on-cpu.md). The exporter starts that job itself:
one worker per rank under MindSpore's distributed engine, each tracing its own rank's graphs.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

from lite_runtime.distributed.process_group import run_ranks
from exporter.config.schema import NOT_YAML_KEYS, ExportConfig, config_from_dict

JOB_FILE = "export_job.json"


def trace_distributed(config: ExportConfig, folder: str, timeout: float = 900.0) -> None:
    """Trace every rank's graphs into `folder` with one MindSpore worker process per rank."""
    job = os.path.join(folder, JOB_FILE)
    data = dataclasses.asdict(config)
    for key in NOT_YAML_KEYS:
        data.pop(key)
    with open(job, "w", encoding="utf-8") as f:
        json.dump({"config": data, "source": config.source}, f)
    logs = os.path.join(folder, "logs")
    try:
        run_ranks(config.world_size, lambda rank: [sys.executable, "-m", "exporter.build.distributed", job, folder],
                  logs, with_ms_cluster=True, timeout=timeout)
    finally:
        os.remove(job)
    # Logs of a successful export are not part of the artifact.
    for name in os.listdir(logs):
        os.remove(os.path.join(logs, name))
    os.rmdir(logs)


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
