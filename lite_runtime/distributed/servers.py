"""The servers of a rank table: which one this launcher runs, and the link between the launchers
of a job that spans several servers.

Each server runs the launcher for its own ranks (`--server_id`, or the server whose address is one
of this host's). The first server's launcher (the one with rank 0) listens on its address; the
others connect. A launcher whose ranks fail tells the others, which stop theirs and exit naming the
failure; a launcher that vanishes counts as failed.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from typing import Dict, List, Optional, Tuple

from lite_runtime.ascend.rank_table import RankTable, ServerEntry
from lite_runtime.contract.errors import ConfigError, DistributedError


def is_local_address(address: str) -> bool:
    """Whether `address` is one of this host's (a socket can be bound to it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def pick_server(table: RankTable, server_id: Optional[str]) -> Tuple[ServerEntry, str]:
    """The server this launcher runs and how it was chosen."""
    ids = ", ".join(s.server_id for s in table.servers)
    if server_id is not None:
        chosen = [s for s in table.servers if s.server_id == server_id]
        if not chosen:
            raise ConfigError(f"--server_id {server_id} is not a server of rank table {table.path}; its server ids: {ids}")
        return chosen[0], "--server_id"
    if len(table.servers) == 1:
        return table.servers[0], "the only server of the rank table"
    local = [s for s in table.servers if is_local_address(s.server_id)]
    if len(local) != 1:
        which = "none of" if not local else f"{len(local)} of"
        raise ConfigError(f"{which} the servers of rank table {table.path} ({ids}) are addresses of this host; "
                          "give --server_id ID, one of them, on each server")
    return local[0], "this host's address"


def rank_hosts(table: RankTable) -> List[str]:
    """Per rank, the address its listeners use: its server's, or loopback when the table has one server."""
    if len(table.servers) == 1:
        return ["127.0.0.1"] * len(table.ranks)
    return [r.server_id for r in table.ranks]


class LauncherLink:
    """The launchers of a multi-server job, joined through the first server's: `watch()` raises
    when another launcher reported a failure (or vanished); `report()` tells them this one's."""

    def __init__(self, server_id: str, servers: List[str], hub: Tuple[str, int], timeout: float):
        self.server_id, self.first = server_id, servers[0]
        self.failure: Optional[str] = None
        self._done: Dict[str, bool] = {s: False for s in servers[1:]}
        self._peers: Dict[str, socket.socket] = {}
        self._lock = threading.Lock()
        self._connected = threading.Event()      # first server: all others connected; others: it is reached
        self._deadline = time.monotonic() + (timeout or float("inf"))     # 0: no limit
        if server_id == self.first:
            self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                self._server.bind(hub)
            except OSError as e:
                raise ConfigError(f"the launcher of the first server cannot listen on {hub[0]}:{hub[1]} ({e.strerror});"
                                  " choose another --master_port on every server") from None
            self._server.listen(len(servers))
            threading.Thread(target=self._accept, args=(len(servers) - 1,), daemon=True).start()
        else:
            threading.Thread(target=self._connect, args=(hub,), daemon=True).start()

    def watch(self) -> None:
        if self.failure is not None:
            raise DistributedError(self.failure)

    def report(self, message: str) -> None:
        """This launcher's ranks failed with `message`: tell the other launchers (waiting a little for
        those that have not connected yet)."""
        self._connected.wait(10)
        self._send_all({"failed": f"server {self.server_id}: {message}"})

    def finish(self) -> None:
        """This launcher's ranks all ended well. The first server's launcher waits for the others'."""
        if self.server_id != self.first:
            while not self._connected.wait(0.1):
                self.watch()
                if time.monotonic() > self._deadline:
                    raise DistributedError(f"could not reach the launcher of server {self.first}")
            self._send_all({"done": True})
            return
        while not all(self._done.values()):
            self.watch()
            if time.monotonic() > self._deadline:
                waiting = ", ".join(s for s, d in self._done.items() if not d)
                raise DistributedError(f"the launchers of server(s) {waiting} did not finish in time")
            time.sleep(0.1)
        self.watch()

    def close(self) -> None:
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for s in peers:
            s.close()
        if self.server_id == self.first:
            self._server.close()

    # --- threads -------------------------------------------------------------------------------
    def _accept(self, count: int) -> None:
        for _ in range(count):
            try:
                conn, _ = self._server.accept()
            except OSError:
                return      # closed
            threading.Thread(target=self._read, args=(conn, None), daemon=True).start()

    def _connect(self, hub: Tuple[str, int]) -> None:
        while True:
            try:
                sock = socket.create_connection(hub, timeout=5)
                sock.settimeout(None)
                break
            except OSError:
                if time.monotonic() > self._deadline:
                    self._fail(f"could not reach the launcher of server {self.first} at {hub[0]}:{hub[1]}")
                    return
                time.sleep(0.2)
        with self._lock:
            self._peers[self.first] = sock
        _write(sock, {"server": self.server_id})
        self._connected.set()
        self._read(sock, self.first)

    def _read(self, sock: socket.socket, peer: Optional[str]) -> None:
        try:
            with sock.makefile("r", encoding="utf-8") as lines:
                for line in lines:
                    message = json.loads(line)
                    if "server" in message:      # a newcomer says who it is
                        peer = message["server"]
                        with self._lock:
                            self._peers[peer] = sock
                            if len(self._peers) == len(self._done):
                                self._connected.set()
                    elif message.get("done"):
                        self._done[peer] = True
                        return
                    elif "failed" in message:
                        self._fail(message["failed"], relay=True)
                        return
        except (OSError, ValueError):     # closed here, or not a launcher talking
            pass
        if not self._done.get(peer, False):
            self._fail(f"lost the launcher of server {peer}")

    def _fail(self, message: str, relay: bool = False) -> None:
        with self._lock:
            first = self.failure is None
            if first:
                self.failure = message
        if first and relay and self.server_id == self.first:
            self._send_all({"failed": message})

    def _send_all(self, message: dict) -> None:
        with self._lock:
            peers = list(self._peers.values())
        for sock in peers:
            try:
                _write(sock, message)
            except OSError:
                pass        # that launcher is gone; it reports itself


def _write(sock: socket.socket, message: dict) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())
