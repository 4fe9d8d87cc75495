"""Linear layers that know their tensor-parallel share, and the one place collectives enter.

Each parallel layer records how its full weights split across ranks (`SPLIT` rules), so the
weight sharder asks the network, never a table of names. Only primitives that compile under
MindSpore 2.10 and 2.0 and run on Lite 2.0 CPU are used.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
from mindspore import Parameter, Tensor, nn, ops


def zeros_param(shape, dtype, name: str) -> Parameter:
    """A parameter that stays zeros (the in-graph KV cache)."""
    return Parameter(Tensor(np.zeros(shape, np.float32), dtype), name=name)


def weight_param(shape, dtype, name: str) -> Parameter:
    """A weight the loader sets: a one-element placeholder until then, so a model-sized array of
    zeros is never held beside the weights; its shape is kept as `full_shape` for the loader."""
    param = Parameter(Tensor(np.zeros((1,) * len(shape), np.float32), dtype), name=name)
    param.full_shape = tuple(shape)
    return param


class Linear(nn.Cell):
    """y = x @ W.T (+ b) with W stored (out, in); `x` may be (B, T, in).

    `split` maps this layer's parameter names to the axis its full tensor is split along under
    tensor parallelism (absent: replicated on every rank).

    With `lora_width` (adapter slots x largest rank) the layer also holds every LoRA adapter of an
    SLoRA export side by side: A (slots·r, in) and B (out, slots·r), alpha/r folded into B, slot 0
    zeros (the base model). `select` (tokens, slots·r), 1 on the columns of each token's adapter,
    keeps one adapter per token: y += ((x A.T) * select) B.T, two dense products, no gathers.
    """

    split: Dict[str, int] = {}

    def __init__(self, in_features: int, out_features: int, dtype, bias: bool = False,
                 reduce: Optional[nn.Cell] = None, flat: bool = False, lora_width: int = 0):
        super().__init__()
        self.flat = flat          # inputs are (tokens, in): the packed step's layout, no reshapes
        self.in_features = in_features
        self.out_features = out_features
        self.weight = weight_param((out_features, in_features), dtype, "weight")
        self.has_bias = bias
        if bias:
            self.bias = weight_param((out_features,), dtype, "bias")
        self.lora = lora_width > 0
        if self.lora:
            self.lora_a = weight_param((lora_width, in_features), dtype, "lora_a")
            self.lora_b = weight_param((out_features, lora_width), dtype, "lora_b")
        self.matmul = ops.MatMul(transpose_b=True)
        self.reshape = ops.Reshape()
        self.shape = ops.Shape()
        self.reduce = reduce if reduce is not None else nn.Identity()
        self.kernel = None        # a KernelProduct in place of `weight` (LinearKernels)

    def _product(self, x, select):
        y = self.matmul(x, self.weight) if self.kernel is None else self.kernel(x)
        if self.lora and select is not None:     # before the reduction: a row-parallel share is partial
            y = y + self.matmul(self.matmul(x, self.lora_a) * select, self.lora_b)
        return self.reduce(y)

    def construct(self, x, select=None):
        if self.flat:
            y = self._product(x, select)
            return y + self.bias if self.has_bias else y
        lead = self.shape(x)[:-1]
        y = self._product(self.reshape(x, (-1, self.in_features)), select)
        if self.has_bias:
            y = y + self.bias     # after the reduction: a row-parallel bias is added once
        return self.reshape(y, lead + (self.out_features,))


class KernelProduct(nn.Cell):
    """x . W^T as a Custom node run by the project's Lite kernels, W in one of their storages
    (lite_runtime/contract/quant.py) as the node's constant inputs, named after the layer's weight.
    `lookup`: an embedding's table instead (int8, or float32 that a tied head reads), whose rows the node
    gathers for ids; `table_product` is then the product a tied head runs on it."""

    NAMES = ("weight", "weight_scale", "weight_min")

    def __init__(self, storage: str, constants, lookup: bool = False):
        super().__init__()
        from exporter.models.kernels import gather_op, linear_op
        self.op = gather_op(storage) if lookup else linear_op(storage)
        # a tied head's product on the table as it is stored (decoder.py)
        self.table_product = linear_op(storage) if lookup else None
        self.count = len(constants)
        for name, array in zip(self.NAMES, constants):
            setattr(self, name, Parameter(Tensor.from_numpy(np.ascontiguousarray(array)), name=name,
                                          requires_grad=False))
        for name in self.NAMES[self.count:]:
            setattr(self, name, None)

    def construct(self, x):
        if self.count == 1:
            return self.op(x, self.weight)
        if self.count == 2:
            return self.op(x, self.weight, self.weight_scale)
        return self.op(x, self.weight, self.weight_scale, self.weight_min)


class QuantizedWeight:
    """A Linear's weight in a kernel storage: `quant.quantize`'s storage name and constant inputs, and the
    float weight's shape (what the loader checks)."""

    def __init__(self, storage: str, constants, shape):
        self.storage, self.constants, self.shape = storage, constants, tuple(shape)


