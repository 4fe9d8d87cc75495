"""Lite 2.0 keeps two copies of every MatMul weight of a `.ms` model after Build (its copy of the model
file and the kernel's packed weight); the runtime gives the first back (lite_runtime/backends/
lite_weights.py). Real exports (MindSpore 2.0, Lite's converter), real Lite, each run in a process of
its own: the step graph and one rank's step as segments (`parallel.collectives: host` on one rank),
with and without the release, give the same greedy tokens and logits."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from support.family_cases import STEPS
from support.lite_process import ensure_lite_installed
from support.tiny_models import REPO, run_cli

RUN = """
import sys
sys.path.insert(0, "tests")
import numpy as np
from support.greedy_runner import greedy_run
from lite_runtime.backends import load_session
from lite_runtime.contract.manifest import load_manifest
export, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
session = load_session("mslite", load_manifest(export), lite_format="ms")
models = session.lite_models
logits, tokens = greedy_run(session, steps)
np.savez(out, logits=logits, tokens=tokens, names=sorted(models),
         released=[models[name].released_bytes for name in sorted(models)])
session.close()
"""

# Reads one byte of the first page given back: Lite never reads it again, and nobody else may.
TOUCH = """
import ctypes, sys
from lite_runtime.backends.lite_native import LiteModel
model = LiteModel(sys.argv[1])
start, _ = model._released.spans[0]
print("released", model.released_bytes, flush=True)
ctypes.string_at(start, 1)
print("read a released page", flush=True)
"""


def run(export, out, release: bool, monkeypatch):
    monkeypatch.setenv("LITE_RELEASE_WEIGHTS", "1" if release else "0")
    result = run_cli(["-c", RUN, export, str(out), str(STEPS)])
    assert result.returncode == 0, result.stderr[-3000:]
    return np.load(out)


@pytest.mark.parametrize("variant", ["lite_packed", "lite_segments_packed"])
def test_release_keeps_tokens_and_logits(family_export, variant, tmp_path, monkeypatch):
    ensure_lite_installed()
    export = family_export("llama", variant)
    kept = run(export, tmp_path / "kept.npz", False, monkeypatch)
    released = run(export, tmp_path / "released.npz", True, monkeypatch)
    np.testing.assert_array_equal(released["tokens"], kept["tokens"])
    np.testing.assert_array_equal(released["logits"], kept["logits"])      # the same packed weights
    assert not kept["released"].any()
    names, sizes = list(released["names"]), dict(zip(released["names"], released["released"]))
    with_matmuls = [n for n in names if n != "embed"]     # the embedding segment has only a Gather
    assert with_matmuls and all(sizes[n] > 0 for n in with_matmuls), sizes
    if variant == "lite_segments_packed":
        assert sizes["embed"] == 0


def test_one_rank_segments_equal_the_step_graph(family_export, tmp_path, monkeypatch):
    ensure_lite_installed()
    step = run(family_export("llama", "lite_packed"), tmp_path / "step.npz", True, monkeypatch)
    segments = run(family_export("llama", "lite_segments_packed"), tmp_path / "segments.npz", True, monkeypatch)
    assert list(segments["names"]) == ["embed", "head", "layer0.blocks"]     # the two layers in one segment
    np.testing.assert_array_equal(segments["tokens"], step["tokens"])
    assert np.abs(segments["logits"] - step["logits"]).max() <= 1e-5


def test_released_pages_cannot_be_read(family_export):
    """Given back and made inaccessible: a read Lite was not expected to make fails loudly."""
    ensure_lite_installed()
    path = os.path.join(family_export("llama", "lite_segments_packed"), "segments", "rank_0", "layer0.blocks.ms")
    result = run_cli(["-c", TOUCH, path])
    assert "released" in result.stdout and "read a released page" not in result.stdout, result.stdout
    assert result.returncode == -signal.SIGSEGV, (result.returncode, result.stderr[-2000:])


# The scan for Lite's copy runs while other threads (Lite's workers, a second segment's Build, malloc
# arenas) unmap or protect memory it has listed: a region protected between listing and reading is
# skipped. The old scan read such memory in place and ended the process (SIGSEGV, about 1 load in 25 of
# two ranks' segments).
VANISHING = """
import ctypes, mmap
from lite_runtime.backends import lite_weights
size = 8 * mmap.PAGESIZE
source = mmap.mmap(-1, size)
source.write(bytes(range(256)) * (size // 256))
copies = [mmap.mmap(-1, size) for _ in range(2)]
for copy in copies:
    copy.write(source[:])
address = lambda m: ctypes.addressof(ctypes.c_char.from_buffer(m))
regions = {address(m): size for m in copies}
runs = lite_weights._resident_runs(regions, size)
assert sorted(runs) == sorted(regions.items()), runs
lite_weights._resident_runs = lambda regions, min_length: runs      # listed before the protection
ctypes.CDLL(None).mprotect(ctypes.c_void_p(address(copies[0])), ctypes.c_size_t(size), 0)
print(lite_weights._copies(regions, address(source), size) == [address(copies[1])], flush=True)
"""


@pytest.mark.fast
def test_memory_protected_after_it_was_listed_is_skipped_by_the_scan():
    result = run_cli(["-c", VANISHING])
    assert result.returncode == 0 and result.stdout.strip() == "True", (result.returncode, result.stderr[-2000:])


# The resident pages of Lite's library files once a model is loaded and has run a step.
LIBRARY_PAGES = """
import os, sys
sys.path.insert(0, "tests")
from support.greedy_runner import greedy_run
from lite_runtime.backends import load_session
from lite_runtime.backends.lite_native import shim_path
from lite_runtime.contract.manifest import load_manifest
session = load_session("mslite", load_manifest(sys.argv[1]))
greedy_run(session, 2)
folder, path, kb = os.path.dirname(os.path.realpath(shim_path())) + os.sep, None, 0
for line in open("/proc/self/smaps"):
    if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
        parts = line.split()
        path = parts[5] if len(parts) > 5 else None
    elif line.startswith("Rss:") and path and path.startswith(folder):
        kb += int(line.split()[1])
print(kb * 1024)
"""


# Another process mapping every page of the same library files (as a second rank or server loading at once
# does): Linux pages out no page two processes map.
HOLDER = """
import mmap, os, sys
from lite_runtime.backends.lite_native import shim_path
folder, maps = os.path.dirname(os.path.realpath(shim_path())), []
for name in os.listdir(folder):
    path = os.path.join(folder, name)
    if os.path.isfile(path) and os.path.getsize(path):
        with open(path, "rb") as f:
            maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
        sum(maps[-1][i] for i in range(0, len(maps[-1]), mmap.PAGESIZE))
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("neighbour", [False, True], ids=["alone", "beside a process mapping them"])
def test_lite_libraries_give_back_the_pages_their_loading_touched(family_export, neighbour):
    """Loading touches 190-215 MB of Lite's libraries (registries, start-up code) that a step does not read again;
    the runtime has Linux reclaim them once loaded and after each Build (lite_native.py), so a loaded model that
    has decoded holds under 64 MB of them (about 13-26 MB measured, 190-215 MB before; 188 MB beside a process
    mapping them before they were unmapped too)."""
    ensure_lite_installed()
    holder = None
    if neighbour:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if holder:
            assert holder.stdout.readline().strip() == "ready", "the process mapping the libraries did not start"
        result = run_cli(["-c", LIBRARY_PAGES, family_export("llama", "lite_packed_cpu")])
    finally:
        if holder:
            holder.communicate("")
    assert result.returncode == 0, result.stderr[-3000:]
    resident = int(result.stdout.strip().splitlines()[-1])
    assert 1 << 20 < resident < 64 << 20, resident
