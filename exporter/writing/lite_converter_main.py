"""Runs under Python 3.7 with the `mindspore_lite` 2.0 wheel (its Python API exists only there):
  python lite_converter_main.py SRC.mindir DST.ms [SRC2.mindir DST2.ms ...]
converts each MindIR into Lite's own format. Imports nothing of the project.

`optimize="general"`: Lite's offline graph optimisations (equal outputs, measured). Inputs stay
NCHW: the converter's default NHWC would silently re-lay every 4-D input (the KV caches).
With LITE_KERNELS_LIB set, the project's custom kernels are registered first: the converter checks each
Custom node's type against Lite's registry ("Unsupported custom type" otherwise).
"""
import ctypes
import os
import sys


def register_kernels():
    path = os.environ.get("LITE_KERNELS_LIB")
    if not path:
        return
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)   # after mindspore_lite: it binds to Lite's loaded libraries
    lib.lk_last_error.restype = ctypes.c_char_p
    if lib.lk_register(0):
        raise SystemExit(f"error: {path}: {lib.lk_last_error().decode()}")


def main(pairs):
    import mindspore_lite as mslite
    register_kernels()
    converter = mslite.Converter()
    converter.optimize = "general"
    converter.input_format = mslite.Format.NCHW
    converter.save_type = mslite.ModelType.MINDIR_LITE
    for src, dst in pairs:
        if not dst.endswith(".ms"):
            raise SystemExit(f"error: {dst}: the output must end in .ms")
        converter.convert(mslite.FmkType.MINDIR, src, dst[:-len(".ms")])


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or len(args) % 2:
        raise SystemExit("usage: lite_converter_main.py SRC.mindir DST.ms [SRC DST ...]")
    main(list(zip(args[0::2], args[1::2])))
