"""MindSpore-side helpers shared by the exporter and the `ms` backend: reading a MindIR file's inputs
and version with MindSpore's own protobuf schema, and the CPU graph-mode setup. Both import
mindspore only when called."""
from __future__ import annotations

import os
from typing import List, NamedTuple, Sequence

from lite_runtime.contract.errors import ArtifactError
from lite_runtime.contract.families import TensorSpec

# Measured: MindSpore Lite 2.0 (its runtime and its converter) refuses MindIR written by MindSpore >= 2.7.
FIRST_UNREADABLE_MINDSPORE = (2, 7)
SPLIT_GRAPH_SUFFIX = "_graph"   # MindSpore's `<name>_graph.mindir` beside `<name>_variables/` for large nets
_DTYPES = {"FLOAT": "float32", "FLOAT16": "float16", "INT32": "int32", "INT64": "int64", "BOOL": "bool",
           "DOUBLE": "float64", "INT8": "int8", "UINT8": "uint8"}


class MindIR(NamedTuple):
    inputs: List[TensorSpec]     # with the names the file records
    version: str                 # mind_ir_version
    data_files: List[str]        # files holding the weights as external data (MindSpore's
                                 # `<name>_variables/data_N` of a large net), relative to the graph's folder


def read_mindir(path: str) -> MindIR:
    """What the exporter and the runtime check of a MindIR graph file, from one parse."""
    from mindspore.train.mind_ir_pb2 import TensorProto
    model = _parse(path)
    inputs = []
    for value in model.graph.input:
        tensor = value.tensor[0]
        dtype = TensorProto.DataType.Name(tensor.data_type)
        inputs.append(TensorSpec(value.name, _DTYPES.get(dtype, dtype.lower()), tuple(tensor.dims)))
    data = sorted({t.external_data.location for t in _tensors(model) if t.HasField("external_data")})
    return MindIR(inputs, str(getattr(model, "mind_ir_version", "") or model.ir_version), data)


def nodes_reading(path: str, weights: Sequence[str], op_types: Sequence[str]) -> List[str]:
    """The full names (as MindIR records them, and Lite's converter matches them) of the nodes of
    `op_types` (MatMul, Gather, ...) that read one of the parameters `weights` (by their names in the
    network), directly or through a Load."""
    model = _parse(path)
    nodes = list(model.graph.node) + [n for g in model.functions for n in g.node]
    producers = {out: n for n in nodes for out in n.output}

    def parameter(name):
        source = producers.get(name)
        name = source.input[0] if source is not None and source.input else name
        return name.rsplit(":", 1)[-1]

    def op(node):        # "REF::MatMul:26" -> "MatMul"
        parts = node.op_type.split(":")
        return parts[-2] if len(parts) > 2 else node.op_type

    return [node.domain for node in nodes if op(node) in op_types and any(parameter(i) in weights for i in node.input)]


def _parse(path: str):
    from mindspore.train.mind_ir_pb2 import ModelProto
    model = ModelProto()
    try:
        with open(path, "rb") as f:
            model.ParseFromString(f.read())
    except Exception as e:  # protobuf raises its own DecodeError type
        raise ArtifactError(f"{path} is not a readable MindIR file: {e}") from None
    return model


def _tensors(model) -> list:
    return list(model.graph.parameter) + [p for g in model.functions for p in g.parameter]


def write_relocated(src: str, dest: str, data_folder: str) -> dict:
    """Write the graph `src` to `dest` with each external data file it names moved into
    `data_folder` (relative to `dest`'s folder, same file names); returns {old location: new}."""
    model = _parse(src)
    moved = {}
    for tensor in _tensors(model):
        if tensor.HasField("external_data"):
            old = tensor.external_data.location
            moved[old] = tensor.external_data.location = os.path.join(data_folder, os.path.basename(old))
    with open(dest, "wb") as f:
        f.write(model.SerializeToString())
    return moved


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
