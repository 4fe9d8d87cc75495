"""Host-side channel between the ranks of one run: rank 0 sends requests and each step's tokens
to every rank, or a request to one rank and its answer back (data parallel).

Plain TCP on loopback, independent of MindSpore, so it serves the Lite/Ascend path too. Rank 0
listens on `LITE_CHANNEL_PORT` (chosen per launch by the launcher); every other rank connects and
says its rank first.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import time
from typing import List, Optional

import numpy as np

from lite_runtime.contract.errors import DistributedError

_HEADER = struct.Struct("<I")


class RankChannel:
    def __init__(self, rank: int, world_size: int, port: int, timeout: float = 300.0):
        self.rank, self.world_size = rank, world_size
        self._peers: List[socket.socket] = []       # rank 0: ranks 1..N-1, in rank order
        self._sock: Optional[socket.socket] = None
        if rank == 0:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen(world_size)
            server.settimeout(timeout)
            by_rank = {}
            try:
                for _ in range(world_size - 1):
                    conn, _ = server.accept()
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    (peer,) = _HEADER.unpack(_read_from(conn, _HEADER.size, 0))
                    conn.settimeout(None)       # requests may take long; a dead rank closes the socket
                    by_rank[peer] = conn
            except socket.timeout:
                raise DistributedError(f"rank 0: only {len(by_rank)} of {world_size - 1} ranks connected "
                                       f"within {timeout:.0f} s") from None
            finally:
                server.close()
            self._peers = [by_rank[r] for r in sorted(by_rank)]
        else:
            self._sock = _connect(port, timeout)
            self._sock.sendall(_HEADER.pack(rank))

    @classmethod
    def from_env(cls) -> "RankChannel":
        try:
            rank, size = int(os.environ["RANK_ID"]), int(os.environ["RANK_SIZE"])
            port = int(os.environ["LITE_CHANNEL_PORT"])
        except (KeyError, ValueError):
            raise DistributedError("--distributed True must run under the launcher "
                                   "(python -m lite_runtime.distributed.launch --rank_table FILE -- run_infer_main.py ...): "
                                   "RANK_ID, RANK_SIZE and LITE_CHANNEL_PORT are not set") from None
        return cls(rank, size, port)

    # rank 0 -> everyone
    def send_json(self, obj) -> None:
        self._send(json.dumps(obj).encode())

    def send_tokens(self, tokens: np.ndarray) -> None:
        self._send(np.ascontiguousarray(tokens, np.int32).tobytes())

    def send_json_to(self, rank: int, obj) -> None:
        self._send(json.dumps(obj).encode(), [self._peers[rank - 1]])

    def recv_json_from(self, rank: int):
        """Rank 0: the next message of `rank` (its answer to a request sent with send_json_to)."""
        return json.loads(_read_message(self._peers[rank - 1], 0))

    # everyone else
    def recv_json(self):
        return json.loads(self._recv().decode())

    def reply_json(self, obj) -> None:
        payload = json.dumps(obj).encode()
        try:
            self._sock.sendall(_HEADER.pack(len(payload)) + payload)
        except OSError as e:
            raise DistributedError(f"rank {self.rank} lost rank 0: {e}") from None

    def recv_tokens(self) -> np.ndarray:
        return np.frombuffer(self._recv(), np.int32)

    def close(self) -> None:
        for s in self._peers + ([self._sock] if self._sock else []):
            s.close()

    def _send(self, payload: bytes, peers=None) -> None:
        data = _HEADER.pack(len(payload)) + payload
        for peer in self._peers if peers is None else peers:
            try:
                peer.sendall(data)
            except OSError as e:
                raise DistributedError(f"rank 0 lost a peer rank: {e}") from None

    def _recv(self) -> bytes:
        return _read_message(self._sock, self.rank)


def _read_message(sock: socket.socket, rank: int) -> bytes:
    (size,) = _HEADER.unpack(_read_from(sock, _HEADER.size, rank))
    return _read_from(sock, size, rank)


def _read_from(sock: socket.socket, n: int, rank: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise DistributedError(f"rank {rank}: the other end closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _connect(port: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise DistributedError(f"could not reach rank 0 on port {port} within {timeout:.0f} s") from None
            time.sleep(0.1)
