"""Writing HCCL rank tables: one server's table (as upstream hccl_tools.py makes it) and the merge of
several servers' tables (as upstream merge_hccl.py does). CLI: lite_runtime/cli/rank_table.py.

A server's table: logical index i of the --device_num range uses physical device visible_devices[i];
its device IP is looked up by that physical id. Device IPs come from, in order: --device_ips when
given, --hccn_conf when given, `hccn_tool -i N -ip -g` when that binary is on PATH, else
/etc/hccn.conf (`address_N=IP`). The file is hccl_{n}p_{ids}_{server_ip}.json, ids being the physical
device ids used, concatenated. A merge keeps the servers in the order of the files, renumbers the
ranks 0..N-1 in that order and writes hccl_{S}s_{N}p.json (S servers, N ranks).
"""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import shutil
import socket
import subprocess
from typing import Dict, List, Optional, Sequence

from lite_runtime.ascend.rank_table import (RankEntry, ServerEntry, load_rank_table, merge_rank_tables, table_json,
                                            validate_rank_table)
from lite_runtime.contract.errors import ConfigError

logger = logging.getLogger(__name__)
DEFAULT_HCCN_CONF = "/etc/hccn.conf"


def parse_device_range(text: str) -> range:
    """`[0,8)` -> range(0, 8); any number of digits."""
    m = re.fullmatch(r"\s*\[\s*(\d+)\s*,\s*(\d+)\s*\)\s*", text)
    if not m:
        raise ConfigError(f"--device_num {text!r} is not a half-open range like \"[0,8)\" or \"[8,16)\"")
    start, end = int(m.group(1)), int(m.group(2))
    if end <= start:
        raise ConfigError(f"--device_num {text!r} is empty; the end must be larger than the start")
    return range(start, end)


def parse_visible_devices(text: str) -> List[int]:
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items or not all(v.isdigit() for v in items):
        raise ConfigError(f"--visible_devices {text!r} must be a comma list of device ids, e.g. \"0,1,2,3\"")
    ids = [int(v) for v in items]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"--visible_devices {text!r} lists a device twice")
    return ids


def select_devices(devices: range, visible: Sequence[int], per_node: int) -> List[int]:
    """Physical device ids of the logical range, checked to fit in one node of `per_node` devices."""
    if per_node < 1:
        raise ConfigError(f"--device_num_per_node {per_node} must be at least 1")
    if devices.stop > len(visible):
        raise ConfigError(f"--device_num [{devices.start},{devices.stop}) needs {devices.stop} visible devices "
                          f"but --visible_devices lists {len(visible)}: {','.join(map(str, visible))}")
    if len(devices) > per_node or devices.start // per_node != (devices.stop - 1) // per_node:
        first = devices.start // per_node * per_node
        raise ConfigError(f"--device_num [{devices.start},{devices.stop}) does not fit in one node of "
                          f"--device_num_per_node {per_node} devices; allowed: a range inside "
                          f"[{first},{first + per_node})")
    return [visible[i] for i in devices]


