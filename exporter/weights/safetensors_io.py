"""Reading `*.safetensors` into numpy with the `safetensors` library; bfloat16 tensors (numpy has no
bfloat16) are widened to float32 from their raw bits."""
from __future__ import annotations

import json
import struct
from typing import Dict, Set, Tuple

import numpy as np

from lite_runtime.contract.errors import WeightError

_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(path, framework="numpy") as f:
            dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
            if "BF16" not in dtypes.values():
                return {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise WeightError(f"cannot read safetensors file {path}: {e}") from None
    return _read_with_bf16(path)


def read_safetensors_part(path: str, cut: Dict[str, int], rank: int, parts: int,
                          float_dtype=np.float32) -> Tuple[Dict[str, np.ndarray], Set[str]]:
    """The tensors of `path`, those named in `cut` ({name: axis}) as block `rank` of `parts` along
    that axis only (read from the file without the rest); returns them and the names so cut. A file
    with bfloat16 tensors is read whole (the library's numpy view has no bfloat16), its bfloat16
    tensors as `float_dtype`.

    The library maps the whole file and every page a tensor is copied from stays resident while the
    file is open: each tensor is read under an opening of its own, so a shard is never held both as
    mapped pages and as arrays (measured: peak 2x the shard otherwise)."""
    from safetensors import SafetensorError, safe_open
    tensors, done = {}, set()
    try:
        with safe_open(path, framework="numpy") as f:
            names = list(f.keys())
            if any(f.get_slice(name).get_dtype() == "BF16" for name in names):
                return _read_with_bf16(path, float_dtype), done
        for name in names:
            with safe_open(path, framework="numpy") as f:
                axis = cut.get(name)
                view = f.get_slice(name)
                shape = view.get_shape()
                if axis is None or axis >= len(shape) or shape[axis] % parts:   # whole: sharding reports it
                    tensors[name] = f.get_tensor(name)
                    continue
                size = shape[axis] // parts
                index = tuple(slice(rank * size, (rank + 1) * size) if d == axis else slice(None)
                              for d in range(len(shape)))
                tensors[name] = view[index]
                done.add(name)
    except (SafetensorError, OSError, ValueError) as e:
        raise WeightError(f"cannot read safetensors file {path}: {e}") from None
    return tensors, done


def _read_with_bf16(path: str, float_dtype=np.float32) -> Dict[str, np.ndarray]:
    """Every tensor of a file holding bfloat16 ones, read one at a time; bfloat16 tensors become
    `float_dtype` (float16 for a float16 export: a 7B bfloat16 model is never widened to float32 whole)."""
    tensors = {}
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        base = 8 + header_len
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            dtype, shape = info["dtype"], tuple(info["shape"])
            if dtype != "BF16" and dtype not in _TYPES:
                raise WeightError(f"{path}: tensor {name} has dtype {dtype}; supported: BF16, {', '.join(_TYPES)}")
            f.seek(base + start)
            raw = np.fromfile(f, np.uint16 if dtype == "BF16" else _TYPES[dtype],
                              count=(end - start) // (2 if dtype == "BF16" else np.dtype(_TYPES[dtype]).itemsize))
            if dtype == "BF16":
                raw = widen_bfloat16(raw, float_dtype, f"{path}: tensor {name}")
            tensors[name] = raw.reshape(shape)
    return tensors


def widen_bfloat16(raw: np.ndarray, float_dtype, where: str) -> np.ndarray:
    """bfloat16 bits (uint16) as `float_dtype`; values beyond float16's range are refused, naming `where`."""
    wide = (raw.astype(np.uint32) << 16).view(np.float32)
    with np.errstate(over="ignore"):     # checked just below
        out = wide.astype(float_dtype)
    if float_dtype == np.float16 and np.isinf(out).any() and not np.isinf(wide).any():
        raise WeightError(f"{where} has values beyond float16's range (largest {np.abs(wide).max():.4g}); "
                          "export it with compute_dtype float32")
    return out
