"""Offline conversion of an export's graphs to MindSpore Lite's own `.ms` format (yaml `lite_ms: true`).

Lite 2.0 converts a MindIR while loading it and keeps extra weight copies from that; a `.ms` file
is already in Lite's form: measured on the benchmark Llama, Build 0.4 s instead of 2.4 s and a
smaller resident set. The converter ships in the `mindspore_lite` 2.0 wheel, whose Python API runs
only on Python 3.7: `make setup` makes `.venv-lite37` for it, and this module runs it there.
"""
from __future__ import annotations

import os
import subprocess
from typing import Dict, List

from lite_runtime.contract.errors import ConfigError, ToolchainError

CONVERTER_ENV = "LITE_CONVERTER_PYTHON"
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CONVERTER_PYTHON = os.path.join(_REPO, ".venv-lite37", "bin", "python")
_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lite_converter_main.py")


def converter_python(source: str) -> str:
    python = os.environ.get(CONVERTER_ENV) or DEFAULT_CONVERTER_PYTHON
    if not os.path.isfile(python):
        raise ConfigError(f"{source}: lite_ms: true needs MindSpore Lite 2.0's converter (Python 3.7 with the "
                          f"mindspore_lite wheel): {python} does not exist; run `make setup`, or set "
                          f"{CONVERTER_ENV} to such a Python")
    return python


def kernels_library() -> str:
    """The project's Lite kernel library (beside the runtime's shim), '' when not built."""
    from lite_runtime.backends.lite_install import shim_candidates
    from lite_runtime.backends.lite_kernels import library_path
    shims = [path for path, _ in shim_candidates() if os.path.isfile(path)]
    return library_path(shims[0]) if shims else ""


def ms_name(mindir_rel: str) -> str:
    return mindir_rel[: -len(".mindir")] + ".ms"


def lite_weights_name(ms_rel: str) -> str:
    """The converter writes the weights of a model whose MindIR has external data to `<name>.msw`
    beside `<name>.ms`."""
    return ms_rel + "w"


def convert_graphs(folder: str, graphs: Dict[str, List[str]], python: str) -> Dict[str, List[str]]:
    """Convert every graph file (relative to `folder`) to `.ms` beside it; returns the same map of
    `.ms` files."""
    lite = {kind: [ms_name(rel) for rel in files] for kind, files in graphs.items()}
    args = []
    for kind, files in graphs.items():
        for rel, out in zip(files, lite[kind]):
            args += [os.path.join(folder, rel), os.path.join(folder, out)]
    env = dict(os.environ, GLOG_v="3", PYTHONPATH="")
    kernels = kernels_library()
    if kernels:
        env["LITE_KERNELS_LIB"] = kernels
    result = subprocess.run([python, _MAIN, *args], capture_output=True, text=True, env=env)
    missing = [out for files in lite.values() for out in files if not os.path.isfile(os.path.join(folder, out))]
    if result.returncode != 0 or missing:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise ToolchainError(f"MindSpore Lite's converter ({python}) failed"
                             + (f" to write {missing[0]}" if missing else "")
                             + (f": {detail[-1]}" if detail else f" with exit code {result.returncode}"))
    return lite
