"""Serving a multi-rank (tensor-parallel) export from a launched run: rank 0 serves, and every step of
its session is sent to the other ranks, which run the same step on their part of the model.

The ranks stay in lockstep without a token agreement of their own: only rank 0 samples, and a step's
inputs (tokens, counts, past lengths, adapter slots) fix what every rank computes. The collectives
inside the step (MindSpore's in the graphs, MPI between Lite segments) join the ranks' parts.
"""
from __future__ import annotations

import numpy as np

from lite_runtime.distributed.rank_channel import RankChannel


class MirroredSession:
    """Rank 0's session: each `step` is announced to the other ranks before it runs here."""

    def __init__(self, session, channel: RankChannel):
        self.session, self.channel = session, channel

    def __getattr__(self, name):            # manifest, runtime, rank, ... of the wrapped session
        return getattr(self.session, name)

    def step(self, tokens: np.ndarray, counts: np.ndarray, past: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        self.channel.send_json({"step": [a.tolist() for a in (tokens, counts, past, *extra)]})
        return self.session.step(tokens, counts, past, *extra)

    def close(self) -> None:
        try:
            self.channel.send_json({"stop": True})
        finally:
            self.session.close()


def follow(session, channel: RankChannel) -> None:
    """Another rank: run each step rank 0 announces, until it says stop."""
    while True:
        message = channel.recv_json()
        if message.get("stop"):
            return
        session.step(*(np.asarray(a, np.int32) for a in message["step"]))
