"""Normalisations written from primitives, computed in float32 whatever the compute dtype.

Lite 2.0's CPU LayerNorm kernel is wrong on 3-D inputs and its Rsqrt is an approximation
(relative error ~5e-5, enough to move logits by 1e-3), so both norms divide by Sqrt.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from exporter.models.linear import weight_param


class RMSNorm(nn.Cell):
    def __init__(self, dim: int, eps: float, dtype):
        super().__init__()
        self.weight = weight_param((dim,), ms.float32, "weight")
        self.eps = eps
        self.dtype = dtype
        self.mean = ops.ReduceMean(keep_dims=True)
        self.sqrt = ops.Sqrt()
        self.cast = ops.Cast()

    def construct(self, x):
        x32 = self.cast(x, ms.float32)
        y = x32 / self.sqrt(self.mean(x32 * x32, -1) + self.eps)
        return self.cast(y * self.weight, self.dtype)


class LayerNorm(nn.Cell):
    def __init__(self, dim: int, eps: float, dtype):
        super().__init__()
        self.weight = weight_param((dim,), ms.float32, "weight")
        self.bias = weight_param((dim,), ms.float32, "bias")
        self.eps = eps
        self.dtype = dtype
        self.mean = ops.ReduceMean(keep_dims=True)
        self.sqrt = ops.Sqrt()
        self.cast = ops.Cast()

    def construct(self, x):
        x32 = self.cast(x, ms.float32)
        centred = x32 - self.mean(x32, -1)
        y = centred / self.sqrt(self.mean(centred * centred, -1) + self.eps)
        return self.cast(y * self.weight + self.bias, self.dtype)


def make_norm(kind: str, dim: int, eps: float, dtype) -> nn.Cell:
    return RMSNorm(dim, eps, dtype) if kind == "rms" else LayerNorm(dim, eps, dtype)
