"""Decode benchmark (see tools/bench_decode.py):

    .venv/bin/python tools/benchmark.py                       # the notes' benchmark model, ms and mslite, batch 1 and 8
    .venv/bin/python tools/benchmark.py --slora               # also its SLoRA export against it (make bench)
    .venv/bin/python tools/benchmark.py --model_dir output/demo --backend mslite --json bench.json
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_decode import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
