"""The one protocol of multi-rank runs: rank 0 samples, the other ranks replay its session calls.

A replica of an mp-rank export is mp processes, each holding its part of the model. Rank 0 drives
every replica like a one-rank session: every `prefill`, `decode`, `step` or `verify` call (their arrays
fix what every rank computes) is sent to the replica's ranks before it runs, and each of them runs
the same call on its part; the collectives inside the call (MPI between Lite segments, a MindSpore
cluster on `ms`) join the parts. Its own replica's session is a `MirroredSession`; another replica's
is a `RemoteSession`, whose first rank answers each call with the logits. Only rank 0 chooses tokens,
so the ranks need no agreement of their own. A request ends with a message that `follow` returns:
`{"answers": ...}` (a script on every rank gets rank 0's answers), `{"error": ...}` or `{"stop": true}`.
"""
from __future__ import annotations

import struct
from typing import List, Sequence, Tuple

import numpy as np

from lite_runtime.distributed.rank_channel import RankChannel

CALLS = ("prefill", "decode", "step", "verify")


def _message(call: str, arrays) -> dict:
    arrays = [np.asarray(a) for a in arrays]
    return {"call": call, "args": [[a.dtype.str, list(a.shape), a.ravel().tolist()] for a in arrays]}


def _arrays(message: dict) -> List[np.ndarray]:
    return [np.asarray(data, np.dtype(dtype)).reshape(shape) for dtype, shape, data in message["args"]]


class MirroredSession:
    """Rank 0's session of its own replica: each call also runs on the replica's other `ranks`."""

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
    """The session of the replica on `ranks` (data parallel), as rank 0 sees it: its first rank answers
    each call with the logits."""

    def __init__(self, manifest, channel: RankChannel, ranks: Sequence[int]):
        self.manifest, self.channel, self.ranks = manifest, channel, list(ranks)
        self.runtime = f"ranks {self.ranks[0]}-{self.ranks[-1]}" if len(self.ranks) > 1 else f"rank {self.ranks[0]}"

    def prefill(self, *arrays: np.ndarray) -> np.ndarray:
        return self._remote("prefill", arrays)

    def decode(self, *arrays: np.ndarray) -> np.ndarray:
        return self._remote("decode", arrays)

    def step(self, *arrays: np.ndarray) -> np.ndarray:
        return self._remote("step", arrays)

    def verify(self, *arrays: np.ndarray) -> np.ndarray:
        return self._remote("verify", arrays)

    def _remote(self, call: str, arrays) -> np.ndarray:
        self.channel.send_json_to(self.ranks, _message(call, arrays))
        return _unpack_logits(self.channel.recv_bytes_from(self.ranks[0]))

    def close(self) -> None:
        self.channel.send_json_to(self.ranks, {"stop": True})


def replica_sessions(session, channel: RankChannel, model_ranks: int) -> list:
    """Rank 0's session of each replica on `channel` (consecutive groups of `model_ranks` ranks): its
    own, mirrored to its replica's other ranks, then one `RemoteSession` per other replica."""
    own = MirroredSession(session, channel, range(1, model_ranks)) if model_ranks > 1 else session
    return [own] + [RemoteSession(session.manifest, channel, range(first, first + model_ranks))
                    for first in range(model_ranks, channel.world_size, model_ranks)]


def _pack_logits(logits: np.ndarray) -> bytes:
    """Raw float32 after the shape (JSON was far too slow: docs/measured-choices.md)."""
    logits = np.ascontiguousarray(logits, np.float32)
    return struct.pack(f"<I{logits.ndim}Q", logits.ndim, *logits.shape) + logits.tobytes()


def _unpack_logits(payload: bytes) -> np.ndarray:
    (ndim,) = struct.unpack_from("<I", payload)
    shape = struct.unpack_from(f"<{ndim}Q", payload, 4)
    return np.frombuffer(payload, np.float32, offset=4 + 8 * ndim).reshape(shape)


def follow(session, channel: RankChannel, reply: bool) -> Tuple[int, dict]:
    """A rank other than 0: run each call rank 0 sends, answering with the logits when `reply` (the
    first rank of another replica), until a message that is not a call; returns the number of calls
    and that message (answers, an error or stop)."""
    calls = 0
    while True:
        message = channel.recv_json()
        if "call" not in message:
            return calls, message
        if message["call"] not in CALLS:
            raise ValueError(f"a rank was sent {message!r}; expected one of {', '.join(CALLS)}, answers, error "
                             "or stop")
        calls += 1
        logits = getattr(session, message["call"])(*_arrays(message))
        if reply:
            channel.reply_bytes(_pack_logits(logits))
