"""The project's custom Lite kernels (`liblite_kernels.so`, built by `lite-setup` beside the shim from
lite_runtime/backends/native/lite_kernels.cc): loaded with RTLD_GLOBAL and registered with Lite before
any Build (the registry is the process's: one registration serves every model after it).

    register()                    # before the first Build; load_shim() then LiteModel do it
    linear(x, "int8", [q, scale]) # the kernels' product without Lite (tests, benchmarks)
    attend(q, k, v, ...)          # the packed call's attention without Lite

The kernels use the threads `set_threads` gives them, else the thread count of Lite's context
(`num_threads`); LITE_KERNELS_THREADS caps it (1: the kernels run on Lite's calling thread alone).
Standard library, numpy and the light contract modules only: the converter's Python 3.7 loads this file
too (lite_converter_main.py), with the library's path in LITE_KERNELS_LIB.
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional, Sequence

LIBRARY_ENV = "LITE_KERNELS_LIB"
LIBRARY_NAME = "liblite_kernels.so"
_lib = None
_registered = set()


def library_path(shim: str) -> str:
    """The kernel library beside `shim` (or $LITE_KERNELS_LIB), '' when there is none."""
    path = os.environ.get(LIBRARY_ENV) or (os.path.join(os.path.dirname(shim), LIBRARY_NAME) if shim else "")
    return path if path and os.path.isfile(path) else ""


def load(path: str):
    """Load the library once per process (after Lite's own libraries: it binds to the ones loaded)."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        lib.lk_last_error.restype = ctypes.c_char_p
        lib.lk_isa.restype = ctypes.c_char_p
        lib.lk_types.restype = ctypes.c_char_p
        lib.lk_register.argtypes = [ctypes.c_int]
        lib.lk_register.restype = ctypes.c_int
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        lib.lk_linear.argtypes = [ctypes.c_int, vp, i64, i64, vp, vp, vp, i64, i64, vp, ctypes.c_int, ctypes.c_int]
        lib.lk_linear.restype = ctypes.c_int
        lib.lk_set_threads.argtypes = [ctypes.c_int]
        lib.lk_set_threads.restype = None
        lib.lk_set_int8_activations.argtypes = [ctypes.c_int]
        lib.lk_set_int8_activations.restype = ctypes.c_int
        lib.lk_gather.argtypes = [ctypes.c_int, vp, i64, vp, vp, i64, i64, i64, vp]
        lib.lk_gather.restype = ctypes.c_int
        lib.lk_attend.argtypes = [vp] * 7 + [ctypes.c_float] + [i64] * 6 + [vp, ctypes.c_int]
        lib.lk_attend.restype = ctypes.c_int
        lib.lk_kv_create.argtypes = [i64] * 5 + [ctypes.c_int]
        lib.lk_kv_create.restype = i64
        lib.lk_kv_free.argtypes = [i64]
        lib.lk_kv_copy_block.argtypes = [i64, i64, i64]
        lib.lk_kv_bytes.argtypes = [i64]
        lib.lk_kv_bytes.restype = i64
        lib.lk_kv_read.argtypes = [i64, i64, i64, vp, vp]
        lib.lk_paged_attend.argtypes = [vp] * 5 + [i64] * 4 + [vp, ctypes.c_float] + [i64] * 4 + [vp, ctypes.c_int]
        lib.lk_read.argtypes = [vp, i64, ctypes.c_int]
        lib.lk_read.restype = ctypes.c_uint64
        _lib = lib
    return _lib


def register(path: str, op_info: bool = True) -> None:
    """Register every kernel (and, with `op_info`, the entries a MindIR Build needs) with Lite."""
    lib = load(path)
    key = bool(op_info)
    if key in _registered:
        return
    if lib.lk_register(int(op_info)):
        raise RuntimeError(f"{path}: {lib.lk_last_error().decode()}")
    _registered.add(key)


def loaded():
    return _lib


def types() -> Sequence[str]:
    """The Custom op types the loaded library runs (empty when none is loaded)."""
    return _lib.lk_types().decode().split(",") if _lib is not None else []


def isa() -> str:
    return _lib.lk_isa().decode() if _lib is not None else ""


def set_threads(threads: int) -> None:
    """The threads every kernel call takes from now on, whatever Lite's context has (0: the context's)."""
    if _lib is None:
        raise RuntimeError("the kernel library is not loaded")
    _lib.lk_set_threads(int(threads))


def set_int8_activations(on: bool) -> bool:
    """From now on, in this process, grouped int8 products (`weights: int8` in groups of 32) on activations
    quantized to int8 alike (llama.cpp's Q8_0 products, on AVX512-VNNI: native/linear_int8.cc), or on float32
    activations; returns whether they are on (False where the CPU lacks VNNI)."""
    if _lib is None:
        raise RuntimeError("the kernel library is not loaded")
    return bool(_lib.lk_set_int8_activations(int(bool(on))))


def linear(x, storage: str, constants: Sequence, threads: int = 1, out=None, lite_workers: bool = False):
    """y (..., N) = x (..., K) . W^T with W in `storage` (contract.quant.OP_TYPES) given as the graph's
    constant inputs after x (quant.quantize). `lite_workers`: as beside Lite's own workers (decode-sized
    calls on one thread). Needs the library loaded (`load`)."""
    import numpy as np
    from lite_runtime.contract.quant import HALF_SCALES, KIND_CODES
    if _lib is None:
        raise RuntimeError("the kernel library is not loaded")
    x = np.ascontiguousarray(x, np.float32)
    w = np.ascontiguousarray(constants[0])
    int4 = storage.startswith("int4")
    halves = storage in HALF_SCALES     # its scales and mins: float16 bits as int8 pairs
    kept = np.int8 if halves else np.float32
    scale: Optional[np.ndarray] = np.ascontiguousarray(constants[1], kept) if len(constants) > 1 else None
    mins: Optional[np.ndarray] = np.ascontiguousarray(constants[2], kept) if len(constants) > 2 else None
    n = w.shape[0]
    k = x.shape[-1]
    m = x.size // k
    expected = -(-k // 32) * 16 if int4 else k
    if w.ndim != 2 or w.shape[1] != expected:
        raise ValueError(f"x (..., {k}) does not fit a {storage} weight of shape {w.shape}: "
                         f"expected (N, {expected})")
    y = out if out is not None else np.empty(x.shape[:-1] + (n,), np.float32)
    groups = scale.size // n // (2 if halves else 1) if scale is not None else 0
    address = lambda a: a.ctypes.data if a is not None else None
    if _lib.lk_linear(KIND_CODES[storage], address(x), m, k, address(w), address(scale), address(mins), n, groups,
                      address(y), int(threads), int(lite_workers)):
        raise ValueError(_lib.lk_last_error().decode())
    return y


def gather(ids, storage: str, constants: Sequence):
    """out (ids' shape, H): the rows `ids` of a table (V, H) in a linear storage, "int8" (times its scales),
    "int8_group" (each group times its scale) or "float32_p16" (the embedding's lookups,
    contract.quant.GATHER_TYPES), given as the graph's constant inputs after the ids. Needs the library loaded
    (`load`)."""
    import numpy as np
    from lite_runtime.contract.quant import GATHER_TYPES, HALF_SCALES, KIND_CODES
    if _lib is None:
        raise RuntimeError("the kernel library is not loaded")
    if storage not in GATHER_TYPES:
        raise ValueError(f"a lookup reads {', '.join(GATHER_TYPES)} tables, not {storage}")
    ids = np.ascontiguousarray(ids, np.int32)
    table = np.ascontiguousarray(constants[0], np.float32 if storage == "float32_p16" else np.int8)
    scale = None if storage == "float32_p16" else \
        np.ascontiguousarray(constants[1], np.int8 if storage in HALF_SCALES else np.float32)
    groups = scale.size // table.shape[0] // 2 if storage in HALF_SCALES else 0
    out = np.empty(ids.shape + (table.shape[1],), np.float32)
    if _lib.lk_gather(KIND_CODES[storage], ids.ctypes.data, ids.size, table.ctypes.data,
                      scale.ctypes.data if scale is not None else None, table.shape[0], table.shape[1], groups,
                      out.ctypes.data):
        raise ValueError(_lib.lk_last_error().decode())
    return out


def attend(q, k, v, k_cache, v_cache, meta, slopes, scale: float, threads: int = 1):
    """The packed call's attention (LiteAttend, native/attention_math.h): out (N, kv·g·hd) from q (N, kv, g, hd),
    the call's new keys and values (N, kv, hd), the caches K (B, kv, hd, P) and V (B, kv, P, hd), meta (N, 4)
    (row, position, past, context or -1) and the slopes (kv·g,). Needs the library loaded (`load`)."""
    import numpy as np
    if _lib is None:
        raise RuntimeError("the kernel library is not loaded")
    arrays = [np.ascontiguousarray(a, np.float32) for a in (q, k, v, k_cache, v_cache, meta, slopes)]
    n, kv, g, hd = arrays[0].shape
    b, p = arrays[3].shape[0], arrays[3].shape[3]
    out = np.empty((n, kv * g * hd), np.float32)
    if _lib.lk_attend(*(a.ctypes.data for a in arrays), float(scale), n, b, kv, g, hd, p, out.ctypes.data,
                      int(threads)):
        raise ValueError(_lib.lk_last_error().decode())
    return out


KV_DTYPE_CODES = {"float32": 0, "float16": 1, "int8": 2}     # native/attention_math.h kKvFloat32 ...


class KVStore:
    """A paged KV store of the kernels (native/paged_attention_kernel.cc): `blocks` blocks of `block` positions
    for each of `layers` layers of `kv` heads of `hd`, float16, float32 or int8 (a scale per 32 values of a position and head),
    allocated once, resident as blocks are written. Its `id` is what the graphs' paged attention nodes are fed.
    Needs the library loaded."""

    def __init__(self, layers: int, blocks: int, block: int, kv: int, hd: int, dtype: str = "float16"):
        if _lib is None:
            raise RuntimeError("the kernel library is not loaded")
        self.layers, self.blocks, self.block, self.kv, self.hd, self.dtype = layers, blocks, block, kv, hd, dtype
        self.id = _lib.lk_kv_create(layers, blocks, block, kv, hd, KV_DTYPE_CODES[dtype])
        if self.id < 0:
            raise ValueError(_lib.lk_last_error().decode())

    @property
    def nbytes(self) -> int:
        """The bytes it holds: values and, int8, their scales."""
        size = _lib.lk_kv_bytes(self.id)
        if size < 0:
            raise ValueError(_lib.lk_last_error().decode())
        return size

    def copy_block(self, src: int, dst: int) -> None:
        if _lib.lk_kv_copy_block(self.id, src, dst):
            raise ValueError(_lib.lk_last_error().decode())

    def read(self, layer: int, block: int):
        """(keys (kv, hd, block), values (kv, block, hd)) of one block, float32."""
        import numpy as np
        keys = np.empty((self.kv, self.hd, self.block), np.float32)
        values = np.empty((self.kv, self.block, self.hd), np.float32)
        if _lib.lk_kv_read(self.id, layer, block, keys.ctypes.data, values.ctypes.data):
            raise ValueError(_lib.lk_last_error().decode())
        return keys, values

    def close(self) -> None:
        if self.id >= 0 and _lib is not None:
            _lib.lk_kv_free(self.id)
            self.id = -1


def paged_attend(q, k, v, meta, tables, store: KVStore, layer: int, slopes, scale: float, threads: int = 1):
    """The paged attention node of `layer` (LitePagedAttend, native/attention_math.h PagedArgs): writes the call's
    keys and values (N, kv, hd) into `store` at each token's row (its blocks: `tables` (B, T)) and position, then
    returns out (N, kv·g·hd) from q (N, kv, g, hd) over each row's positions up to the token's own (meta (N, 4):
    row, position, past, context or -1)."""
    import numpy as np
    arrays = [np.ascontiguousarray(a, np.float32) for a in (q, k, v, meta, tables)]
    slopes = np.ascontiguousarray(slopes, np.float32)
    n, kv, g, hd = arrays[0].shape
    b, t = arrays[4].shape
    out = np.empty((n, kv * g * hd), np.float32)
    if _lib.lk_paged_attend(*(a.ctypes.data for a in arrays), b, t, store.id, layer, slopes.ctypes.data, float(scale),
                            n, kv, g, hd, out.ctypes.data, int(threads)):
        raise ValueError(_lib.lk_last_error().decode())
    return out
