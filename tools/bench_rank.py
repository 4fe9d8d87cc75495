"""One rank's measuring process of a multi-rank benchmark, started by the launcher.

usage: python -m lite_runtime.cli.launch ... -- tools/bench_rank.py JOB.json OUT.json
(the launcher appends --backend/--distributed, which this script does not need)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_decode import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--child"] + sys.argv[1:3]))
