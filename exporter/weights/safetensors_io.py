"""Reading `*.safetensors` into numpy with the `safetensors` library; bfloat16 tensors (numpy has no
bfloat16) are widened to float32 from their raw bits."""
from __future__ import annotations

import json
import struct
from typing import Dict

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


def _read_with_bf16(path: str) -> Dict[str, np.ndarray]:
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw, dtype, shape = data[start:end], info["dtype"], tuple(info["shape"])
        if dtype == "BF16":
            tensors[name] = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
        elif dtype in _TYPES:
            tensors[name] = np.frombuffer(raw, _TYPES[dtype]).reshape(shape)
        else:
            raise WeightError(f"{path}: tensor {name} has dtype {dtype}; supported: BF16, {', '.join(_TYPES)}")
    return tensors
