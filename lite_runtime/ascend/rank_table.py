"""HCCL rank tables (version "1.0"): load, validate, build and merge.

Format (every value a string):
  {"version": "1.0", "server_count": "N", "status": "completed",
   "server_list": [{"server_id": IP, "host_nic_ip": "reserve",
                    "device": [{"device_id": "0", "device_ip": IP, "rank_id": "0"}, ...]}, ...]}
Rank ids must be exactly 0..N-1 over the whole table; HCCL maps rank r to the process that
sets RANK_ID=r, so a gap or a repeat hangs or crashes the job much later and far away.

Making and merging tables: rank_table_writer.py. CLI (lite_runtime/cli/rank_table.py, console script
lite-rank-table): make | merge | check.
"""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from lite_runtime.contract.errors import ConfigError

SUPPORTED_VERSIONS = ("1.0",)
TOP_KEYS = ("version", "server_count", "server_list", "status")
DEVICE_KEYS = ("device_id", "device_ip", "rank_id")


@dataclass(frozen=True)
class RankEntry:
    rank_id: int
    server_id: str
    device_id: int
    device_ip: str


@dataclass(frozen=True)
class ServerEntry:
    server_id: str
    ranks: Tuple[RankEntry, ...]          # in the order the file lists them
    host_nic_ip: str = "reserve"


@dataclass(frozen=True)
class RankTable:
    path: str
    version: str
    servers: Tuple[ServerEntry, ...]
    ranks: Tuple[RankEntry, ...]          # ordered by rank_id: ranks[r].rank_id == r

    def to_json(self) -> dict:
        return table_json(self.servers, self.version)

    def summary(self) -> str:
        lines = [f"{self.path}: version {self.version}, {len(self.servers)} server(s), "
                 f"{len(self.ranks)} rank(s)"]
        for s in self.servers:
            lines.append(f"  server {s.server_id}: {len(s.ranks)} device(s)")
            lines += [f"    rank {r.rank_id}: device {r.device_id}, device_ip {r.device_ip}" for r in s.ranks]
        return "\n".join(lines)


def table_json(servers: Sequence[ServerEntry], version: str = "1.0") -> dict:
    """The upstream JSON form (all values strings) of a list of servers."""
    return {
        "version": version,
        "server_count": str(len(servers)),
        "server_list": [{
            "device": [{"device_id": str(r.device_id), "device_ip": r.device_ip, "rank_id": str(r.rank_id)}
                       for r in s.ranks],
            "server_id": s.server_id,
            "host_nic_ip": s.host_nic_ip,
        } for s in servers],
        "status": "completed",
    }


