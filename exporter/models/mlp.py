"""Feed-forward blocks: column-parallel up (and gate), row-parallel down."""
from __future__ import annotations

import math

import numpy as np
from mindspore import Tensor, nn, ops

from exporter.models.linear import ColumnParallelLinear, RowParallelLinear
from lite_runtime.contract.quant import GELU_FORMS, GELU_TYPE, SWIGLU_TYPE


class SwiGLU(nn.Cell):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, world_size: int, dtype, bias: bool = False, flat: bool = False,
                 lora=None, reduce: bool = True, kernel: bool = False):
        """`kernel`: silu(gate) * up as one node of the project's Lite kernels (float32 graphs only)."""
        super().__init__()
        lora = lora or {}
        self.gate = ColumnParallelLinear(hidden, intermediate, world_size, dtype, bias, flat, lora.get("gate", 0))
        self.up = ColumnParallelLinear(hidden, intermediate, world_size, dtype, bias, flat, lora.get("up", 0))
        self.down = RowParallelLinear(intermediate, hidden, world_size, dtype, bias, flat, lora.get("down", 0), reduce)
        self.sigmoid = ops.Sigmoid()
        self.kernel = kernel
        if kernel:
            from exporter.models.kernels import layer_op
            self.op = layer_op(SWIGLU_TYPE)

    def construct(self, x, select=None):
        gate = self.gate(x, select)
        if self.kernel:
            return self.down(self.op(gate, self.up(x, select)), select)
        return self.down(gate * self.sigmoid(gate) * self.up(x, select), select)


class GeluMLP(nn.Cell):
    """down(gelu(up(x))), GELU exact (erf), with the tanh approximation (GPT-2, Bloom, GLM v1: what
    MindSpore's GeLU primitive computes), or MindSpore's FastGeLU (PanGu-α): x / (1 + exp(-1.702|x|))
    * exp(0.851 (x - |x|)), which is x * sigmoid(1.702 x).

    Written from primitives: the fused GeLU kernels differ in which form they compute (MindSpore's is
    the tanh form, Lite 2.0's CPU kernel the erf form). The tanh form is computed as
    x * sigmoid(2z) = 0.5 x (1 + tanh z): the Tanh kernels of MindSpore 2.10 and Lite 2.0 on CPU are
    approximations (error up to 1e-4), their Sigmoid is accurate to float32.
    """

    def __init__(self, hidden: int, intermediate: int, world_size: int, dtype, bias: bool, form: str,
                 flat: bool = False, lora=None, reduce: bool = True, kernel: bool = False):
        """`form`: gelu (erf), gelu_tanh or fast_gelu; `kernel`: the activation as one node of the project's Lite
        kernels (float32 graphs only), the same formula."""
        super().__init__()
        lora = lora or {}
        self.up = ColumnParallelLinear(hidden, intermediate, world_size, dtype, bias, flat, lora.get("up", 0))
        self.down = RowParallelLinear(intermediate, hidden, world_size, dtype, bias, flat, lora.get("down", 0), reduce)
        self.fast = form == "fast_gelu"
        self.approximate = form == "gelu_tanh"
        self.sigmoid = ops.Sigmoid()
        self.erf = ops.Erf()
        self.k_sigmoid = 2.0 * math.sqrt(2.0 / math.pi)     # 2z of the sigmoid
        self.k_erf = 1.0 / math.sqrt(2.0)
        self.kernel = kernel
        if kernel:
            from exporter.models.kernels import layer_op
            self.op = layer_op(GELU_TYPE)
            self.form = Tensor(np.array([GELU_FORMS[form]], np.float32))

    def construct(self, x, select=None):
        h = self.up(x, select)
        if self.kernel:
            g = self.op(h, self.form)
        elif self.fast:
            g = h * self.sigmoid(1.702 * h)
        elif self.approximate:
            g = h * self.sigmoid(self.k_sigmoid * (h + 0.044715 * h * h * h))
        else:
            g = 0.5 * h * (1.0 + self.erf(h * self.k_erf))
        return self.down(g, select)


def make_mlp(kind: str, hidden: int, intermediate: int, world_size: int, dtype, bias: bool,
             flat: bool = False, lora=None, reduce: bool = True, kernel: bool = False) -> nn.Cell:
    """`flat`: inputs are (tokens, hidden), the packed step's layout; `lora`: SLoRA width per
    adapted layer name (gate, up, down); `reduce` False: no all-reduce in the graph (segment form);
    `kernel`: the activation on the project's Lite kernels."""
    if kind == "swiglu":
        return SwiGLU(hidden, intermediate, world_size, dtype, bias, flat, lora, reduce, kernel)
    return GeluMLP(hidden, intermediate, world_size, dtype, bias, kind, flat, lora, reduce, kernel)
