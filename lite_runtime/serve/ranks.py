"""Serving from a launched run: rank 0 serves, the other ranks run the steps it sends them.

A job of dp·mp ranks runs dp replicas of an mp-rank export, consecutive ranks forming a replica (as
the launcher lays them out). Rank 0 runs one engine per replica. Each step of a replica is sent to the
replica's ranks (rank 0's own replica: to its other ranks, before rank 0 runs its part), and each
runs the same step on its part of the model; the collectives inside the step (MPI between Lite
segments, a MindSpore cluster per replica on `ms`) join the parts. The first rank of any other
replica answers with the step's logits, as raw float32. Only rank 0 samples: a step's inputs (tokens,
counts, past lengths, adapter slots) fix what every rank computes, so the ranks need no agreement of
their own.
"""
from __future__ import annotations

import logging
from typing import List, Sequence

import numpy as np

from lite_runtime.distributed.rank_channel import RankChannel


def _step_message(tokens, counts, past, *extra) -> dict:
    return {"step": [a.tolist() for a in (tokens, counts, past, *extra)]}


class MirroredSession:
    """Rank 0's session of a tensor-parallel export: each `step` is sent to the replica's other ranks."""

    def __init__(self, session, channel: RankChannel, ranks: Sequence[int]):
        self.session, self.channel, self.ranks = session, channel, list(ranks)

    def __getattr__(self, name):            # manifest, runtime, rank, ... of the wrapped session
        return getattr(self.session, name)

    def step(self, tokens: np.ndarray, counts: np.ndarray, past: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        self.channel.send_json_to(self.ranks, _step_message(tokens, counts, past, *extra))
        return self.session.step(tokens, counts, past, *extra)

    def close(self) -> None:
        try:
            self.channel.send_json_to(self.ranks, {"stop": True})
        finally:
            self.session.close()


class RemoteSession:
    """The session of the replica on `ranks` (data parallel), as rank 0's engine sees it: its first rank
    answers each step with the logits."""

    def __init__(self, manifest, channel: RankChannel, ranks: Sequence[int]):
        self.manifest, self.channel, self.ranks = manifest, channel, list(ranks)
        self.runtime = f"ranks {self.ranks[0]}-{self.ranks[-1]}" if len(self.ranks) > 1 else f"rank {self.ranks[0]}"

    def step(self, tokens: np.ndarray, counts: np.ndarray, past: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        self.channel.send_json_to(self.ranks, _step_message(tokens, counts, past, *extra))
        return np.frombuffer(self.channel.recv_bytes_from(self.ranks[0]), np.float32).reshape(len(tokens), -1)

    def close(self) -> None:
        self.channel.send_json_to(self.ranks, {"stop": True})


def follow(session, channel: RankChannel, reply: bool) -> int:
    """Another rank: run each step rank 0 sends, answering with the logits when `reply` (data
    parallel), until it says stop; returns the number of steps."""
    steps = 0
    while True:
        message = channel.recv_json()
        if message.get("stop"):
            return steps
        steps += 1
        logits = session.step(*(np.asarray(a, np.int32) for a in message["step"]))
        if reply:        # raw float32: JSON of 8 x 32000 logits took 217 ms a step
            channel.reply_bytes(np.ascontiguousarray(logits, np.float32).tobytes())


class Replicas:
    """The engines of data-parallel replicas behind one endpoint, as the app sees one engine: a request
    goes to the replica with the least work."""

    def __init__(self, engines: List):
        self.engines = engines
        self.session = engines[0].session
        for engine in engines:
            engine.counted = self            # the metrics' running / waiting count every replica

    @property
    def waiting(self) -> list:
        return [request for engine in self.engines for request in engine.waiting]

    def busy_rows(self) -> int:
        return sum(engine.busy_rows() for engine in self.engines)

    def submit(self, request) -> None:
        min(self.engines, key=lambda e: e.busy_rows() + len(e.waiting)).submit(request)

    def cancel(self, request) -> None:
        for engine in self.engines:           # only the one holding it has anything to free
            engine.cancel(request)

    def stop(self, timeout: float = 10.0) -> None:
        for engine in self.engines:
            engine.stop(timeout)


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
    try:
        steps = follow(session, channel, reply=channel.rank % session.manifest.world_size == 0)
        logging.getLogger("lite_runtime.serve").info("rank %d ran %d steps for rank 0", channel.rank, steps)
    finally:
        session.close()
        channel.close()


def rank0_engine(session, channel: RankChannel, make_engine):
    """Rank 0's engine: over its own replica (mirrored to the replica's other ranks), and with data
    parallel one more per other replica, behind one `Replicas`."""
    mp = session.manifest.world_size
    own = make_engine(MirroredSession(session, channel, range(1, mp)) if mp > 1 else session)
    if channel.world_size == mp:
        return own
    return Replicas([own] + [make_engine(RemoteSession(session.manifest, channel, range(first, first + mp)))
                             for first in range(mp, channel.world_size, mp)])
