"""Reading a MindSpore `.ckpt` tensor by tensor from a mapping of the file, without a second copy.

A checkpoint file is a sequence of protobuf `Checkpoint` messages (MindSpore's `checkpoint.proto`:
`Checkpoint {repeated Value value = 1}`, `Value {string tag = 1; TensorProto tensor = 2; MapTensorProto
maptensor = 3}`, `TensorProto {repeated int64 dims = 1; string tensor_type = 2; bytes tensor_content = 3}`),
optionally followed by `crc_num` and 10 bytes (`save_checkpoint(crc_check=True)`). MindSpore writes a
tensor over 512 MiB as several Values of one tag whose contents follow each other (row blocks).
`mindspore.load_checkpoint` parses the whole file into MindSpore tensors, and `asnumpy()` copies each
again: measured 2.0x the weights for an export. Here the file's structure is parsed from a mapping of
it (only the pages holding the fields are touched) and each tensor is read once, straight into an
array of its own (aligned, as MindSpore's `Tensor.from_numpy` needs; protobuf aligns nothing).
"""
from __future__ import annotations

import mmap
from typing import Dict, Iterator, List, Tuple

import numpy as np

from lite_runtime.contract.errors import WeightError
from exporter.weights.safetensors_io import widen_bfloat16

_TYPES = {"Int8": np.int8, "UInt8": np.uint8, "Int16": np.int16, "UInt16": np.uint16, "Int32": np.int32,
          "UInt32": np.uint32, "Int64": np.int64, "UInt64": np.uint64, "Float16": np.float16,
          "Float32": np.float32, "Float64": np.float64, "Bool": np.bool_, "BFloat16": np.uint16}
_CRC_TRAILER = b"crc_num"


class _Malformed(Exception):
    pass


def read_ckpt_file(path: str, skip=(), float_dtype=np.float32) -> Dict[str, np.ndarray]:
    """{tag: array} of the checkpoint at `path`, leaving out tags that start with one of `skip` and
    string values; bfloat16 tensors become `float_dtype`."""
    try:
        with open(path, "rb") as f:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                parts = _tensor_parts(data)
            tensors = {}
            for tag, (dims, kind, pieces) in parts.items():
                if tag.startswith(tuple(skip)) or kind == "str":
                    continue
                if kind not in _TYPES:
                    raise WeightError(f"{path}: tensor {tag} has type {kind}; supported: {', '.join(_TYPES)}")
                tensors[tag] = _read(f, path, tag, dims, kind, pieces, float_dtype)
    except (_Malformed, IndexError):
        raise WeightError(f"cannot read checkpoint {path}: it is not a MindSpore checkpoint (an encrypted "
                          "checkpoint must be decrypted first), or it is damaged") from None
    except (OSError, ValueError) as e:      # ValueError: an empty file cannot be mapped
        raise WeightError(f"cannot read checkpoint {path}: {getattr(e, 'strerror', None) or e}") from None
    return tensors


def _read(f, path: str, tag: str, dims: Tuple[int, ...], kind: str, pieces, float_dtype) -> np.ndarray:
    """The tensor whose content pieces are at `pieces` of file `f`, read into one new array."""
    dtype = np.dtype(_TYPES[kind])
    count = int(np.prod(dims, dtype=np.int64))
    size = sum(end - start for start, end in pieces)
    if size != count * dtype.itemsize:
        raise WeightError(f"{path}: tensor {tag} of shape {dims} ({kind}) holds {size} bytes; the file is damaged")
    array = np.empty(count, dtype)
    into, at = memoryview(array.view(np.uint8)), 0
    for start, end in pieces:
        f.seek(start)
        if f.readinto(into[at:at + end - start]) != end - start:
            raise _Malformed
        at += end - start
    if kind == "BFloat16":
        array = widen_bfloat16(array, float_dtype, f"{path}: tensor {tag}")
    return array.reshape(dims)


def _tensor_parts(data) -> Dict[str, Tuple[Tuple[int, ...], str, List[Tuple[int, int]]]]:
    """{tag: (dims, tensor_type, [(start, end) of each content piece])}, in file order."""
    parts: Dict[str, Tuple[Tuple[int, ...], str, List[Tuple[int, int]]]] = {}
    pos, size = 0, len(data)
    while pos < size:
        if data[pos:pos + len(_CRC_TRAILER)] == _CRC_TRAILER:
            break
        number, wire, start, end, pos = _field(data, pos)
        if number != 1 or wire != 2:
            raise _Malformed
        tag, tensor = None, None
        for n, w, s, e, _ in _fields(data, start, end):
            if n == 1 and w == 2:
                tag = bytes(data[s:e]).decode("utf-8")
            elif n == 2 and w == 2:
                tensor = (s, e)
        if tag is None:
            raise _Malformed
        if tensor is None:           # a map parameter (embedding tables of recommendation nets): not a weight
            continue
        dims, kind, content = [], "", (tensor[0], tensor[0])
        for n, w, s, e, value in _fields(data, *tensor):
            if n == 1 and w == 0:
                dims.append(value)
            elif n == 1 and w == 2:          # packed dims
                p = s
                while p < e:
                    value, p = _varint(data, p)
                    dims.append(value)
            elif n == 2 and w == 2:
                kind = bytes(data[s:e]).decode("ascii")
            elif n == 3 and w == 2:
                content = (s, e)
        if tag in parts:
            parts[tag][2].append(content)
        else:
            parts[tag] = (tuple(dims), kind, [content])
    return parts


def _fields(data, pos: int, end: int) -> Iterator[Tuple[int, int, int, int, int]]:
    while pos < end:
        number, wire, start, stop, pos = _field(data, pos)
        yield number, wire, start, stop, start if wire == 0 else 0
    if pos != end:
        raise _Malformed


def _field(data, pos: int):
    """(field number, wire type, start, end, next position); for a varint `start` is its value."""
    key, pos = _varint(data, pos)
    number, wire = key >> 3, key & 7
    if wire == 0:
        value, pos = _varint(data, pos)
        return number, wire, value, pos, pos
    if wire == 2:
        length, pos = _varint(data, pos)
        if pos + length > len(data):
            raise _Malformed
        return number, wire, pos, pos + length, pos + length
    if wire in (1, 5):
        step = 8 if wire == 1 else 4
        return number, wire, pos, pos + step, pos + step
    raise _Malformed


def _varint(data, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Malformed
