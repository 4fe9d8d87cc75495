"""The int4 kernels' rounding of their input, written here from its description in linear_math.h (not
from the C code): x (..., K) rounded to int8 per run of 32 along K, d = max|x| / 127, q = rint(x * (1 / d))
within [-127, 127], x = q * d, in float32 arithmetic so that q equals the kernels' own to the bit."""
import numpy as np


def round_activations(x):
    x = np.asarray(x, np.float32)
    k = x.shape[-1]
    kp = -(-k // 32) * 32
    padded = np.zeros(x.shape[:-1] + (kp,), np.float32)
    padded[..., :k] = x
    runs = padded.reshape(x.shape[:-1] + (kp // 32, 32))
    amax = np.abs(runs).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    inverse = np.where(amax > 0, np.float32(1) / np.where(d > 0, d, np.float32(1)), np.float32(0))
    q = np.clip(np.rint(runs * inverse.astype(np.float32)), -127, 127).astype(np.float32)
    return (q * d).reshape(padded.shape)[..., :k]
