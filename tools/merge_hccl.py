"""Merge per-server HCCL rank tables into one: python tools/merge_hccl.py a.json b.json [--output_dir DIR]

Servers keep the order of the files; rank ids are renumbered 0..N-1 in that order. Writes
hccl_{S}s_{N}p.json (S servers, N ranks) and prints its path.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Optional, Sequence

try:
    from lite_runtime.cli.cli_common import OneLineParser, report_errors
except ImportError:                       # run as `python tools/merge_hccl.py` from a checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from lite_runtime.cli.cli_common import OneLineParser, report_errors
from lite_runtime.ascend.rank_table import load_rank_table, merge_rank_tables


def merge_files(paths: Sequence[str], output_dir: str = ".") -> str:
    data = merge_rank_tables([load_rank_table(p) for p in paths])
    name = f"hccl_{data['server_count']}s_{sum(len(s['device']) for s in data['server_list'])}p.json"
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=4)
        f.write("\n")
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineParser(prog="merge_hccl.py", description="Merge per-server HCCL rank tables.")
    parser.add_argument("files", nargs="+", metavar="FILE", help="rank tables, one or more servers each")
    parser.add_argument("--output_dir", default=".")
    args = parser.parse_args(argv)
    return report_errors(lambda: print(merge_files(args.files, args.output_dir)))


if __name__ == "__main__":
    sys.exit(main())
