#!/usr/bin/env bash
# A checkout's Lite set-up (`make setup`): MindSpore Lite 2.0's C++ runtime and the project's ctypes
# shim in build/lite/ (wheel/, include/, lib/), by the same command a deployment runs (`lite-setup`,
# lite_runtime/backends/lite_install.py). Idempotent; the shim is rebuilt when its source is newer.
# Environment: PYTHON (default .venv/bin/python, else python3), CXX (default g++).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEEL_NAME="mindspore_lite-2.0.0-cp37-cp37m-manylinux1_x86_64.whl"
CACHED_WHEEL="$ROOT/.cache/lite-wheel/$WHEEL_NAME"   # optional pre-downloaded copy
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

# The converter environment (Makefile) installs the wheel from build/lite/wheel/.
mkdir -p "$ROOT/build/lite/wheel"
if [[ -f "$CACHED_WHEEL" && ! -f "$ROOT/build/lite/wheel/$WHEEL_NAME" ]]; then
  cp "$CACHED_WHEEL" "$ROOT/build/lite/wheel/$WHEEL_NAME.part"
  mv "$ROOT/build/lite/wheel/$WHEEL_NAME.part" "$ROOT/build/lite/wheel/$WHEEL_NAME"
fi
cd "$ROOT"
exec "$PYTHON" -m lite_runtime.cli.lite_setup --prefix "$ROOT/build/lite"