class LinearKernels:
    """The Linear layers of `net` that an export runs on the project's kernels, their weights quantized by
    `scheme` (quant.WEIGHT_SCHEMES; "float32": the float32 kernel), the head's by `head` (quant.HEAD_SCHEMES;
    "float32": the float32 kernel), so that Lite's own ops are left only small products; and with
    `embedding` int8 the token embedding's table, looked up by a kernel; so is a float32 table a tied head
    reads, stored as the head's GEMM panels (faster than the table by rows: docs/measured-choices.md).

    `finish` quantizes a weight as soon as the reader has it in the layer's shape, so a model is never
    held in float32 whole (a 7B one would take 27 GB); `place` makes the layer a KernelProduct of it.
    Biases and LoRA adapters stay float32 MatMuls."""

    def __init__(self, net: nn.Cell, scheme: str, group_size: int, head: str = "float32",
                 embedding: str = "float32"):
        self.scheme = scheme
        self.group_size = group_size
        table = embedding == "int8" or net.head_is_embedding
        self.cells = {f"{name}.weight": cell for name, cell in net.cells_and_names()
                      if (isinstance(cell, Linear) or name == "embed" and table) and cell.kernel is None}
        # a layer's own scheme, where it is not `scheme`
        self.schemes = {"head.weight": head, "embed.weight": embedding}

    def takes(self, name: str) -> bool:
        return name in self.cells

    def finish(self, name: str, array):
        """`array` quantized when it is the weight of one of these layers in the layer's own shape; as it is
        otherwise (a tensor-parallel weight read whole is quantized once cut, by `place`)."""
        cell = self.cells.get(name)
        if cell is None or isinstance(array, QuantizedWeight) or tuple(array.shape) != cell.weight.full_shape:
            return array
        from lite_runtime.contract.errors import WeightError
        from exporter.weights.quantize import quantize
        scheme = self.schemes.get(name, self.scheme)
        try:
            storage, constants = quantize(np.asarray(array, np.float32), scheme, self.group_size)
        except ValueError as e:      # a value the scheme cannot hold
            raise WeightError(f"{name}: {e}; export it with quantization.weights float32, or int8 with group_size -1 "
                              "(float32 scales)") from None
        return QuantizedWeight(storage, constants, array.shape)

    def place(self, name: str, value) -> None:
        cell = self.cells[name]
        value = self.finish(name, value)
        del cell.weight
        cell.kernel = KernelProduct(value.storage, value.constants, lookup=isinstance(cell, Embedding))
        for param_name in KernelProduct.NAMES[:len(value.constants)]:    # after attaching, which renames them
            getattr(cell.kernel, param_name).name = f"{name[:-len('.weight')]}.{param_name}"


