"""A linear weight in each kernel storage for the kernel tests (lite_kernel_cases.py, directly; kernel_graphs.py,
as Lite graphs): its constant inputs and the float32 weight they stand for. numpy, contract.quant and the exporter's quantizers only."""
import numpy as np

from exporter.weights import quantize as quantizers
from lite_runtime.contract import quant


def on_q4_0_grid(w: np.ndarray, group: int) -> np.ndarray:
    """`w` rounded to a Q4_0 grid per group, as llama.cpp makes one: (q - 8) d, d (a float16) the group's value
    of largest magnitude over -8."""
    n, k = w.shape
    grouped, g = quantizers._groups(w, group)
    extreme = np.take_along_axis(grouped, np.abs(grouped).argmax(axis=2)[..., None], axis=2)
    d = (extreme / np.float32(-8)).astype(np.float16).astype(np.float32)
    q = np.clip(np.rint(np.divide(grouped, d, out=np.zeros_like(grouped), where=d != 0)) + 8, 0, 15)
    return ((q - 8) * d).reshape(n, -1)[:, :k].astype(np.float32)


def on_q8_0_grid(w: np.ndarray) -> np.ndarray:
    """`w` (K a multiple of 32) rounded to Q8_0's blocks as llama.cpp makes them: q d, d (a float16) the block's
    largest magnitude over 127, q rounded by the unrounded d."""
    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32)
    d = np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)
    q = np.rint(np.divide(blocks, d, out=np.zeros_like(blocks), where=d != 0))
    return (q * d.astype(np.float16).astype(np.float32)).reshape(n, k).astype(np.float32)


def constants(storage: str, w: np.ndarray, group: int):
    """(the constants of `w` in `storage`, the weight they stand for); int4_sym rounds `w` to Q4_0's grid first
    (int8_group: K a multiple of 32)."""
    if storage == "float32":
        return [w], w
    if storage == "float32_p16":
        return [quant.pack_f32_panels(w)], w
    if storage == "int8":
        q, s = quantizers.quantize_int8(w)
        return [q, s], quant.dequantize_int8(q, s)
    if storage == "int8_group":
        stored, consts = quantizers.quantize(w, "int8", group)
        assert stored == "int8_group", stored
        return consts, quant.dequantize(stored, consts, w.shape[1], group)
    if storage == "int4_sym":
        stored, consts = quantizers.quantize(on_q4_0_grid(w, group), "int4", group)
        assert stored == "int4_sym", stored
        return consts, quant.dequantize(stored, consts, w.shape[1], group)
    packed, s, mins = quantizers.quantize_int4(w, group)
    return [packed, s, mins], quant.dequantize_int4(packed, s, mins, w.shape[1], group)
