"""stderr after loading a segment export on Lite: the shim captures fd 2 around every Build
(lite_shim.cc, StderrCapture) while segment_chain.py builds two segments at a time, so the captures
overlap. Per-call dup/dup2 swaps used to race there (issue 33): one capture saved the other's
temporary file as "stderr" and restored it after it was deleted, and every later message (a
traceback, the CLI's `error:` line) went into that deleted file. The race shows when the threads
are interleaved, hence loads beside a process keeping a core busy.
"""
from __future__ import annotations

import os
import subprocess
import sys

from support.lite_process import ensure_lite_installed
from support.tiny_models import REPO, error_lines, run_cli

LOADS = 6
# Runs in a process of its own: Lite only, never mindspore.
LOAD_REPEATEDLY = r"""
import os, sys
from lite_runtime.backends import load_session
from lite_runtime.contract.manifest import load_manifest

export, loads = sys.argv[1], int(sys.argv[2])
stderr = os.readlink("/proc/self/fd/2")
for i in range(loads):
    session = load_session("mslite", load_manifest(export))
    now = os.readlink("/proc/self/fd/2")
    session.close()
    if now != stderr:
        print(f"after load {i + 1} of {loads}, fd 2 is {now!r}, was {stderr!r}", flush=True)
        sys.exit(3)
print("fd 2 unchanged", flush=True)
sys.stderr.write("written to stderr after the loads\n")
"""


def busy_core() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_stderr_stays_the_processs_own_after_loading_a_segment_export_beside_a_busy_core(family_export):
    export = family_export("llama", "lite_segments_packed")
    ensure_lite_installed()
    busy = busy_core()
    try:
        loaded = run_cli(["-c", LOAD_REPEATEDLY, export, str(LOADS)])
        too_long = run_cli([os.path.join(REPO, "run_infer_main.py"), "--model_dir", export, "--backend", "mslite",
                            "--predict_data", "one two three four five six seven eight nine ten " * 10])
    finally:
        busy.kill()
        busy.wait()
    assert loaded.returncode == 0 and "fd 2 unchanged" in loaded.stdout, loaded.stdout + loaded.stderr[-2000:]
    assert "written to stderr after the loads" in loaded.stderr, loaded.stderr[-2000:]
    # The prompt is refused after the model is loaded; its one-line error must reach stderr.
    lines = error_lines(too_long.stderr)
    assert too_long.returncode != 0 and any("seq_length" in ln for ln in lines), \
        f"exit {too_long.returncode}, stderr: {too_long.stderr[-2000:]!r}"
