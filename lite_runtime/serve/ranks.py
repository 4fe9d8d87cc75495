"""Serving from a launched run: rank 0 serves, the other ranks run the steps it sends them (the
mirrored protocol of distributed/mirrored.py). A job of dp·mp ranks runs dp replicas of an mp-rank
export; rank 0 runs one engine per replica, behind one `Replicas`.
"""
from __future__ import annotations

import logging

from lite_runtime.distributed.data_parallel import ReplicaLayout
from lite_runtime.distributed.mirrored import follow, replica_sessions
from lite_runtime.distributed.rank_channel import RankChannel
from lite_runtime.distributed.replicas import Replicas


def join(model_dir: str, manifest, data_parallel: int) -> RankChannel:
    """This rank's channel in a launched run of `data_parallel` replicas of `manifest`'s export."""
    from lite_runtime.contract.errors import ConfigError
    channel = RankChannel.from_env()
    if channel.world_size != data_parallel * manifest.world_size:
        channel.close()
        raise ConfigError(f"--data_parallel {data_parallel} with {model_dir}, an export of {manifest.world_size} "
                          f"rank(s), needs {data_parallel * manifest.world_size} ranks; this run has "
                          f"{channel.world_size}")
    return channel


def serve_as_follower(session, channel: RankChannel) -> None:
    """A rank other than 0: run rank 0's steps until it stops; the first rank of a replica answers."""
    layout = ReplicaLayout(channel.rank, channel.world_size // session.manifest.world_size, session.manifest.world_size)
    try:
        steps, _ = follow(session, channel, reply=layout.model_rank == 0)
        logging.getLogger("lite_runtime.serve").info("rank %d ran %d steps for rank 0", channel.rank, steps)
    finally:
        session.close()
        channel.close()


def rank0_engine(session, channel: RankChannel, make_engine):
    """Rank 0's engine: over its own replica (mirrored to the replica's other ranks), and with data
    parallel one more per other replica, behind one `Replicas`."""
    engines = [make_engine(s) for s in replica_sessions(session, channel, session.manifest.world_size)]
    return engines[0] if len(engines) == 1 else Replicas(engines)
