"""Installing MindSpore Lite 2.0's C++ runtime and building the project's shim, where the runtime is
deployed (`lite-setup`; `make setup` runs it for a checkout's build/lite).

The PyPI `mindspore_lite` 2.0 wheel is cp37-only; only its C++ libraries and headers are used:

    PREFIX/wheel/    the wheel, when downloaded here (pip download; its sha256 is checked every run)
    PREFIX/include/  the C++ API headers from the wheel
    PREFIX/lib/      the Lite libraries of the CPU path + liblite_shim.so and liblite_kernels.so (the
                     project's custom kernels, lite_kernels.py) beside them (rpath $ORIGIN)

Where the native binding looks for the shim, in order: $LITE_SHIM_LIB, the per-user location
(`$XDG_DATA_HOME/llm-lite-export/lite`, default `~/.local/share/...`), a checkout's build/lite.
Each step is skipped when its result is already there; the shim is rebuilt when its source is newer.
Imports nothing but the standard library and the project's light contract modules.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from typing import Callable, List, Optional, Tuple

from lite_runtime.contract.errors import ConfigError, ToolchainError
from lite_runtime.contract.hashes import file_sha256

WHEEL_NAME = "mindspore_lite-2.0.0-cp37-cp37m-manylinux1_x86_64.whl"
WHEEL_SHA256 = "199cd0605cc985b88eddb273db9dfe9000a585ba10ca2292b6b36ebfff07b3ec"
LIBS = ("libmindspore-extendrt_python.so", "libdnnl.so.2", "libmindspore_converter.so",
        "libmslite_converter_plugin.so", "libmindspore_core.so", "libmindspore_glog.so.0", "libopencv_core.so.4.5",
        "libopencv_imgcodecs.so.4.5", "libopencv_imgproc.so.4.5", "libmsplugin-ge-litert_python.so",
        "libruntime_convert_plugin_python.so")
SHIM_NAME = "liblite_shim.so"
SHIM_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "lite_shim.cc")
SHIM_ENV = "LITE_SHIM_LIB"
KERNELS_NAME = "liblite_kernels.so"
_NATIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")
KERNELS_SOURCES = [os.path.join(_NATIVE, name) for name in (
    "lite_kernels.cc", "attention_kernel.cc", "paged_attention_kernel.cc", "layer_ops_kernel.cc", "lookup_kernel.cc",
    "linear_math.cc", "linear_math.h", "linear_panels.h", "linear_gemm.h", "linear_int8.cc", "attention_math.cc",
    "attention_math.h", "layer_math.cc", "layer_math.h", "vec8.h", "thread_pool.h", "kernel_support.h",
    "lite_registry.h", os.path.join("schema", "model_generated.h"))]
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKOUT_PREFIX = os.path.join(_CHECKOUT, "build", "lite")


class SetupError(ToolchainError):
    """A step of installing Lite failed (download, checksum, extraction, compiler)."""


def user_prefix() -> str:
    """The per-user install location of Lite and the shim."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "llm-lite-export", "lite")


def shim_candidates() -> List[Tuple[str, str]]:
    """(path, where it comes from) in the order the native binding tries them."""
    env = os.environ.get(SHIM_ENV)
    if env:
        return [(env, f"${SHIM_ENV}")]
    found = [(os.path.join(user_prefix(), "lib", SHIM_NAME), "the per-user location")]
    if os.path.isfile(os.path.join(_CHECKOUT, "setup.cfg")):   # run from a checkout, not an installed copy
        found.append((os.path.join(CHECKOUT_PREFIX, "lib", SHIM_NAME), "the checkout's build/lite"))
    return found


