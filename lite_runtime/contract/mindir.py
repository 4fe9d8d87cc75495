"""MindSpore-side helpers shared by the exporter and the `ms` backend: reading a MindIR file's inputs
and version with MindSpore's own protobuf schema, and the CPU graph-mode setup. Both import
mindspore only when called."""
from __future__ import annotations

from typing import List, Tuple

from lite_runtime.contract.errors import ArtifactError
from lite_runtime.contract.families import TensorSpec

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


def cpu_graph_mode(ms) -> None:
    """GRAPH mode on CPU: `set_device` from MindSpore 2.5 on (set_context's device_target is
    deprecated there); MindSpore 2.0, the Lite-compatible export environment, has only the latter."""
    ms.set_context(mode=ms.GRAPH_MODE)
    if ms.get_context("device_target") == "CPU":
        return   # already; setting it again after communication.init() is an error in 2.10
    if hasattr(ms, "set_device"):
        ms.set_device("CPU")
    else:
        ms.set_context(device_target="CPU")
