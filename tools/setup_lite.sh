#!/usr/bin/env bash
# Install the MindSpore Lite 2.0 C++ runtime and build the project's ctypes shim into build/lite/.
#
#   build/lite/wheel/   the PyPI wheel (cp37 manylinux1; only its C++ libraries are used)
#   build/lite/include/ the C++ API headers from the wheel
#   build/lite/lib/     the Lite libraries of the CPU path + liblite_shim.so beside them
#
# Idempotent: each step is skipped when its result is already there. The shim is rebuilt when
# lite_runtime/backends/native/lite_shim.cc is newer than the built library.
# Environment: PYTHON (interpreter used for pip and zipfile; default .venv/bin/python, else python3),
#              CXX (default g++).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LITE="$ROOT/build/lite"
WHEEL_NAME="mindspore_lite-2.0.0-cp37-cp37m-manylinux1_x86_64.whl"
WHEEL_SHA256="199cd0605cc985b88eddb273db9dfe9000a585ba10ca2292b6b36ebfff07b3ec"
WHEEL="$LITE/wheel/$WHEEL_NAME"
CACHED_WHEEL="$ROOT/.cache/lite-wheel/$WHEEL_NAME"   # optional pre-downloaded copy
SHIM_SRC="$ROOT/lite_runtime/backends/native/lite_shim.cc"
SHIM="$LITE/lib/liblite_shim.so"
LIBS=(libmindspore-extendrt_python.so libdnnl.so.2 libmindspore_converter.so libmslite_converter_plugin.so
      libmindspore_core.so libmindspore_glog.so.0 libopencv_core.so.4.5 libopencv_imgcodecs.so.4.5
      libopencv_imgproc.so.4.5 libmsplugin-ge-litert_python.so libruntime_convert_plugin_python.so)

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
CXX="${CXX:-g++}"

step() { echo "setup_lite: $*"; }
fail() { echo "setup_lite: ERROR: $*" >&2; exit 1; }

sha256_of() { "$PYTHON" -c 'import hashlib,sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
print(h.hexdigest())' "$1"; }

# 1. the wheel
mkdir -p "$LITE/wheel" "$LITE/lib"
if [[ -f "$WHEEL" ]]; then
  step "wheel present: $WHEEL"
elif [[ -f "$CACHED_WHEEL" ]]; then
  cp "$CACHED_WHEEL" "$WHEEL.part" && mv "$WHEEL.part" "$WHEEL"
  step "wheel copied from $CACHED_WHEEL"
else
  step "downloading $WHEEL_NAME (about 170 MB) with pip"
  "$PYTHON" -m pip download mindspore_lite==2.0.0 --no-deps --only-binary=:all: --python-version 3.7 \
      --implementation cp --abi cp37m --platform manylinux1_x86_64 -d "$LITE/wheel" \
    || fail "pip download of mindspore_lite==2.0.0 failed (network or index problem; see pip's output above)"
  [[ -f "$WHEEL" ]] || fail "pip download finished but $WHEEL is not there"
fi

# 2. its checksum (checked every run: cheap next to a broken runtime)
actual="$(sha256_of "$WHEEL")"
if [[ "$actual" != "$WHEEL_SHA256" ]]; then
  fail "sha256 of $WHEEL is $actual, expected $WHEEL_SHA256; delete the file and run again"
fi
step "wheel sha256 ok"

# 3. the libraries and headers (python's zipfile: no dependency on unzip)
STAMP="$LITE/lib/.extracted-$WHEEL_SHA256"
missing=0
for lib in "${LIBS[@]}"; do [[ -f "$LITE/lib/$lib" ]] || missing=1; done
if [[ $missing -eq 0 && -f "$STAMP" && -f "$LITE/include/api/model.h" ]]; then
  step "libraries and headers already extracted"
else
  "$PYTHON" - "$WHEEL" "$LITE" "${LIBS[@]}" <<'EOF'
import os, shutil, sys, zipfile
wheel, dest, libs = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if name.endswith("/"):
            continue
        if name.startswith("mindspore_lite/include/"):
            target = os.path.join(dest, name[len("mindspore_lite/"):])
        elif name.startswith("mindspore_lite/lib/") and os.path.basename(name) in libs:
            target = os.path.join(dest, "lib", os.path.basename(name))
        else:
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target + ".part", "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.replace(target + ".part", target)
missing = [lib for lib in libs if not os.path.isfile(os.path.join(dest, "lib", lib))]
if missing:
    sys.exit("setup_lite: ERROR: the wheel lacks " + ", ".join(missing))
EOF
  rm -f "$LITE"/lib/.extracted-*
  touch "$STAMP"
  step "extracted ${#LIBS[@]} libraries to $LITE/lib and headers to $LITE/include"
fi

# 4. the shim, beside the libraries so that rpath $ORIGIN finds them
command -v "$CXX" >/dev/null || fail "$CXX not found; install a C++ compiler (apt-get install g++)"
if [[ -f "$SHIM" && "$SHIM" -nt "$SHIM_SRC" ]]; then
  step "shim up to date: $SHIM"
else
  "$CXX" -D_GLIBCXX_USE_CXX11_ABI=0 -std=c++17 -fPIC -shared -O2 -Wall \
      -I"$LITE" "$SHIM_SRC" -o "$SHIM.part" \
      -L"$LITE/lib" -l:libmindspore-extendrt_python.so \
      -Wl,-rpath,'$ORIGIN' -Wl,--disable-new-dtags \
    || fail "compiling $SHIM_SRC failed"
  mv "$SHIM.part" "$SHIM"
  step "built $SHIM"
fi
step "done"