def install(prefix: str, wheel: Optional[str] = None, cxx: str = "g++",
            say: Callable[[str], None] = print) -> str:
    """Install Lite's libraries and headers under `prefix` and build the shim there; returns its path.
    `wheel`: an already downloaded Lite wheel to use instead of downloading one into PREFIX/wheel."""
    prefix = os.path.abspath(prefix)
    lib = os.path.join(prefix, "lib")
    try:
        os.makedirs(lib, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--prefix {prefix}: cannot create {lib} ({e.strerror}); choose a writable folder") from None
    wheel = _wheel(prefix, wheel, say)
    _extract(wheel, prefix, say)
    shim = _build_shim(prefix, cxx, say)
    _build_kernels(prefix, cxx, say)
    return shim


def _wheel(prefix: str, given: Optional[str], say) -> str:
    if given is not None:
        if not os.path.isfile(given):
            raise ConfigError(f"--wheel {given} does not exist; allowed: the file {WHEEL_NAME}, or omit --wheel "
                              "to download it")
        path = given
    else:
        path = os.path.join(prefix, "wheel", WHEEL_NAME)
        if os.path.isfile(path):
            say(f"wheel present: {path}")
        else:
            say(f"downloading {WHEEL_NAME} (about 170 MB) with pip")
            command = [sys.executable, "-m", "pip", "download", "mindspore_lite==2.0.0", "--no-deps",
                       "--only-binary=:all:", "--python-version", "3.7", "--implementation", "cp", "--abi", "cp37m",
                       "--platform", "manylinux1_x86_64", "-d", os.path.dirname(path)]
            if subprocess.run(command, check=False).returncode != 0:
                raise SetupError("pip download of mindspore_lite==2.0.0 failed (network or index problem; see pip's "
                                 "output above)")
            if not os.path.isfile(path):
                raise SetupError(f"pip download finished but {path} is not there")
    actual = file_sha256(path)
    if actual != WHEEL_SHA256:
        raise SetupError(f"sha256 of {path} is {actual}, expected {WHEEL_SHA256} (mindspore_lite 2.0.0); "
                         "delete the file and run again")
    say("wheel sha256 ok")
    return path


def _extract(wheel: str, prefix: str, say) -> None:
    lib = os.path.join(prefix, "lib")
    stamp = os.path.join(lib, f".extracted-{WHEEL_SHA256}")
    if os.path.isfile(stamp) and os.path.isfile(os.path.join(prefix, "include", "api", "model.h")) and \
            all(os.path.isfile(os.path.join(lib, name)) for name in LIBS):
        say("libraries and headers already extracted")
        return
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            if name.endswith("/"):
                continue
            if name.startswith("mindspore_lite/include/"):
                target = os.path.join(prefix, name[len("mindspore_lite/"):])
            elif name.startswith("mindspore_lite/lib/") and os.path.basename(name) in LIBS:
                target = os.path.join(lib, os.path.basename(name))
            else:
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(info) as src, open(target + ".part", "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.replace(target + ".part", target)
    missing = [name for name in LIBS if not os.path.isfile(os.path.join(lib, name))]
    if missing:
        raise SetupError(f"the wheel {wheel} lacks {', '.join(missing)}")
    for old in os.listdir(lib):
        if old.startswith(".extracted-"):
            os.remove(os.path.join(lib, old))
    open(stamp, "w").close()
    say(f"extracted {len(LIBS)} libraries to {lib} and headers to {os.path.join(prefix, 'include')}")


def _build_shim(prefix: str, cxx: str, say) -> str:
    shim = os.path.join(prefix, "lib", SHIM_NAME)
    if os.path.isfile(shim) and os.path.getmtime(shim) > os.path.getmtime(SHIM_SOURCE):
        say(f"shim up to date: {shim}")
        return shim
    compiler = shutil.which(cxx)
    if compiler is None:
        raise SetupError(f"C++ compiler {cxx!r} not found; install one (apt-get install g++) or pass --cxx")
    command = [compiler, "-D_GLIBCXX_USE_CXX11_ABI=0", "-std=c++17", "-fPIC", "-shared", "-O2", "-Wall",
               f"-I{prefix}", SHIM_SOURCE, "-o", shim + ".part", f"-L{os.path.join(prefix, 'lib')}",
               "-l:libmindspore-extendrt_python.so", "-Wl,-rpath,$ORIGIN", "-Wl,--disable-new-dtags"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        first = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip()[:300])
        raise SetupError(f"compiling {SHIM_SOURCE} with {compiler} failed: {first}")
    os.replace(shim + ".part", shim)
    say(f"built {shim}")
    return shim


def _compile(command: List[str], source: str, compiler: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        first = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip()[:300])
        raise SetupError(f"compiling {source} with {compiler} failed: {first}")


def _build_kernels(prefix: str, cxx: str, say) -> str:
    """liblite_kernels.so: the loops (linear products, attention) twice (AVX2 + FMA, the prefill GEMM also for
    AVX-512, and portable; chosen at load by cpuid), the int8 activations' products once (AVX512-VNNI) and the Lite
    kernels, linked against the converter library, which defines Kernel::Initialize()."""
    lib = os.path.join(prefix, "lib")
    target = os.path.join(lib, KERNELS_NAME)
    if os.path.isfile(target) and os.path.getmtime(target) > max(map(os.path.getmtime, KERNELS_SOURCES)):
        say(f"kernels up to date: {target}")
        return target
    compiler = shutil.which(cxx)
    if compiler is None:
        raise SetupError(f"C++ compiler {cxx!r} not found; install one (apt-get install g++) or pass --cxx")
    base = [compiler, "-D_GLIBCXX_USE_CXX11_ABI=0", "-std=c++17", "-fPIC", "-O3", "-Wall", f"-I{prefix}",
            f"-I{_NATIVE}", "-c"]
    builds = [(f"{stem}_{isa}", os.path.join(_NATIVE, stem + ".cc"), flags)
              for stem in ("linear_math", "attention_math", "layer_math")
              for isa, flags in (("avx2", ["-DLK_NS=avx2", "-mavx2", "-mfma", "-mf16c"]), ("generic", ["-DLK_NS=generic"]))]
    objects = []
    builds.append(("linear_int8", os.path.join(_NATIVE, "linear_int8.cc"),
                   ["-mavx512f", "-mavx512bw", "-mavx512vnni", "-mf16c", "-mfma"]))     # called where cpuid has them
    builds += [(stem, os.path.join(_NATIVE, stem + ".cc"), []) for stem in ("lite_kernels", "attention_kernel", "paged_attention_kernel",
                                                                         "layer_ops_kernel", "lookup_kernel")]
    for name, source, flags in builds:
        obj = os.path.join(lib, f".lite_kernels_{name}.o")
        _compile(base + flags + [source, "-o", obj], source, compiler)
        objects.append(obj)
    link = [compiler, "-shared", *objects, "-o", target + ".part", f"-L{lib}", "-l:libmindspore-extendrt_python.so",
            "-l:libmslite_converter_plugin.so", "-l:libmindspore_converter.so", "-lpthread", "-Wl,-rpath,$ORIGIN",
            "-Wl,--disable-new-dtags"]
    _compile(link, KERNELS_NAME, compiler)
    for obj in objects:
        os.remove(obj)
    os.replace(target + ".part", target)
    say(f"built {target}")
    return target