class ColumnParallelLinear(Linear):
    """Each rank holds `out_features / world_size` output rows (and their bias); outputs stay sharded."""

    split = {"weight": 0, "bias": 0, "lora_b": 0}

    def __init__(self, in_features: int, out_features: int, world_size: int, dtype, bias: bool = False,
                 flat: bool = False, lora_width: int = 0):
        super().__init__(in_features, out_features // world_size, dtype, bias, flat=flat, lora_width=lora_width)


class RowParallelLinear(Linear):
    """Each rank holds `in_features / world_size` input columns; partial sums are all-reduced,
    then the (replicated) bias is added."""

    split = {"weight": 1, "lora_a": 1}

    def __init__(self, in_features: int, out_features: int, world_size: int, dtype, bias: bool = False,
                 flat: bool = False, lora_width: int = 0, reduce: bool = True):
        """`reduce` False: the partial sums leave the graph (the segment form reduces them on the host)."""
        super().__init__(in_features // world_size, out_features, dtype, bias,
                         Collective.all_reduce(world_size if reduce else 1), flat, lora_width)


class Embedding(nn.Cell):
    """Table lookup; the table is replicated on every rank."""

    def __init__(self, rows: int, dim: int, dtype, dynamic: bool = False):
        super().__init__()
        self.weight = weight_param((rows, dim), dtype, "weight")
        self.gather = ops.Gather()
        # Lite 2.0 builds a gather in a graph with dynamic dimensions only with the axis as a tensor
        self.axis = Tensor(np.array([0], np.int32)) if dynamic else 0
        self.kernel = None        # a KernelProduct lookup of an int8 table in place of `weight` (LinearKernels)

    def construct(self, ids):
        if self.kernel is not None:
            return self.kernel(ids)
        return self.gather(self.weight, ids, self.axis)


def world_group() -> str:
    """The communication group the collectives of rank graphs name. Rank graphs are traced rank after
    rank in one process, with no communication initialised (MindSpore builds AllReduce without it):
    MindSpore 2.0 exports are Lite's, which runs collectives only on Ascend under GE (HCCL's world
    group); later versions' are the `ms` backend's, which runs them on CPU with MindSpore's own
    collective library (MCCL's world group)."""
    import mindspore
    return "hccl_world_group" if mindspore.__version__.startswith("2.0.") else "mccl_world_group"


class Collective:
    """The one place collectives enter the model; identity cells for a single rank."""

    @staticmethod
    def all_reduce(world_size: int) -> nn.Cell:
        return _AllReduce() if world_size > 1 else nn.Identity()

    @staticmethod
    def gather_last_dim(world_size: int, rank: int, part: int) -> nn.Cell:
        """(B, part) on each rank -> (B, world_size * part), rank r's columns at r * part."""
        return _GatherLastDim(world_size, rank, part) if world_size > 1 else nn.Identity()


class _AllReduce(nn.Cell):
    def __init__(self):
        super().__init__()
        self.op = ops.AllReduce(group=world_group())

    def construct(self, x):
        return self.op(x)


class _GatherLastDim(nn.Cell):
    """(B, V/N) on each rank -> (B, V): the rank's columns placed at its offset in zeros, then summed
    over the ranks. An all-reduce rather than AllGather, whose construction needs an initialised
    communication group; the extra (N-1)/N of B x V floats per step is small beside the weights."""

    def __init__(self, world_size: int, rank: int, part: int):
        super().__init__()
        self.pad = ops.Pad(((0, 0), (rank * part, (world_size - 1 - rank) * part)))
        self.reduce = _AllReduce()

    def construct(self, x):
        return self.reduce(self.pad(x))


def split_rules(net: nn.Cell) -> Dict[str, int]:
    """Full parameter name -> split axis, for every parameter of a parallel layer in `net`."""
    rules = {}
    for prefix, cell in net.cells_and_names():
        for name, axis in getattr(type(cell), "split", {}).items():
            if isinstance(cell, Linear) and name == "bias" and not cell.has_bias:
                continue
            rules[f"{prefix}.{name}" if prefix else name] = axis
    return rules
