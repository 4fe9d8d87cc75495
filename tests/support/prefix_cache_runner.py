"""python tests/prefix_cache_runner.py EXPORT: test_prefix_cache's comparison on real Lite, in a process
without mindspore; prints (plain, cached)."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from test_prefix_cache import compare  # noqa: E402

if __name__ == "__main__":
    result = compare(sys.argv[1], "mslite")
    assert "mindspore" not in sys.modules
    print(repr(result))
