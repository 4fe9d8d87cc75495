"""Position information: rotary tables (full, partial, interleaved pairs, GLM's 2-D), ALiBi slopes.

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
                  interleaved: bool, fp16: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """cos/sin tables (positions, head_dim) float32 in the layout `rotate_matrix` expects. `fp16`:
    inverse frequencies, angles and cos/sin rounded to float16 on the way, as ChatGLM-6B's
    RotaryEmbedding computes them (MindFormers' glm and the Hugging Face remote code alike)."""
    inv_freq = 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    steps = np.arange(positions, dtype=np.float64)
    if fp16:
        inv_freq = inv_freq.astype(np.float32).astype(np.float16)
        steps = steps.astype(np.float16)
    per_dim = np.repeat(inv_freq, 2) if interleaved else np.concatenate([inv_freq, inv_freq])
    angles = np.zeros((positions, head_dim), np.float16 if fp16 else np.float64)
    angles[:, :rotary_dim] = np.outer(steps, per_dim)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rotary_2d_tables(positions: int, head_dim: int, theta: float, fp16: bool):
    """GLM's 2-D rotary as products of two gathers: cos = cos_a[position] * cos_b[block position],
    sin = sin_a[position] + sin_b[block position]; the first half of each head rotates (rotate-half
    over head_dim/2) by the position, the second by the block position. (positions, head_dim) each."""
    half = head_dim // 2
    cos, sin = rotary_tables(positions, half, half, theta, False, fp16)
    ones, zeros = np.ones_like(cos), np.zeros_like(sin)
    return (np.concatenate([cos, ones], 1), np.concatenate([sin, zeros], 1),
            np.concatenate([ones, cos], 1), np.concatenate([zeros, sin], 1))


def rotate_matrix(head_dim: int, rotary_dim: int, interleaved: bool, blocks: int = 1) -> np.ndarray:
    """P with (x @ P)[i] = the signed partner of x[i] (0 for dimensions that do not rotate).
    `blocks` > 1: the head is that many equal blocks, each rotating `rotary_dim` of its own dims
    (GLM's 2-D rotary: 2 blocks of head_dim/2)."""
    p = np.zeros((head_dim, head_dim), np.float32)
    half = rotary_dim // 2
    width = head_dim // blocks
    for block in range(blocks):
        o = block * width
        for k in range(half):
            a, b = (o + 2 * k, o + 2 * k + 1) if interleaved else (o + k, o + k + half)
            p[b, a] = -1.0      # out[a] = -x[b]
            p[a, b] = 1.0       # out[b] = x[a]
    return p


def rotate_pairs(p: np.ndarray) -> np.ndarray:
    """P of rotate_matrix as the kernels' (2, head_dim) table: column i's partner row j (-1: none) and its sign."""
    rows, cols = np.nonzero(p.T)
    pairs = np.zeros((2, p.shape[0]), np.float32)
    pairs[0] = -1.0
    pairs[0, rows], pairs[1, rows] = cols, p[cols, rows]
    return pairs


class Rotary(nn.Cell):
    """Rotates x (B, heads, T, head_dim) by cos/sin broadcastable to it."""

    def __init__(self, head_dim: int, rotary_dim: int, interleaved: bool, dtype, blocks: int = 1):
        super().__init__()
        self.head_dim = head_dim
        self.p = Tensor(rotate_matrix(head_dim, rotary_dim, interleaved, blocks), dtype)
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
