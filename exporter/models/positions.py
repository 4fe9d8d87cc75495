"""Position information: rotary tables (full, partial, interleaved pairs), ALiBi slopes.

Rotary is applied as `x * cos + (x @ P) * sin`, where the constant matrix P moves each rotated
dimension's partner into place with its sign. One form covers rotate-half (Llama), interleaved
pairs (ChatGLM2) and partial rotation (dimensions past `rotary_dim` have cos 1, sin 0, and no
partner), with no slicing in the graph; P has one ±1 per column, so the product is exact.
"""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np
from mindspore import Tensor, nn, ops


def rotary_tables(positions: int, head_dim: int, rotary_dim: int, theta: float,
                  interleaved: bool) -> Tuple[np.ndarray, np.ndarray]:
    """cos/sin tables (positions, head_dim) float32 in the layout `rotate_matrix` expects."""
    inv_freq = 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    per_dim = np.repeat(inv_freq, 2) if interleaved else np.concatenate([inv_freq, inv_freq])
    angles = np.zeros((positions, head_dim), np.float64)
    angles[:, :rotary_dim] = np.outer(np.arange(positions, dtype=np.float64), per_dim)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rotate_matrix(head_dim: int, rotary_dim: int, interleaved: bool) -> np.ndarray:
    """P with (x @ P)[i] = the signed partner of x[i] (0 for dimensions that do not rotate)."""
    p = np.zeros((head_dim, head_dim), np.float32)
    half = rotary_dim // 2
    for k in range(half):
        a, b = (2 * k, 2 * k + 1) if interleaved else (k, k + half)
        p[b, a] = -1.0      # out[a] = -x[b]
        p[a, b] = 1.0       # out[b] = x[a]
    return p


class Rotary(nn.Cell):
    """Rotates x (B, heads, T, head_dim) by cos/sin broadcastable to it."""

    def __init__(self, head_dim: int, rotary_dim: int, interleaved: bool, dtype):
        super().__init__()
        self.head_dim = head_dim
        self.p = Tensor(rotate_matrix(head_dim, rotary_dim, interleaved), dtype)
        self.matmul = ops.MatMul()
        self.reshape = ops.Reshape()

    def construct(self, x, cos, sin):
        batch, heads = x.shape[0], x.shape[1]       # static in every graph; the steps may not be
        partner = self.matmul(self.reshape(x, (-1, self.head_dim)), self.p)
        partner = self.reshape(partner, (batch, heads, -1, self.head_dim))
        return x * cos + partner * sin


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi head slopes for any head count: a geometric series for the largest power of two,
    then every other slope of the next power's series for the remaining heads."""
    def series(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]
    pow2 = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = series(pow2)
    if pow2 < n_heads:
        slopes += series(2 * pow2)[0::2][: n_heads - pow2]
    return np.asarray(slopes, np.float32)
