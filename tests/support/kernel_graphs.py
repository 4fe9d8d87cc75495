"""Graphs of one linear layer as a Custom node run by the project's Lite kernels, for tests/support/lite_kernel_cases.py.

Run with MindSpore 2.0 (the MindIR Lite 2.0 reads), from the repository:
    .venv-ms20/bin/python tests/support/kernel_graphs.py OUT_DIR
Writes OUT_DIR/<case>.mindir, y (M, N) = Custom(x (M, K), constants...) with M dynamic, and
OUT_DIR/<case>.npz with the constants and the dequantized weight `w` the test compares against.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import mindspore as ms  # noqa: E402
from mindspore import Parameter, Tensor, nn  # noqa: E402

from exporter.models.kernels import linear_op  # noqa: E402
from lite_runtime.contract import quant  # noqa: E402

# name: (storage, K, N, group); K and N not multiples of 8, 32 or a group, N not of the 4-row blocks
CASES = {
    "f32": ("float32", 100, 37, 0),
    "i8": ("int8", 100, 37, 0),
    "i8_wide": ("int8", 576, 203, 0),
    "i4_g32": ("int4", 100, 37, 32),
    "i4_g64": ("int4", 200, 37, 64),
    "i4_g128": ("int4", 300, 37, 128),
    "i4min_g32": ("int4_min", 100, 37, 32),
}


def constants(storage, w, group):
    if storage == "float32":
        return [w], w
    if storage == "int8":
        q, s = quant.quantize_int8(w)
        return [q, s], quant.dequantize_int8(q, s)
    packed, s, mins = quant.quantize_int4(w, group, with_min=storage == "int4_min")
    deq = quant.dequantize_int4(packed, s, w.shape[1], group, mins)
    return [packed, s] + ([mins] if mins is not None else []), deq


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


if __name__ == "__main__":
    main(sys.argv[1])
