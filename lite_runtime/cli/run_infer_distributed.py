"""`run_infer_main.py --distributed True`: one rank of a launched multi-rank run.

Rank 0 reads the prompts, answers them and prints, as a one-rank run would: with an export of several
ranks its session's calls are mirrored to the replica's other ranks, and with `--data_parallel N` each
request's prompts are split in order over the N replicas, which rank 0 drives too (the mirrored
protocol, distributed/mirrored.py). Every other rank replays the calls rank 0 sends it until rank 0
closes.
"""
from __future__ import annotations

import sys

from lite_runtime.distributed.data_parallel import ReplicaLayout


def run_distributed(args, run, make_generator) -> None:
    """This rank's part of a launched run_infer_main; the single-process CLI's `run` and `make_generator`
    do the work (given by the command, which imports this module)."""
    layout = ReplicaLayout.from_env(args.data_parallel)
    if args.backend == "ms" and layout.model_ranks > 1:
        from lite_runtime.backends.ms_backend import join_cluster
        join_cluster()   # before any graph with collectives is loaded: one without a group crashes the process
    if layout.rank == 0:
        return run(args)
    generator = make_generator(args, layout.model_rank)
    try:
        calls = generator.follow()
        print(f"rank {layout.rank}: replayed {calls} calls of rank 0", file=sys.stderr, flush=True)
    finally:
        generator.close()
