"""Building blocks of decoder models, tensor-parallel-ready.

Only primitives that compile under MindSpore 2.10 and 2.0 and run on Lite 2.0 CPU are used
(notes/lite-on-cpu.md): no Assign/ScatterUpdate in `io` graphs, no LayerNorm op, no lambdas.
Every linear layer knows its rank's share; the one place that joins shards is `Collective`,
which is the identity when world size is 1.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops


def zeros_param(shape, dtype, name: str) -> Parameter:
    # Placeholder values: every weight is overwritten by the loader, which checks none is left.
    return Parameter(Tensor(np.zeros(shape, np.float32), dtype), name=name)


class Linear(nn.Cell):
    """y = x @ W.T with W stored (out, in); `x` may be (B, T, in)."""

    def __init__(self, in_features: int, out_features: int, dtype, reduce: nn.Cell = None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = zeros_param((out_features, in_features), dtype, "weight")
        self.matmul = ops.MatMul(transpose_b=True)
        self.reshape = ops.Reshape()
        self.shape = ops.Shape()
        self.reduce = reduce if reduce is not None else nn.Identity()

    def construct(self, x):
        lead = self.shape(x)[:-1]
        y = self.matmul(self.reshape(x, (-1, self.in_features)), self.weight)
        return self.reduce(self.reshape(y, lead + (self.out_features,)))


class ColumnParallelLinear(Linear):
    """Each rank holds `out_features / world_size` output rows; outputs stay sharded."""

    def __init__(self, in_features: int, out_features: int, world_size: int, dtype):
        super().__init__(in_features, out_features // world_size, dtype)


class RowParallelLinear(Linear):
    """Each rank holds `in_features / world_size` input columns; partial sums are all-reduced."""

    def __init__(self, in_features: int, out_features: int, world_size: int, dtype):
        super().__init__(in_features // world_size, out_features, dtype, Collective.all_reduce(world_size))


class Collective:
    """The one place collectives enter the model; identity cells for a single rank."""

    @staticmethod
    def all_reduce(world_size: int) -> nn.Cell:
        return _AllReduce() if world_size > 1 else nn.Identity()

    @staticmethod
    def gather_last_dim(world_size: int) -> nn.Cell:
        return _GatherLastDim(world_size) if world_size > 1 else nn.Identity()


class _AllReduce(nn.Cell):
    def __init__(self):
        super().__init__()
        self.op = ops.AllReduce()

    def construct(self, x):
        return self.op(x)


class _GatherLastDim(nn.Cell):
    """(B, V/N) on each rank -> (B, V): AllGather stacks along dim 0, so reorder afterwards."""

    def __init__(self, world_size: int):
        super().__init__()
        self.world_size = world_size
        self.op = ops.AllGather()
        self.reshape = ops.Reshape()
        self.transpose = ops.Transpose()
        self.shape = ops.Shape()

    def construct(self, x):
        batch, part = self.shape(x)
        y = self.reshape(self.op(x), (self.world_size, batch, part))
        return self.reshape(self.transpose(y, (1, 0, 2)), (batch, self.world_size * part))


class RMSNorm(nn.Cell):
    """Computed in float32 whatever the compute dtype, as Llama does.

    Divides by Sqrt rather than multiplying by Rsqrt: Lite 2.0's CPU Rsqrt is an approximation
    (relative error ~5e-5 measured), which alone put its logits 1.5e-3 away from MindSpore's.
    """

    def __init__(self, dim: int, eps: float, dtype):
        super().__init__()
        self.weight = zeros_param((dim,), ms.float32, "weight")
        self.eps = eps
        self.dtype = dtype
        self.mean = ops.ReduceMean(keep_dims=True)
        self.sqrt = ops.Sqrt()
        self.cast = ops.Cast()

    def construct(self, x):
        x32 = self.cast(x, ms.float32)
        y = x32 / self.sqrt(self.mean(x32 * x32, -1) + self.eps)
        return self.cast(y * self.weight, self.dtype)


def rotary_tables(seq_length: int, head_dim: int, theta: float):
    """cos/sin tables (seq_length, head_dim) in the rotate-half layout of HF and MindFormers."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    angles = np.outer(np.arange(seq_length, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class Rotary(nn.Cell):
    """Applies rotary embeddings to x (B, heads, T, head_dim) given cos/sin broadcastable to it."""

    def __init__(self):
        super().__init__()
        self.split = ops.Split(axis=-1, output_num=2)
        self.concat = ops.Concat(axis=-1)

    def construct(self, x, cos, sin):
        x1, x2 = self.split(x)
        return x * cos + self.concat((-x2, x1)) * sin


class SwiGLU(nn.Cell):
    """down(silu(gate(x)) * up(x)), column-parallel gate/up and row-parallel down."""

    def __init__(self, hidden: int, intermediate: int, world_size: int, dtype):
        super().__init__()
        self.w1 = ColumnParallelLinear(hidden, intermediate, world_size, dtype)   # gate
        self.w3 = ColumnParallelLinear(hidden, intermediate, world_size, dtype)   # up
        self.w2 = RowParallelLinear(intermediate, hidden, world_size, dtype)      # down
        self.sigmoid = ops.Sigmoid()

    def construct(self, x):
        gate = self.w1(x)
        return self.w2(gate * self.sigmoid(gate) * self.w3(x))
