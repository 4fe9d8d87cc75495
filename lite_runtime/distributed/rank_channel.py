"""Host-side channel between the ranks of one run: rank 0 sends requests and each step's tokens.

Plain TCP on loopback, independent of MindSpore, so it serves the Lite/Ascend path too. Rank 0
listens on `LITE_CHANNEL_PORT` (chosen per launch by the launcher); every other rank connects.
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
        self._peers: List[socket.socket] = []
        self._sock: Optional[socket.socket] = None
        if rank == 0:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen(world_size)
            server.settimeout(timeout)
            try:
                for _ in range(world_size - 1):
                    conn, _ = server.accept()
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._peers.append(conn)
            except socket.timeout:
                raise DistributedError(f"rank 0: only {len(self._peers)} of {world_size - 1} ranks connected "
                                       f"within {timeout:.0f} s") from None
            finally:
                server.close()
        else:
            self._sock = _connect(port, timeout)

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

    # everyone else
    def recv_json(self):
        return json.loads(self._recv().decode())

    def recv_tokens(self) -> np.ndarray:
        return np.frombuffer(self._recv(), np.int32)

    def close(self) -> None:
        for s in self._peers + ([self._sock] if self._sock else []):
            s.close()

    def _send(self, payload: bytes) -> None:
        data = _HEADER.pack(len(payload)) + payload
        for peer in self._peers:
            try:
                peer.sendall(data)
            except OSError as e:
                raise DistributedError(f"rank 0 lost a peer rank: {e}") from None

    def _recv(self) -> bytes:
        (size,) = _HEADER.unpack(self._read(_HEADER.size))
        return self._read(size)

    def _read(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            chunk = self._sock.recv(n - got)
            if not chunk:
                raise DistributedError(f"rank {self.rank}: rank 0 closed the channel")
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
