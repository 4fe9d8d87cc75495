"""Graphs of one Custom node run by the project's Lite kernels, for tests/support/lite_kernel_cases.py.

Run with MindSpore 2.0 (the MindIR Lite 2.0 reads), from the repository:
    .venv-ms20/bin/python tests/support/kernel_graphs.py OUT_DIR
Writes OUT_DIR/<case>.mindir, y (M, N) = Custom(x (M, K), constants...) with M dynamic, and
OUT_DIR/<case>.npz with the constants and the dequantized weight `w` the test compares against; and the
layer ops (LAYER_CASES): OUT_DIR/<name>.mindir of their graph inputs, with M dynamic, and <name>.npz with
their constants.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))      # tests/, for support.*
import mindspore as ms  # noqa: E402
from mindspore import Parameter, Tensor, nn  # noqa: E402

from exporter.models.kernels import layer_op, linear_op  # noqa: E402
from exporter.models.positions import rotate_matrix, rotate_pairs  # noqa: E402
from lite_runtime.contract import quant  # noqa: E402
from support.kernel_constants import constants  # noqa: E402

# name: (storage, K, N, group); K and N not multiples of 8, 32 or a group, N not of the 4-row blocks
CASES = {
    "f32": ("float32", 100, 37, 0),
    "f32p16": ("float32_p16", 100, 37, 0),
    "f32p16_wide": ("float32_p16", 576, 203, 0),
    "i8": ("int8", 100, 37, 0),
    "i8_wide": ("int8", 576, 203, 0),
    "i4_g32": ("int4_min", 100, 37, 32),
    "i4_g64": ("int4_min", 200, 37, 64),
    "i4_g128": ("int4_min", 300, 37, 128),
    "i4_g32_wide": ("int4_min", 576, 203, 32),
    "i4s_g32": ("int4_sym", 100, 37, 32),
    "i4s_g32_wide": ("int4_sym", 576, 203, 32),
    "i8g_g32": ("int8_group", 96, 37, 32),          # K whole blocks of 32 (Q8_0's)
    "i8g_g128": ("int8_group", 160, 37, 128),       # the last group short
    "i8g_g32_wide": ("int8_group", 576, 203, 32),
}


class OneLinear(nn.Cell):
    def __init__(self, storage, consts):
        super().__init__()
        self.op = linear_op(storage)
        self.n = len(consts)
        for i, c in enumerate(consts):
            setattr(self, f"c{i}", Parameter(Tensor(c), name=f"c{i}", requires_grad=False))

    def construct(self, x):
        if self.n == 1:
            return self.op(x, self.c0)
        if self.n == 2:
            return self.op(x, self.c0, self.c1)
        return self.op(x, self.c0, self.c1, self.c2)


# The layer ops: name -> (type, (head_dim, rotary_dim, interleaved) for rotary, else the row width)
LAYER_CASES = {
    "rms_norm": (quant.NORM_TYPE, 37),
    "layer_norm": (quant.LAYER_NORM_TYPE, 37),
    "swiglu": (quant.SWIGLU_TYPE, 37),
    "gelu": (quant.GELU_TYPE, 37),
    "gelu_tanh": (quant.GELU_TYPE, 37),
    "fast_gelu": (quant.GELU_TYPE, 37),
    "rotary_half": (quant.ROTARY_TYPE, (8, 8, False)),            # Llama's rotate-half, 3 heads
    "rotary_pairs_partial": (quant.ROTARY_TYPE, (8, 4, True)),    # interleaved pairs over half the head
}
ROTARY_HEADS = 3


class Norm(nn.Cell):
    def __init__(self, consts):
        super().__init__()
        self.op = layer_op(quant.NORM_TYPE)
        self.weight = Parameter(Tensor(consts[0]), name="weight", requires_grad=False)
        self.eps = Tensor(consts[1])

    def construct(self, x):
        return self.op(x, self.weight, self.eps)


class LayerNorm(nn.Cell):
    def __init__(self, consts):
        super().__init__()
        self.op = layer_op(quant.LAYER_NORM_TYPE)
        self.weight = Parameter(Tensor(consts[0]), name="weight", requires_grad=False)
        self.bias = Parameter(Tensor(consts[1]), name="bias", requires_grad=False)
        self.eps = Tensor(consts[2])

    def construct(self, x):
        return self.op(x, self.weight, self.bias, self.eps)


class Gelu(nn.Cell):
    def __init__(self, consts):
        super().__init__()
        self.op = layer_op(quant.GELU_TYPE)
        self.form = Tensor(consts[0])

    def construct(self, x):
        return self.op(x, self.form)


class SwiGLU(nn.Cell):
    def __init__(self, consts):
        super().__init__()
        self.op = layer_op(quant.SWIGLU_TYPE)

    def construct(self, gate, up):
        return self.op(gate, up)


class Rotary(nn.Cell):
    def __init__(self, consts):
        super().__init__()
        self.op = layer_op(quant.ROTARY_TYPE)
        self.pairs = Tensor(consts[0])

    def construct(self, x, cos, sin):
        return self.op(x, cos, sin, self.pairs)


def layer_graphs(out, rng):
    for name, (op_type, shape) in LAYER_CASES.items():
        if op_type == quant.ROTARY_TYPE:
            hd, rotary_dim, interleaved = shape
            consts = [rotate_pairs(rotate_matrix(hd, rotary_dim, interleaved)), np.array(shape + (ROTARY_HEADS,))]
            inputs = [Tensor(shape=[None, ROTARY_HEADS * hd], dtype=ms.float32)] + \
                [Tensor(shape=[None, 1, hd], dtype=ms.float32)] * 2
            cell = Rotary(consts)
        elif op_type in (quant.NORM_TYPE, quant.LAYER_NORM_TYPE):
            consts = [rng.standard_normal(shape).astype(np.float32) for _ in range(op_type == quant.LAYER_NORM_TYPE)]
            consts = [rng.standard_normal(shape).astype(np.float32)] + consts + [np.array([1e-5], np.float32)]
            inputs = [Tensor(shape=[None, shape], dtype=ms.float32)]
            cell = (Norm if op_type == quant.NORM_TYPE else LayerNorm)(consts)
        elif op_type == quant.GELU_TYPE:
            consts = [np.array([quant.GELU_FORMS[name]], np.float32)]
            inputs, cell = [Tensor(shape=[None, shape], dtype=ms.float32)], Gelu(consts)
        else:
            consts, cell = [], SwiGLU([])
            inputs = [Tensor(shape=[None, shape], dtype=ms.float32)] * 2
        np.savez(os.path.join(out, f"{name}.npz"), *consts)     # (rotary: its shape last, for the test)
        ms.export(cell, *inputs, file_name=os.path.join(out, name), file_format="MINDIR")


def main(out):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    for name, (storage, k, n, group) in CASES.items():
        w = rng.standard_normal((n, k)).astype(np.float32)
        w[0, :] = 0.0                                   # an all-zero row (scale 1 by convention)
        w[1, : min(k, 40)] *= 50.0                      # one large group beside small ones
        consts, deq = constants(storage, w, group)
        np.savez(os.path.join(out, f"{name}.npz"), w=deq, *consts)
        ms.export(OneLinear(storage, consts), Tensor(shape=[None, k], dtype=ms.float32),
                  file_name=os.path.join(out, name), file_format="MINDIR")
    layer_graphs(out, rng)


if __name__ == "__main__":
    main(sys.argv[1])
