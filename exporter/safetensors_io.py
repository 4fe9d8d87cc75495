"""Minimal safetensors reader to numpy, including bfloat16 (which numpy lacks: widened to float32)."""
from __future__ import annotations

import json
import struct
from typing import Dict

import numpy as np

from lite_runtime.errors import WeightError

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def load_safetensors(path: str) -> Dict[str, np.ndarray]:
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
            data = f.read()
    except (OSError, ValueError, struct.error) as e:
        raise WeightError(f"cannot read safetensors file {path}: {e}") from None
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[start:end]
        dtype, shape = info["dtype"], tuple(info["shape"])
        if dtype == "BF16":
            bits = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
            tensors[name] = bits.view(np.float32).reshape(shape)
        elif dtype in _DTYPES:
            tensors[name] = np.frombuffer(raw, _DTYPES[dtype]).reshape(shape)
        else:
            raise WeightError(f"{path}: tensor {name} has dtype {dtype}; supported: BF16, {', '.join(_DTYPES)}")
    return tensors
