"""Helpers for tests that load MindSpore Lite: process isolation and the tiny test graphs.

Lite's libraries and `import mindspore` cannot share a process (both ship libmindspore_core.so),
and other test modules import mindspore. So a test decorated with `@in_lite_process` runs in a
child pytest process of its own; the parent only prepares shared inputs (the graphs, exported once
per session) and reports the child's result. In the child (LITE_TEST_CHILD=1) the test runs as is.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD_ENV = "LITE_TEST_CHILD"
GRAPHS_ENV = "LITE_TEST_GRAPHS"          # folder with the graphs exported by MindSpore 2.0
NEW_GRAPHS_ENV = "LITE_TEST_GRAPHS_NEW"  # folder with a graph exported by MindSpore 2.10
MS20_PYTHON = REPO / ".venv-ms20" / "bin" / "python"
MS_NEW_PYTHON = REPO / ".venv" / "bin" / "python"


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def in_lite_process(test):
    """Run `test` in a fresh pytest process (fixtures are created there, not here)."""
    if in_child():
        @functools.wraps(test)
        def guarded(*args, **kwargs):
            loaded = sorted(m for m in sys.modules if m == "mindspore" or m.startswith("mindspore."))
            assert not loaded, (f"mindspore was imported into the Lite test process ({loaded[:3]}), e.g. by a "
                                "conftest; Lite's libraries cannot load next to it: import mindspore lazily")
            return test(*args, **kwargs)
        return guarded

    @functools.wraps(test)
    def run_in_child(*_args, **_kwargs):
        nodeid = f"{Path(test.__code__.co_filename).resolve()}::{test.__name__}"
        env = dict(os.environ, **{CHILD_ENV: "1"})
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", nodeid],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise AssertionError(f"{test.__name__} failed in its Lite process:\n{result.stdout}\n{result.stderr}")
    return run_in_child


def export_graphs(python: Path, out_dir: Path, *names: str) -> Path:
    """Export tests/support/lite_graphs.py graphs with the MindSpore of `python` (a separate process)."""
    result = subprocess.run([str(python), str(REPO / "tests" / "support" / "lite_graphs.py"), str(out_dir), *names],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise AssertionError(f"exporting test graphs with {python} failed:\n{result.stdout}\n{result.stderr}")
    return out_dir


def shared_graphs(tmp_path_factory) -> Path:
    """The MindSpore 2.0 test graphs: exported once by the parent, reused by every child."""
    if os.environ.get(GRAPHS_ENV):
        return Path(os.environ[GRAPHS_ENV])
    folder = export_graphs(MS20_PYTHON, tmp_path_factory.mktemp("lite_graphs_ms20"))
    os.environ[GRAPHS_ENV] = str(folder)
    return folder


def shared_new_graphs(tmp_path_factory) -> Path:
    """`affine` exported by MindSpore 2.10 (a MindIR version Lite 2.0 refuses)."""
    if os.environ.get(NEW_GRAPHS_ENV):
        return Path(os.environ[NEW_GRAPHS_ENV])
    folder = export_graphs(MS_NEW_PYTHON, tmp_path_factory.mktemp("lite_graphs_ms_new"), "affine")
    os.environ[NEW_GRAPHS_ENV] = str(folder)
    return folder


def ensure_lite_installed() -> None:
    """Run tools/setup_lite.sh (idempotent; rebuilds the shim when its source changed)."""
    result = subprocess.run(["bash", str(REPO / "tools" / "setup_lite.sh")], cwd=REPO,
                            capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise AssertionError(f"tools/setup_lite.sh failed:\n{result.stdout}\n{result.stderr}")
