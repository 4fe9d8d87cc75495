"""Read a MindIR file's inputs and version with MindSpore's own protobuf schema (needs mindspore)."""
from __future__ import annotations

from typing import List, Tuple

from ..errors import ArtifactError
from ..families import TensorSpec

_DTYPES = {"FLOAT": "float32", "FLOAT16": "float16", "INT32": "int32", "INT64": "int64", "BOOL": "bool",
           "DOUBLE": "float64", "INT8": "int8", "UINT8": "uint8"}


def read_mindir_io(path: str) -> Tuple[List[TensorSpec], str]:
    """(inputs as TensorSpec with the names the file records, mind_ir_version as a string)."""
    from mindspore.train.mind_ir_pb2 import ModelProto, TensorProto
    model = ModelProto()
    try:
        with open(path, "rb") as f:
            model.ParseFromString(f.read())
    except Exception as e:  # protobuf raises its own DecodeError type
        raise ArtifactError(f"{path} is not a readable MindIR file: {e}") from None
    inputs = []
    for value in model.graph.input:
        tensor = value.tensor[0]
        dtype = TensorProto.DataType.Name(tensor.data_type)
        inputs.append(TensorSpec(value.name, _DTYPES.get(dtype, dtype.lower()), tuple(tensor.dims)))
    return inputs, str(getattr(model, "mind_ir_version", "") or model.ir_version)
