"""ctypes binding to MindSpore Lite 2.0's C++ runtime through the project's shim (CPU, any Python).

The PyPI `mindspore_lite` wheel is cp37-only, so on other Pythons the project compiles
`lite_runtime/backends/native/lite_shim.cc` against the wheel's C++ libraries (`lite-setup`, see
lite_install.py; `make setup` in a checkout) and loads it here. This module never imports mindspore: Lite's libraries
and mindspore's cannot live in one process.

    model = LiteModel("graph.mindir", num_threads=2)
    model.bind_inputs([x, y])          # zero copy: Lite reads these arrays' memory on every predict
    x[...] = new_values                # no rebinding needed
    logits, = model.predict()          # the same preallocated output arrays on every call
"""
from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import re
import struct
import threading
import time
from collections import Counter
from typing import List, Optional, Sequence

import numpy as np

from lite_runtime.backends.lite_install import shim_candidates
from lite_runtime.contract.errors import ArtifactError, ToolchainError, UnsupportedError
from lite_runtime.backends import lite_kernels, lite_weights
from lite_runtime.contract.families import TensorSpec

RELEASE_ENV = "LITE_RELEASE_WEIGHTS"     # "0": keep Lite's original MatMul weights (lite_weights.py)
_MAX_RANK = 8

# mindspore::DataType values (include/api/data_type.h) -> numpy dtype names
_DTYPES = {30: "bool", 32: "int8", 33: "int16", 34: "int32", 35: "int64", 37: "uint8", 38: "uint16",
           39: "uint32", 40: "uint64", 42: "float16", 43: "float32", 44: "float64"}

MINDIR_VERSION_ADVICE = (
    "MindSpore Lite 2.0 reads only MindIR written by MindSpore 2.0: export again in the "
    "Lite-compatible environment (`make export-lite`, i.e. `.venv-ms20/bin/python -m exporter ...`)")


class LiteError(ToolchainError):
    """MindSpore Lite reported a failure; the message carries Lite's own error text."""


_VERSION_ERROR = re.compile(r"[^;]*maximum mind ir version[^;]*")


def explain_lite_error(text: str, path: str) -> Optional[str]:
    """A user-facing message for Lite errors with a known cause, else None."""
    found = _VERSION_ERROR.search(text)
    if found:
        lite_says = found.group(0).strip().removeprefix("Catch exception: ")
        return f"{path} was written by a MindSpore too new for MindSpore Lite 2.0 (Lite: {lite_says!r}). " \
               + MINDIR_VERSION_ADVICE
    return None


def shim_path() -> str:
    """The first shim that exists of $LITE_SHIM_LIB, the per-user location, a checkout's build/lite."""
    found = [path for path, _ in shim_candidates() if os.path.isfile(path)]
    return found[0] if found else ""


_lib = None


def load_shim() -> ctypes.CDLL:
    """Load the shim once per process: it pulls in Lite's libraries (docs/measured-choices.md)."""
    global _lib
    if _lib is not None:
        return _lib
    path = shim_path()
    if not path:
        looked = "; ".join(f"{where}: {candidate}" for candidate, where in shim_candidates())
        raise UnsupportedError(
            f"the MindSpore Lite runtime is not installed: no shim at {looked}; run `lite-setup` to download "
            "Lite 2.0 and build the shim (in a checkout: `make setup`)")
    # Lite logs through glog on stderr; keep its warnings (e.g. about libnuma) out of the way unless
    # the user asked for them. Failures reach the caller as exception text (see lite_shim.cc).
    os.environ.setdefault("GLOG_v", "3")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise UnsupportedError(f"cannot load the MindSpore Lite shim {path}: {e}; "
                               "run `lite-setup` again") from None
    _register_kernels(path)
    vp, c_int, c_size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    lib.lite_last_error.restype = ctypes.c_char_p
    lib.lite_model_create.argtypes = [ctypes.c_char_p, ctypes.c_char_p, c_int, ctypes.POINTER(vp)]
    if hasattr(lib, "lite_model_create_from_buffer"):   # a shim built before it lacks it: no release then
        lib.lite_model_create_from_buffer.argtypes = [ctypes.c_char_p, vp, c_size, ctypes.c_char_p, c_int,
                                                      ctypes.POINTER(vp)]
        lib.lite_model_create_from_buffer.restype = c_int
    lib.lite_model_free.argtypes = [vp]
    lib.lite_model_free.restype = None
    lib.lite_num_tensors.argtypes = [vp, c_int]
    lib.lite_tensor_info.argtypes = [vp, c_int, c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(c_int),
                                     ctypes.POINTER(c_int), ctypes.POINTER(ctypes.c_int64), c_int]
    lib.lite_bind_input.argtypes = [vp, c_int, vp, c_size]
    lib.lite_bind_output.argtypes = [vp, c_int, vp, c_size]
    lib.lite_predict.argtypes = [vp]
    lib.lite_resize.argtypes = [vp, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(c_int)]
    lib.lite_profile.argtypes = [vp, c_int, c_int, ctypes.c_char_p, c_size]
    for name in ("lite_model_create", "lite_num_tensors", "lite_tensor_info", "lite_bind_input",
                 "lite_bind_output", "lite_predict", "lite_resize", "lite_profile"):
        getattr(lib, name).restype = c_int
    _lib = lib
    _page_out_lite_libraries()       # what loading the libraries touched: a Build does not read most of it again
    return lib


