"""Serving from a launched run: rank 0 serves, the other ranks run the steps it sends them.

Tensor parallel (one replica of a multi-rank export): every step of rank 0's session is sent to the
other ranks first, and each runs the same step on its part of the model; the collectives inside the
step (MPI between Lite segments) join the parts. Data parallel (replicas of a single-rank export, one
per rank): rank 0 runs one engine per replica; a replica on another rank is a RemoteSession whose steps
run there and whose logits come back as raw float32. Only rank 0 samples: a step's inputs (tokens, counts, past
lengths, adapter slots) fix what every rank computes, so the ranks need no agreement of their own.
"""
from __future__ import annotations

import logging
from typing import List

import numpy as np

from lite_runtime.distributed.rank_channel import RankChannel


def _step_message(tokens, counts, past, *extra) -> dict:
    return {"step": [a.tolist() for a in (tokens, counts, past, *extra)]}


class MirroredSession:
    """Rank 0's session of a tensor-parallel export: each `step` is announced to the other ranks."""

    def __init__(self, session, channel: RankChannel):
        self.session, self.channel = session, channel

    def __getattr__(self, name):            # manifest, runtime, rank, ... of the wrapped session
        return getattr(self.session, name)

    def step(self, tokens: np.ndarray, counts: np.ndarray, past: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        self.channel.send_json(_step_message(tokens, counts, past, *extra))
        return self.session.step(tokens, counts, past, *extra)

    def close(self) -> None:
        try:
            self.channel.send_json({"stop": True})
        finally:
            self.session.close()


class RemoteSession:
    """The session of the replica on rank `rank` (data parallel), as rank 0's engine sees it."""

    def __init__(self, manifest, channel: RankChannel, rank: int):
        self.manifest, self.channel, self.rank = manifest, channel, rank
        self.runtime = f"rank {rank}"

    def step(self, tokens: np.ndarray, counts: np.ndarray, past: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        self.channel.send_json_to(self.rank, _step_message(tokens, counts, past, *extra))
        return np.frombuffer(self.channel.recv_bytes_from(self.rank), np.float32).reshape(len(tokens), -1)

    def close(self) -> None:
        self.channel.send_json_to(self.rank, {"stop": True})


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
    """This rank's channel in a launched run of `manifest`'s export: its ranks (tensor parallel), or
    `data_parallel` replicas of a single-rank export, one per rank."""
    from lite_runtime.contract.errors import UnsupportedError
    if data_parallel > 1 and manifest.world_size > 1:
        raise UnsupportedError(f"--data_parallel {data_parallel} with {model_dir}, an export of {manifest.world_size} "
                               "ranks: data-parallel serving runs replicas of a single-rank export")
    return RankChannel.from_env()


def serve_as_follower(session, channel: RankChannel) -> None:
    """A rank other than 0: run rank 0's steps until it stops."""
    try:
        steps = follow(session, channel, reply=session.manifest.world_size == 1)
        logging.getLogger("lite_runtime.serve").info("rank %d ran %d steps for rank 0", channel.rank, steps)
    finally:
        session.close()
        channel.close()


def rank0_engine(session, channel: RankChannel, make_engine):
    """Rank 0's engine: over the mirrored session (tensor parallel), or one per replica (data parallel)."""
    if session.manifest.world_size > 1:
        return make_engine(MirroredSession(session, channel))
    return Replicas([make_engine(session)] + [make_engine(RemoteSession(session.manifest, channel, rank))
                                              for rank in range(1, channel.world_size)])
