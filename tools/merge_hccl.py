"""Merge per-server HCCL rank tables into one (upstream's name and options; `lite-rank-table merge`).

    python tools/merge_hccl.py a.json b.json [--output_dir DIR]
"""
import os
import sys

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(_CHECKOUT, "lite_runtime")):   # run from a checkout: its own package
    sys.path.insert(0, _CHECKOUT)
from lite_runtime.contract.command_line import entry_point
from lite_runtime.cli.rank_table import merge

main = entry_point(merge, "merge_hccl.py")

if __name__ == "__main__":
    sys.exit(main())