def _register_kernels(shim: str) -> None:
    """The project's custom kernels (lite_kernels.py), registered with Lite before any Build; Lite's
    registry is the process's, so once serves every model. A shim without the library beside it (built
    before it existed) runs graphs without Custom nodes as before."""
    path = lite_kernels.library_path(shim)
    if not path:
        return
    try:
        lite_kernels.register(path)
    except (OSError, RuntimeError) as e:
        raise UnsupportedError(f"cannot load the project's Lite kernels {path}: {e}; run `lite-setup` again") from None


def kernel_types() -> List[str]:
    """The Custom op types this process's Lite can run (the shim loaded first)."""
    load_shim()
    return list(lite_kernels.types())


def _release_freed_memory() -> None:
    """Return the heap Lite freed while converting a MindIR at Build to the system (glibc keeps it
    otherwise: measured ≈ 140 MB of a second graph's Build)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):     # not glibc
        pass


MADV_DONTNEED = 4
MADV_PAGEOUT = 21      # Linux 5.4 on: reclaim the pages of a range now, as memory pressure would


def _page_out_lite_libraries() -> None:
    """Give back the read-only pages of Lite's libraries touched so far: once they are loaded (their registries
    and start-up code, in libmindspore-extendrt and the converter library it links: about 150 MB) and after each
    Build. They held 190-215 MB resident after a SmolLM2 load, of which a step touches about 7 MB again
    (faulted back in from the files, docs/run.md): a process holds what it uses. Where madvise refuses (an
    older kernel), nothing changes.

    Linux does not page out a page another process maps too (two ranks, or two servers, loading at once): those
    are then unmapped from this process (MADV_DONTNEED), which is safe only where no page of the mapping is this
    process's own copy (Anonymous: 0, unlike the relocated read-only data); the file's pages stay cached."""
    folder = os.path.dirname(os.path.realpath(shim_path())) + os.sep
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):       # not Linux, or no madvise
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    ranges, current = [], None              # (start, end) of each read-only mapping of the folder, own pages none
    for line in lines:
        parts = line.split(maxsplit=5)
        if not parts:
            continue
        if "-" in parts[0] and not parts[0].endswith(":"):
            current = None
            if len(parts) == 6 and "w" not in parts[1] and parts[5].startswith(folder):
                current = [int(x, 16) for x in parts[0].split("-")]
                madvise(current[0], current[1] - current[0], MADV_PAGEOUT)
        elif current is not None and parts[0] == "Anonymous:" and parts[1] == "0":
            ranges.append(current)
    for start, end in ranges:
        madvise(start, end - start, MADV_DONTNEED)


_CWD_LOCK = threading.Lock()        # the working directory is the process's: one Build at a time changes it


@contextlib.contextmanager
def _working_directory(folder: str):
    with _CWD_LOCK:
        previous = os.getcwd()
        os.chdir(folder)
        try:
            yield
        finally:
            os.chdir(previous)


def _last_error(lib) -> str:
    """Lite's error text, each distinct message of its log once: some faults (a missing .msw weight file)
    log the same line for every tensor, hundreds of times."""
    text = (lib.lite_last_error() or b"").decode("utf-8", "replace")
    head, sep, log = text.rpartition(" Lite log: ")    # the shim joins the log's [ERROR] lines with "; "
    counts = Counter(log.split("; "))
    return head + sep + "; ".join(p if counts[p] == 1 else f"{p} ({counts[p]} times)" for p in counts)


class LiteModel:
    """One MindIR graph built by Lite on the CPU, with inputs and outputs bound to numpy memory.

    `predict()` returns the same preallocated output arrays on every call (read-only views):
    copy what you keep past the next call.
    """

    def __init__(self, path: str, config_path: Optional[str] = None, num_threads: int = 2,
                 release_weights: Optional[bool] = None):
        """`release_weights` (default: on unless LITE_RELEASE_WEIGHTS=0): for a `.ms` model with its weights
        inside, give back Lite's unused original of each MatMul weight after Build (lite_weights.py)."""
        self.path = path
        self._lib = load_shim()
        self._handle = ctypes.c_void_p()
        self._released = lite_weights.Released([])
        self._source = None
        self.release_note = "not a .ms model with its weights inside"
        start = time.perf_counter()
        config = os.path.abspath(config_path).encode() if config_path else None
        model = os.path.abspath(path)      # before the working directory changes
        if release_weights is None:
            release_weights = os.environ.get(RELEASE_ENV, "1") != "0"
        # Lite 2.0 opens the weights file of a large `.ms` model (`<name>.msw`) by its name relative
        # to the working directory, not to the model's folder: Build from inside that folder (a MindIR
        # too, for its external data). A `.ms` holding its weights builds anywhere, alongside others.
        weights_beside = os.path.exists(model + "w")
        in_folder = weights_beside or not model.endswith(".ms")
        with _working_directory(os.path.dirname(model)) if in_folder else contextlib.nullcontext():
            can_release = hasattr(self._lib, "lite_model_create_from_buffer")
            if not can_release:
                self.release_note = f"the shim {shim_path()} predates the release: run `lite-setup` again"
            if can_release and release_weights and model.endswith(".ms") and not weights_beside:
                failed = self._build_releasing(model, config, num_threads)
            else:
                failed = self._lib.lite_model_create(model.encode(), config, int(num_threads),
                                                     ctypes.byref(self._handle))
        if failed:
            text = _last_error(self._lib)
            raise ArtifactError(explain_lite_error(text, path)
                                or f"MindSpore Lite cannot load {path}"
                                + (f" with config {config_path}" if config_path else "") + f": {text}")
        self.load_seconds = time.perf_counter() - start
        _release_freed_memory()
        _page_out_lite_libraries()
        self._take_shapes()

    def _build_releasing(self, model: str, config: Optional[bytes], num_threads: int) -> int:
        """Build from the file mapped copy-on-write and never written (Lite copies it; the mapping's
        pages are dropped as Lite reads them), then release Lite's originals of the MatMul weights."""
        try:
            with open(model, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError):       # unreadable or empty: Lite's own load says why
            return self._lib.lite_model_create(model.encode(), config, int(num_threads), ctypes.byref(self._handle))
        view = ctypes.c_char.from_buffer(mapped)
        address, size = ctypes.addressof(view), len(mapped)
        try:
            before = lite_weights.anonymous_regions()
            with lite_weights.DropWhileBuilding(address, size):
                failed = self._lib.lite_model_create_from_buffer(model.encode(), address, size, config,
                                                                 int(num_threads), ctypes.byref(self._handle))
            if not failed:
                try:
                    self._released, self.release_note = lite_weights.release_packed_originals(address, size, before)
                except (OSError, struct.error, IndexError) as e:    # no /proc, or not a flatbuffer we read
                    self.release_note = f"not released: {e}"
        finally:
            del view
        if failed or self._released.copies:
            mapped.close()
        else:       # no copy of the file found: Lite may read the mapping, keep it while the model lives
            self._source = mapped
        return failed

    @property
    def released_bytes(self) -> int:
        """Bytes of Lite's original MatMul weights given back after Build (0: none, see release_note)."""
        return self._released.nbytes

    def _take_shapes(self, output_shapes: Optional[Sequence[Sequence[int]]] = None) -> None:
        """Read the tensors' shapes (at load and after a resize) and bind fresh output buffers, of
        `output_shapes` when given: after a resize Lite may report an output's new shape only once it
        has run (a Custom node's output whose input shape is known only then). Outputs of dynamic
        dimensions get their buffers at `resize`: Predict copies every output into its buffer, which
        costs less than a view of each in Lite's memory (docs/measured-choices.md)."""
        self.inputs: List[TensorSpec] = self._specs(is_output=0)
        self.outputs: List[TensorSpec] = self._specs(is_output=1)
        self._bound_inputs: List[Optional[np.ndarray]] = [None] * len(self.inputs)
        self._output_views = []
        shapes = [tuple(s.shape) for s in self.outputs] if output_shapes is None else output_shapes
        if any(d < 0 for shape in shapes for d in shape):
            return
        self._outputs = [np.empty(shape, s.dtype) for s, shape in zip(self.outputs, shapes)]
        for i, array in enumerate(self._outputs):
            self._call("lite_bind_output", i, array.ctypes.data, array.nbytes)
            view = array.view()
            view.flags.writeable = False
            self._output_views.append(view)

    def resize(self, shapes: Sequence[Sequence[int]], output_shapes: Sequence[Sequence[int]]) -> None:
        """New shapes for every input of a graph exported with dynamic dimensions, and the output
        shapes they give (the caller's contract: Lite 2.0 reports output shapes one call late).
        Drops all bindings: bind the inputs again."""
        if len(shapes) != len(self.inputs) or len(output_shapes) != len(self.outputs):
            raise ValueError(f"{self.path} has {len(self.inputs)} inputs and {len(self.outputs)} outputs, "
                             f"got {len(shapes)} and {len(output_shapes)} shapes")
        flat = [int(d) for shape in shapes for d in shape]
        dims = (ctypes.c_int64 * max(len(flat), 1))(*flat)
        ndims = (ctypes.c_int * len(shapes))(*[len(shape) for shape in shapes])
        self._call("lite_resize", dims, ndims)
        self._take_shapes([tuple(int(d) for d in shape) for shape in output_shapes])

    # --- introspection --------------------------------------------------------------------------
    def _specs(self, is_output: int) -> List[TensorSpec]:
        lib, specs = self._lib, []
        name, dtype, ndim = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_int()
        shape = (ctypes.c_int64 * _MAX_RANK)()
        for i in range(lib.lite_num_tensors(self._handle, is_output)):
            self._call("lite_tensor_info", is_output, i, ctypes.byref(name), ctypes.byref(dtype),
                       ctypes.byref(ndim), shape, _MAX_RANK)
            if dtype.value not in _DTYPES:
                kind = "output" if is_output else "input"
                raise UnsupportedError(f"{self.path}: {kind} {i} has MindSpore data type {dtype.value}, "
                                       f"which this binding does not map; supported: {sorted(_DTYPES.values())}")
            specs.append(TensorSpec(name.value.decode(), _DTYPES[dtype.value],
                                    tuple(int(shape[d]) for d in range(ndim.value))))
        return specs

    # --- binding and running --------------------------------------------------------------------
    def bind_input(self, index: int, array: np.ndarray) -> None:
        """Make input `index` read `array`'s memory from now on (no copy; a reference is kept)."""
        spec = self.inputs[index]
        if not isinstance(array, np.ndarray):
            raise TypeError(f"input {index} ({spec.name}) must be a numpy array, got {type(array).__name__}")
        if array.dtype != np.dtype(spec.dtype):
            raise ValueError(f"input {index} ({spec.name}) must have dtype {spec.dtype}, got {array.dtype}")
        if tuple(array.shape) != spec.shape:
            raise ValueError(f"input {index} ({spec.name}) must have shape {spec.shape}, got {tuple(array.shape)}")
        if not array.flags.c_contiguous:
            raise ValueError(f"input {index} ({spec.name}) must be C-contiguous to be bound without a copy; "
                             "pass np.ascontiguousarray(a) once and write into that array")
        self._call("lite_bind_input", index, array.ctypes.data, array.nbytes)
        self._bound_inputs[index] = array

    def bind_inputs(self, arrays: Sequence[np.ndarray]) -> None:
        if len(arrays) != len(self.inputs):
            raise ValueError(f"{self.path} has {len(self.inputs)} inputs "
                             f"({', '.join(s.name for s in self.inputs)}), got {len(arrays)} arrays")
        for i, array in enumerate(arrays):
            self.bind_input(i, array)

    def run(self) -> None:
        """The bare Predict call on the bound inputs and outputs (what a benchmark times)."""
        if self._lib.lite_predict(self._handle):
            raise LiteError(f"MindSpore Lite failed to run {self.path}: {_last_error(self._lib)}")

    def profile(self, runs: int = 100, by_name: bool = False) -> List[tuple]:
        """(kernel type [and name], kernels per run, microseconds per run) of `runs` Predicts on the
        bound inputs, slowest first, timed by Lite's per-kernel callbacks (which add a little)."""
        text = ctypes.create_string_buffer(1 << 20)
        self._call("lite_profile", runs, int(by_name), text, len(text))
        rows = [line.split("\t") for line in text.value.decode().splitlines()]
        return [(kind, int(count), float(us)) for kind, count, us in rows]

    def predict(self) -> List[np.ndarray]:
        if not self._output_views:
            raise LiteError(f"{self.path} has dynamic dimensions: call resize() with the output shapes first")
        self.run()
        return list(self._output_views)

    def close(self) -> None:
        if self._handle:
            self._released.restore()        # before Lite frees (and may reuse) its model copy
            self._lib.lite_model_free(self._handle)
            if getattr(self, "_source", None) is not None:
                self._source.close()
                self._source = None
            self._handle = None     # not ctypes.c_void_p(): at interpreter exit the module's globals may be gone
        self._bound_inputs = [None] * len(self.inputs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()

    def _call(self, name: str, *args) -> None:
        if not self._handle:
            raise LiteError(f"{self.path}: the model is closed")
        if getattr(self._lib, name)(self._handle, *args):
            raise LiteError(f"{self.path}: {name} failed: {_last_error(self._lib)}")
