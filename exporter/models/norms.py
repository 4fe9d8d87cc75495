"""Normalisations written from primitives, computed in float32 whatever the compute dtype.

Lite 2.0's CPU LayerNorm kernel is wrong on 3-D inputs and its Rsqrt is an approximation
(relative error ~5e-5, enough to move logits by 1e-3), so both norms divide by Sqrt.
"""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from exporter.models.linear import weight_param
from lite_runtime.contract.quant import LAYER_NORM_TYPE, NORM_TYPE


class _Norm(nn.Cell):
    """`kernel`: one node of the project's Lite kernels (float32 graphs only, `kernel_type`), the same arithmetic."""

    def __init__(self, dim: int, eps: float, dtype, kernel: bool, kernel_type: str):
        super().__init__()
        self.weight = weight_param((dim,), ms.float32, "weight")
        self.eps = eps
        self.dtype = dtype
        self.mean = ops.ReduceMean(keep_dims=True)
        self.sqrt = ops.Sqrt()
        self.cast = ops.Cast()
        self.kernel = kernel
        if kernel:
            from exporter.models.kernels import layer_op
            self.op = layer_op(kernel_type)
            self.eps_tensor = Tensor(np.array([eps], np.float32))


class RMSNorm(_Norm):
    def __init__(self, dim: int, eps: float, dtype, kernel: bool = False):
        super().__init__(dim, eps, dtype, kernel, NORM_TYPE)

    def construct(self, x):
        if self.kernel:
            return self.op(x, self.weight, self.eps_tensor)
        x32 = self.cast(x, ms.float32)
        y = x32 / self.sqrt(self.mean(x32 * x32, -1) + self.eps)
        return self.cast(y * self.weight, self.dtype)


class LayerNorm(_Norm):
    def __init__(self, dim: int, eps: float, dtype, kernel: bool = False):
        super().__init__(dim, eps, dtype, kernel, LAYER_NORM_TYPE)
        self.bias = weight_param((dim,), ms.float32, "bias")

    def construct(self, x):
        if self.kernel:
            return self.op(x, self.weight, self.bias, self.eps_tensor)
        x32 = self.cast(x, ms.float32)
        centred = x32 - self.mean(x32, -1)
        y = centred / self.sqrt(self.mean(centred * centred, -1) + self.eps)
        return self.cast(y * self.weight + self.bias, self.dtype)


def make_norm(kind: str, dim: int, eps: float, dtype, kernel: bool = False) -> nn.Cell:
    """`kernel`: the norm as one node of the project's Lite kernels."""
    return RMSNorm(dim, eps, dtype, kernel) if kind == "rms" else LayerNorm(dim, eps, dtype, kernel)
