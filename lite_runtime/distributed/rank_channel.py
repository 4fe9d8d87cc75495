"""Host-side channel between the ranks of one run: rank 0 sends each session call to the ranks that
run it, and a replica's first rank sends back the logits (mirrored.py).

Plain TCP, independent of MindSpore, so it serves the Lite/Ascend path too. Rank 0 of a channel
listens on the address the launcher gives as `host:port` (its server's address; 127.0.0.1 when the
rank table has one server); every other rank connects and says its rank first. A channel's ranks
may be a group of the job's ranks (a replica's MPI join, host_collectives.py): `names` are their job
ranks, for messages.
"""
from __future__ import annotations

import json
import os
import socket
import struct
import time
from typing import List, Optional, Sequence, Tuple

from lite_runtime.contract.errors import DistributedError

_HEADER = struct.Struct("<I")


CHANNEL_ENV = "LITE_CHANNEL"     # host:port of the job's rank 0


def parse_address(text: str, variable: str) -> Tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise DistributedError(f"${variable} {text!r} is not host:port (set by the launcher)")
    return host, int(port)


class RankChannel:
    def __init__(self, rank: int, world_size: int, address: Tuple[str, int], timeout: float = 300.0,
                 names: Optional[Sequence[int]] = None):
        self.rank, self.world_size = rank, world_size
        self.names = list(names) if names is not None else list(range(world_size))
        host, port = address
        self._peers: List[socket.socket] = []       # rank 0: ranks 1..N-1, in rank order
        self._sock: Optional[socket.socket] = None
        if rank == 0:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((host, port))
            server.listen(world_size)
            server.settimeout(timeout)
            by_rank = {}
            try:
                for _ in range(world_size - 1):
                    conn, _ = server.accept()
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    (peer,) = _HEADER.unpack(_read_from(conn, _HEADER.size, "a connecting rank"))
                    conn.settimeout(None)       # requests may take long; a dead rank closes the socket
                    by_rank[peer] = conn
            except socket.timeout:
                missing = [str(self.names[r]) for r in range(1, world_size) if r not in by_rank]
                raise DistributedError(f"rank {self.names[0]}: rank(s) {', '.join(missing)} did not connect to "
                                       f"{host}:{port} within {timeout:.0f} s") from None
            finally:
                server.close()
            self._peers = [by_rank[r] for r in sorted(by_rank)]
        else:
            self._sock = _connect(host, port, timeout, self.names[0])
            self._sock.sendall(_HEADER.pack(rank))

    @classmethod
    def from_env(cls) -> "RankChannel":
        try:
            rank, size = int(os.environ["RANK_ID"]), int(os.environ["RANK_SIZE"])
            address = os.environ[CHANNEL_ENV]
        except (KeyError, ValueError):
            raise DistributedError("--distributed True must run under the launcher "
                                   "(python -m lite_runtime.cli.launch --rank_table FILE -- run_infer_main.py ...): "
                                   f"RANK_ID, RANK_SIZE and {CHANNEL_ENV} are not set") from None
        return cls(rank, size, parse_address(address, CHANNEL_ENV))

    # rank 0 -> everyone
    def send_json(self, obj) -> None:
        self._send(json.dumps(obj).encode())

    def send_json_to(self, ranks, obj) -> None:
        """To one rank, or to each of a sequence of ranks."""
        self._send(json.dumps(obj).encode(), [ranks] if isinstance(ranks, int) else ranks)

    def recv_bytes_from(self, rank: int) -> bytes:
        """Rank 0: the next message of `rank` (its answer to a call sent with send_json_to)."""
        return _read_message(self._peers[rank - 1], self._lost(rank))

    # everyone else
    def recv_json(self):
        return json.loads(self._recv().decode())

    def reply_bytes(self, payload: bytes) -> None:
        try:
            self._sock.sendall(_HEADER.pack(len(payload)) + payload)
        except OSError as e:
            raise DistributedError(f"{self._lost(0)}: {e}") from None

    def close(self) -> None:
        for s in self._peers + ([self._sock] if self._sock else []):
            s.close()

    def _lost(self, peer: int) -> str:
        return f"rank {self.names[self.rank]} lost rank {self.names[peer]}"

    def _send(self, payload: bytes, peers=None) -> None:
        data = _HEADER.pack(len(payload)) + payload
        for peer in range(1, self.world_size) if peers is None else peers:
            try:
                self._peers[peer - 1].sendall(data)
            except OSError as e:
                raise DistributedError(f"{self._lost(peer)}: {e}") from None

    def _recv(self) -> bytes:
        return _read_message(self._sock, self._lost(0))


def _read_message(sock: socket.socket, lost: str) -> bytes:
    (size,) = _HEADER.unpack(_read_from(sock, _HEADER.size, lost))
    return _read_from(sock, size, lost)


def _read_from(sock: socket.socket, n: int, lost: str) -> bytes:
    chunks, got = [], 0
    while got < n:
        try:
            chunk = sock.recv(n - got)
        except OSError as e:
            raise DistributedError(f"{lost}: {e}") from None
        if not chunk:
            raise DistributedError(f"{lost}: the channel closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _connect(host: str, port: int, timeout: float, leader: int) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise DistributedError(f"could not reach rank {leader} at {host}:{port} within {timeout:.0f} s") from None
            time.sleep(0.1)