def read_hccn_conf(path: str) -> Dict[int, str]:
    """`address_N=IP` lines of an hccn.conf file -> {N: IP}."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read device IPs from {path}: {e.strerror}") from None
    ips: Dict[int, str] = {}
    for number, line in enumerate(lines, 1):
        m = re.fullmatch(r"\s*address_(\d+)\s*=\s*(\S+)\s*", line)
        if m:
            ips[int(m.group(1))] = _check_ip(m.group(2), f"{path}: line {number}: address_{m.group(1)}")
    return ips


def query_hccn_tool(tool: str, device_id: int) -> str:
    try:
        out = subprocess.run([tool, "-i", str(device_id), "-ip", "-g"], capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"`{tool} -i {device_id} -ip -g` failed: {e}") from None
    m = re.search(r"ipaddr\s*:\s*(\S+)", out.stdout)
    if out.returncode != 0 or not m:
        detail = (out.stderr or out.stdout).strip().splitlines()
        raise ConfigError(f"`{tool} -i {device_id} -ip -g` gave no ipaddr (exit {out.returncode}: "
                          f"{detail[0] if detail else 'no output'}); pass --device_ips instead")
    return _check_ip(m.group(1), f"hccn_tool device {device_id}")


def parse_device_ips(value: str, devices: Sequence[int]) -> Dict[int, str]:
    """--device_ips: an hccn.conf-style file, or one IP per used device in order."""
    if os.path.isfile(value):
        return read_hccn_conf(value)
    ips = [v.strip() for v in value.split(",") if v.strip()]
    if len(ips) != len(devices):
        raise ConfigError(f"--device_ips has {len(ips)} IP(s) for {len(devices)} device(s) "
                          f"({','.join(map(str, devices))}); give one IP per device, or an hccn.conf file")
    return {d: _check_ip(ip, f"--device_ips entry {i}") for i, (d, ip) in enumerate(zip(devices, ips))}


def collect_device_ips(devices: Sequence[int], device_ips: Optional[str] = None,
                       hccn_conf: Optional[str] = None, hccn_tool: Optional[str] = None) -> Dict[int, str]:
    """Device IP of each physical device; see the module docstring for the order of sources."""
    if device_ips:
        table, source = parse_device_ips(device_ips, devices), "--device_ips"
    elif hccn_conf:
        table, source = read_hccn_conf(hccn_conf), hccn_conf
    elif hccn_tool:
        return {d: query_hccn_tool(hccn_tool, d) for d in devices}
    elif os.path.isfile(DEFAULT_HCCN_CONF):
        table, source = read_hccn_conf(DEFAULT_HCCN_CONF), DEFAULT_HCCN_CONF
    else:
        raise ConfigError(f"no device IPs: hccn_tool is not on PATH and {DEFAULT_HCCN_CONF} does not exist; "
                          "pass --device_ips IP,IP,... or --hccn_conf FILE")
    missing = [d for d in devices if d not in table]
    if missing:
        raise ConfigError(f"{source} has no IP for device(s) {','.join(map(str, missing))} "
                          f"(looked up by physical id: address_{missing[0]}=IP)")
    return {d: table[d] for d in devices}


def build_server_table(server_ip: str, devices: Sequence[int], ips: Dict[int, str]) -> dict:
    _check_ip(server_ip, "--server_ip")
    ranks = tuple(RankEntry(rank, server_ip, d, ips[d]) for rank, d in enumerate(devices))
    data = table_json([ServerEntry(server_ip, ranks)])
    validate_rank_table(data, "generated rank table")
    return data


def table_file_name(devices: Sequence[int], server_ip: str) -> str:
    return f"hccl_{len(devices)}p_{''.join(map(str, devices))}_{server_ip}.json"


def write_table(data: dict, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=4)
        f.write("\n")
    return path


def _check_ip(text: str, where: str) -> str:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not a valid IP address") from None
    return text


def _default_server_ip() -> str:
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError as e:
        raise ConfigError(f"cannot find this host's IP ({e}); pass --server_ip") from None
    logger.info("--server_ip not given; using %s (the IP of host %s)", ip, socket.gethostname())
    return ip


def make_rank_table(device_num: str = "[0,8)", visible_devices: str = "0,1,2,3,4,5,6,7",
                    server_ip: Optional[str] = None, device_num_per_node: int = 8, device_ips: Optional[str] = None,
                    hccn_conf: Optional[str] = None, output_dir: str = ".") -> str:
    """Write this server's table into `output_dir`; returns its path."""
    devices = select_devices(parse_device_range(device_num), parse_visible_devices(visible_devices),
                             device_num_per_node)
    hccn_tool = None if hccn_conf else shutil.which("hccn_tool")
    ips = collect_device_ips(devices, device_ips, hccn_conf, hccn_tool)
    server_ip = server_ip or _default_server_ip()
    data = build_server_table(server_ip, devices, ips)
    return write_table(data, os.path.join(output_dir, table_file_name(devices, server_ip)))


def merge_files(paths: Sequence[str], output_dir: str = ".") -> str:
    """Merge the tables of `paths` into `output_dir`; returns the merged table's path."""
    data = merge_rank_tables([load_rank_table(p) for p in paths])
    name = f"hccl_{data['server_count']}s_{sum(len(s['device']) for s in data['server_list'])}p.json"
    return write_table(data, os.path.join(output_dir, name))
