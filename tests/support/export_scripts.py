"""Exporter runs with a limit lowered in the export process (`python -c SCRIPT --config ...`), so the
tiny models take the paths of large ones."""

LOWERED_LIMIT_EXPORT = """
import runpy, sys
import exporter.writing.forms as forms
forms.LITE_MS_LIMIT = 0      # bytes: every one-rank step of target cpu is written as segments
forms.SEGMENT_BYTES = 1      # of one layer each
sys.argv = ["exporter"] + sys.argv[1:]
runpy.run_module("exporter", run_name="__main__")
"""

SPLIT_EXPORT = """
import runpy, sys
import mindspore.train.serialization as serialization
serialization.TOTAL_SAVE = 0      # KiB; above it MindSpore writes the weights as external data
sys.argv = ["exporter"] + sys.argv[1:]
runpy.run_module("exporter", run_name="__main__")
"""