def load_rank_table(path: str) -> RankTable:
    """Read and validate a rank table file; every mistake is a ConfigError naming file and entry."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"rank table {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"cannot read rank table {path}: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: line {e.lineno}: not valid JSON ({e.msg}); "
                          "a rank table is a JSON object as written by tools/hccl_tools.py") from None
    return validate_rank_table(data, path)


def validate_rank_table(data: object, source: str = "rank table") -> RankTable:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a JSON object with keys {', '.join(TOP_KEYS)}, "
                          f"got {type(data).__name__}")
    missing = [k for k in TOP_KEYS if k not in data]
    if missing:
        raise ConfigError(f"{source}: missing key(s) {', '.join(missing)}; required: {', '.join(TOP_KEYS)}")
    version = _string(data["version"], source, "version")
    if version not in SUPPORTED_VERSIONS:
        raise ConfigError(f"{source}: version {version!r} is not supported; allowed: "
                          f"{', '.join(SUPPORTED_VERSIONS)}")
    status = _string(data["status"], source, "status")
    if status != "completed":
        raise ConfigError(f"{source}: status {status!r} must be 'completed' (the table is not finished)")
    server_list = data["server_list"]
    if not isinstance(server_list, list) or not server_list:
        raise ConfigError(f"{source}: server_list must be a non-empty list of servers")
    server_count = _count(data["server_count"], source, "server_count")
    if server_count != len(server_list):
        raise ConfigError(f"{source}: server_count is {server_count} but server_list has "
                          f"{len(server_list)} server(s)")
    servers = []
    seen_servers: Dict[str, int] = {}
    seen_ips: Dict[str, str] = {}
    by_rank: Dict[int, Tuple[RankEntry, str]] = {}
    for si, server in enumerate(server_list):
        where = f"{source}: server_list[{si}]"
        servers.append(_server(server, where, seen_servers, seen_ips, by_rank, si))
    expected = list(range(len(by_rank)))
    if sorted(by_rank) != expected:
        gaps = sorted(set(expected) - set(by_rank))
        raise ConfigError(f"{source}: rank ids must be 0..{len(by_rank) - 1} without gaps; "
                          f"got {sorted(by_rank)} (missing {gaps})")
    ranks = tuple(by_rank[r][0] for r in expected)
    return RankTable(source, version, tuple(servers), ranks)


def _server(server: object, where: str, seen_servers: Dict[str, int], seen_ips: Dict[str, str],
            by_rank: Dict[int, Tuple[RankEntry, str]], index: int) -> ServerEntry:
    if not isinstance(server, dict):
        raise ConfigError(f"{where}: must be an object with keys server_id, device")
    for key in ("server_id", "device"):
        if key not in server:
            raise ConfigError(f"{where}: missing key {key!r}; required: server_id, device")
    server_id = _ip(server["server_id"], where, "server_id")
    if server_id in seen_servers:
        raise ConfigError(f"{where}: server_id {server_id} already listed as server_list"
                          f"[{seen_servers[server_id]}]; each server appears once")
    seen_servers[server_id] = index
    devices = server["device"]
    if not isinstance(devices, list) or not devices:
        raise ConfigError(f"{where}: device must be a non-empty list")
    entries = []
    seen_devices: Dict[int, int] = {}
    for di, dev in enumerate(devices):
        dwhere = f"{where}.device[{di}]"
        if not isinstance(dev, dict):
            raise ConfigError(f"{dwhere}: must be an object with keys {', '.join(DEVICE_KEYS)}")
        missing = [k for k in DEVICE_KEYS if k not in dev]
        if missing:
            raise ConfigError(f"{dwhere}: missing key(s) {', '.join(missing)}; required: {', '.join(DEVICE_KEYS)}")
        device_id = _count(dev["device_id"], dwhere, "device_id")
        if device_id in seen_devices:
            raise ConfigError(f"{dwhere}: device_id {device_id} repeats device[{seen_devices[device_id]}] "
                              f"of server {server_id}")
        seen_devices[device_id] = di
        device_ip = _ip(dev["device_ip"], dwhere, "device_ip")
        if device_ip in seen_ips:
            raise ConfigError(f"{dwhere}: device_ip {device_ip} is already used by {seen_ips[device_ip]}")
        seen_ips[device_ip] = dwhere.split(": ", 1)[-1]
        rank_id = _count(dev["rank_id"], dwhere, "rank_id")
        if rank_id in by_rank:
            raise ConfigError(f"{dwhere}: rank_id {rank_id} is already used by {by_rank[rank_id][1]}")
        entry = RankEntry(rank_id, server_id, device_id, device_ip)
        by_rank[rank_id] = (entry, dwhere.split(": ", 1)[-1])
        entries.append(entry)
    host_nic_ip = server.get("host_nic_ip", "reserve")
    return ServerEntry(server_id, tuple(entries), str(host_nic_ip))


def _string(value: object, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a JSON string (all rank table values are strings), "
                          f"got {json.dumps(value)}")
    return value


def _count(value: object, where: str, key: str) -> int:
    text = _string(value, where, key)
    if not text.isdigit() or not text.isascii():
        raise ConfigError(f"{where}: {key} {text!r} must be a non-negative integer written as a string, e.g. \"0\"")
    return int(text)


def _ip(value: object, where: str, key: str) -> str:
    text = _string(value, where, key)
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise ConfigError(f"{where}: {key} {text!r} is not a valid IP address") from None
    return text


def merge_rank_tables(tables: Sequence[RankTable]) -> dict:
    """Concatenate the servers of several tables and renumber rank ids 0..N-1 in order.

    Refuses a server listed twice and a device_ip used twice (the validator of the result
    reports those with the merged position; here we name the source files).
    """
    if not tables:
        raise ConfigError("nothing to merge: give at least one rank table")
    servers: List[ServerEntry] = []
    origin: Dict[str, str] = {}
    ip_origin: Dict[str, str] = {}
    next_rank = 0
    for table in tables:
        for server in table.servers:
            if server.server_id in origin:
                raise ConfigError(f"server {server.server_id} is in both {origin[server.server_id]} and "
                                  f"{table.path}; each server may appear once")
            origin[server.server_id] = table.path
            ranks = []
            for r in sorted(server.ranks, key=lambda e: e.rank_id):
                if r.device_ip in ip_origin:
                    raise ConfigError(f"device_ip {r.device_ip} (server {server.server_id}, device "
                                      f"{r.device_id}) in {table.path} is already used in {ip_origin[r.device_ip]}")
                ip_origin[r.device_ip] = table.path
                ranks.append(RankEntry(next_rank, server.server_id, r.device_id, r.device_ip))
                next_rank += 1
            servers.append(ServerEntry(server.server_id, tuple(ranks), server.host_nic_ip))
    data = table_json(servers, tables[0].version)
    validate_rank_table(data, "merged rank table")
    return data

