"""The one protocol of multi-rank runs: the first rank of a replica samples, the others replay its
session calls.

A replica of an mp-rank export is mp processes, each holding its part of the model. The replica's
first rank drives it like a one-rank session: every `prefill`, `decode`, `step` or `verify` call (their
arrays fix what every rank computes) is sent to the replica's other ranks before it runs its own
part, and each of them runs the same call on its part; the collectives inside the call (MPI
between Lite segments, a MindSpore cluster on `ms`) join the parts. Only the first rank chooses
tokens, so the ranks need no agreement of their own. With data parallel, rank 0 also drives the
other replicas' first ranks through `RemoteSession`s, which answer each step with its logits.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np

from lite_runtime.distributed.rank_channel import RankChannel

CALLS = ("prefill", "decode", "step", "verify")


def _message(call: str, arrays) -> dict:
    arrays = [np.asarray(a) for a in arrays]
    return {"call": call, "args": [[a.dtype.str, list(a.shape), a.ravel().tolist()] for a in arrays]}


def _arrays(message: dict) -> List[np.ndarray]:
    return [np.asarray(data, np.dtype(dtype)).reshape(shape) for dtype, shape, data in message["args"]]


class MirroredSession:
    """A replica's first rank's session: each call also runs on the replica's other `ranks`."""

    def __init__(self, session, channel: RankChannel, ranks: Sequence[int]):
        self.session, self.channel, self.ranks = session, channel, list(ranks)

    def __getattr__(self, name):            # manifest, runtime, rank, ... of the wrapped session
        return getattr(self.session, name)

    def _mirrored(self, call: str, *arrays: np.ndarray) -> np.ndarray:
        self.channel.send_json_to(self.ranks, _message(call, arrays))
        return getattr(self.session, call)(*arrays)

    def prefill(self, *arrays: np.ndarray) -> np.ndarray:
        return self._mirrored("prefill", *arrays)

    def decode(self, *arrays: np.ndarray) -> np.ndarray:
        return self._mirrored("decode", *arrays)

    def step(self, *arrays: np.ndarray) -> np.ndarray:
        return self._mirrored("step", *arrays)

    def verify(self, *arrays: np.ndarray) -> np.ndarray:
        return self._mirrored("verify", *arrays)

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

    def step(self, *arrays: np.ndarray) -> np.ndarray:
        return self._remote("step", arrays, len(arrays[0]))

    def verify(self, *arrays: np.ndarray) -> np.ndarray:
        return self._remote("verify", arrays, int(np.sum(arrays[3])))      # sum(picks) rows

    def _remote(self, call: str, arrays, rows: int) -> np.ndarray:
        self.channel.send_json_to(self.ranks, _message(call, arrays))
        return np.frombuffer(self.channel.recv_bytes_from(self.ranks[0]), np.float32).reshape(rows, -1)

    def close(self) -> None:
        self.channel.send_json_to(self.ranks, {"stop": True})


def follow(session, channel: RankChannel, reply: bool) -> int:
    """A rank other than the driving one: run each call it sends, answering with the logits when
    `reply` (the first rank of another replica), until it says stop; returns the number of calls."""
    calls = 0
    while True:
        message = channel.recv_json()
        if message.get("stop"):
            return calls
        if message.get("call") not in CALLS:
            raise ValueError(f"a rank was sent {message!r}; expected one of {', '.join(CALLS)} or stop")
        calls += 1
        logits = getattr(session, message["call"])(*_arrays(message))
        if reply:        # raw float32: JSON of 8 x 32000 logits took 217 ms a step
            channel.reply_bytes(np.ascontiguousarray(logits, np.float32).tobytes())
