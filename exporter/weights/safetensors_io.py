"""Reading `*.safetensors` into numpy with the `safetensors` library; bfloat16 tensors (numpy has no
bfloat16) are widened to float32 from their raw bits."""
from __future__ import annotations

import functools
import json
import struct
from typing import Dict, Set, Tuple

import numpy as np

from lite_runtime.contract.errors import WeightError
from exporter.weights.lazy_tensors import LazyTensors

_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Every tensor of `path` (bfloat16 ones as float32)."""
    return dict(read_safetensors_part(path, {}, 0, 1)[0].items())


def read_safetensors_part(path: str, cut: Dict[str, int], rank: int, parts: int,
                          float_dtype=np.float32) -> Tuple[LazyTensors, Set[str]]:
    """The tensors of `path`, each read when taken, those named in `cut` ({name: axis}) as block `rank`
    of `parts` along that axis only; returns them and the names so cut. bfloat16 tensors (the library's
    numpy view has none) are read from their raw bits as `float_dtype`.

    The library maps the whole file and every page a tensor is copied from stays resident while the
    file is open: each tensor is read under an opening of its own, so a shard is never held both as
    mapped pages and as arrays (measured: peak 2x the shard otherwise)."""
    header = _header(path)
    tensors, done = LazyTensors(), set()
    for name, info in header.items():
        shape, axis = tuple(info["shape"]), cut.get(name)
        index = None
        if axis is not None and axis < len(shape) and not shape[axis] % parts:   # else whole: sharding reports it
            size = shape[axis] // parts
            index = tuple(slice(rank * size, (rank + 1) * size) if d == axis else slice(None)
                          for d in range(len(shape)))
            done.add(name)
        tensors.add(name, functools.partial(_read_one, path, name, info, index, float_dtype))
    return tensors, done


def _header(path: str) -> Dict[str, dict]:
    """name -> {dtype, shape, data_offsets} of a safetensors file, its dtypes checked."""
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
    except (OSError, ValueError, struct.error) as e:
        raise WeightError(f"cannot read safetensors file {path}: {e}") from None
    header.pop("__metadata__", None)
    for name, info in header.items():
        if info["dtype"] != "BF16" and info["dtype"] not in _TYPES:
            raise WeightError(f"{path}: tensor {name} has dtype {info['dtype']}; supported: BF16, {', '.join(_TYPES)}")
        info["base"] = 8 + header_len
    return header


def _read_one(path: str, name: str, info: dict, index, float_dtype) -> np.ndarray:
    from safetensors import SafetensorError, safe_open
    try:
        if info["dtype"] == "BF16":
            start, end = info["data_offsets"]
            with open(path, "rb") as f:
                f.seek(info["base"] + start)
                raw = np.fromfile(f, np.uint16, count=(end - start) // 2).reshape(info["shape"])
            raw = raw[index] if index is not None else raw
            return widen_bfloat16(raw, float_dtype, f"{path}: tensor {name}")
        with safe_open(path, framework="numpy") as f:
            return f.get_slice(name)[index] if index is not None else f.get_tensor(name)
    except (SafetensorError, OSError, ValueError) as e:
        raise WeightError(f"cannot read safetensors file {path}: {e}") from None


def widen_bfloat16(raw: np.ndarray, float_dtype, where: str) -> np.ndarray:
    """bfloat16 bits (uint16) as `float_dtype`; values beyond float16's range are refused, naming `where`."""
    wide = (raw.astype(np.uint32) << 16).view(np.float32)
    with np.errstate(over="ignore"):     # checked just below
        out = wide.astype(float_dtype)
    if float_dtype == np.float16 and np.isinf(out).any() and not np.isinf(wide).any():
        raise WeightError(f"{where} has values beyond float16's range (largest {np.abs(wide).max():.4g}); "
                          "export it with compute_dtype float32")
    return out
