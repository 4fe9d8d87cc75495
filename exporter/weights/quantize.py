"""The quantizers: a float32 linear weight into one of the kernels' storages (lite_runtime/contract/quant.py
describes each storage and reads it back). Rounding is to nearest (numpy's, half to even). numpy only."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from lite_runtime.contract.quant import (GROUP_SIZES, PER_CHANNEL, WEIGHT_SCHEMES, linear_weight, pack_f32_panels,
                                         pack_halves, pack_int4, pack_int8)


def quantize_int8(w: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(q int8 (N, K) in panels (pack_int8), scale float32 (N,)), symmetric per output row."""
    w = linear_weight(w)
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return pack_int8(q), scale


def _groups(w: np.ndarray, group: int) -> Tuple[np.ndarray, int]:
    """W (N, K) zero-padded to (N, G, group)."""
    if group not in GROUP_SIZES:
        raise ValueError(f"group_size {group}: allowed {', '.join(map(str, GROUP_SIZES))}")
    n, k = w.shape
    g = -(-k // group)
    padded = np.zeros((n, g * group), np.float32)
    padded[:, :k] = w
    return padded.reshape(n, g, group), g


# q / n for every n in 1..15 (0 <= q <= n) in lowest terms, ascending, each with the distance from it within
# which a value may lie on the grid of n steps (1e-3 of a step of its lowest denominator: the widest)
_PLACES = sorted({(q // math.gcd(q, n), n // math.gcd(q, n)) for n in range(1, 16) for q in range(n + 1)},
                 key=lambda f: f[0] / f[1])
_PLACE = np.array([q / n for q, n in _PLACES])
_PLACE_TOLERANCE = np.array([1e-3 / n for _, n in _PLACES])


def _grid_steps(grouped: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per group the step of the 4-bit grid from its min: (max - min) / n for the largest n in 1..15 that puts
    every value of the group on the grid, else (max - min) / 15. A GGUF's 4-bit blocks (Q4_0's d (q - 8), Q4_1's
    d q + m, Q4_K's per 32) seldom reach both ends of their 16 steps (Q4_0's never do): a grid of 15 steps
    between min and max would round their values a second time."""
    span = (hi - lo).reshape(-1)
    flat = grouped.reshape(span.size, -1)
    low = lo.reshape(-1)
    step = np.where(span > 0, span / 15, 1).astype(np.float32)
    # a group's first two values must lie at some q / n between its min and max: that rejects almost every
    # group of other weights at once
    near = span > 0
    for j in range(min(2, flat.shape[1])):
        place = (flat[:, j] - low) / np.where(span > 0, span, 1)
        at = np.clip(np.searchsorted(_PLACE, place), 1, len(_PLACE) - 1)
        near &= ((np.abs(place - _PLACE[at]) < _PLACE_TOLERANCE[at]) |
                 (np.abs(place - _PLACE[at - 1]) < _PLACE_TOLERANCE[at - 1]))
    left = np.flatnonzero(near)
    for n in range(15, 0, -1):
        if left.size == 0:
            break
        places = (flat[left] - low[left, None]) / (span[left, None] / n)
        fits = (np.abs(places - np.rint(places)) < 1e-3).all(axis=1)
        step[left[fits]] = span[left[fits]] / n
        left = left[~fits]
    return step.reshape(lo.shape)


def _half_grid(lo: np.ndarray, hi: np.ndarray, step: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(scale, min) float16 per group for the grid of `step` between `lo` and `hi`, w = u * scale + min. The
    grid's start (u = 0) is whichever of lo, lo - step, ... or, counting down with a negative scale, hi, hi +
    step, ... (while the grid stays within 16 values) lies nearest a float16, when within 1e-3 of a step of
    it: a grid of float16s (a GGUF's: Q4_1's d and m, Q4_0's d and -8 d, d of either sign) is kept as it is,
    though its values reach us rounded to float32; else lo rounded to nearest."""
    top = max(np.abs(lo).max(initial=0), np.abs(hi).max(initial=0))
    if top > np.finfo(np.float16).max:
        raise ValueError(f"a weight of magnitude {top:.4g} is beyond float16's {np.finfo(np.float16).max:.0f}, "
                         "the type of int4's scales and mins")
    shape = lo.shape
    lo, hi, step = lo.reshape(-1), hi.reshape(-1), step.reshape(-1)
    levels = np.rint((hi - lo) / step)
    scale, mins = step.astype(np.float16), lo.astype(np.float16)
    best = np.full(lo.shape, np.inf, np.float32)
    for j in range(16):
        at = np.flatnonzero(levels + j <= 15)       # a full grid (most weights') has only j = 0
        for start, sign in ((lo[at] - np.float32(j) * step[at], 1), (hi[at] + np.float32(j) * step[at], -1)):
            start = start.astype(np.float32)
            rounded = start.astype(np.float16)
            off = np.abs(rounded.astype(np.float32) - start)
            nearer = (off < best[at]) & (off <= 1e-3 * step[at])
            where = at[nearer]
            mins[where], best[where] = rounded[nearer], off[nearer]
            scale[where] = np.float16(sign) * step[where].astype(np.float16)
    return scale.reshape(shape), mins.reshape(shape)


def _pack_groups(u: np.ndarray, k: int) -> np.ndarray:
    """u (N, G, group) of a row of k weights -> pack_int4 of its first k, zero-padded to a multiple of 32."""
    n = u.shape[0]
    full = np.zeros((n, -(-k // 32) * 32), np.uint8)
    full[:, :k] = u.reshape(n, -1)[:, :k]
    return pack_int4(full)


def quantize_int4(w: np.ndarray, group: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packed int8 (N, Kp / 2), scale (N, 2G), min (N, 2G)), the three in panels (pack_int4, pack_halves):
    per group, scale = the grid's step (_grid_steps) and min its start, as float16s (_half_grid), u =
    rint((w - min) / scale)."""
    w = linear_weight(w)
    k = w.shape[1]
    grouped, _ = _groups(w, group)
    lo, hi = grouped.min(axis=2), grouped.max(axis=2)
    scale, mins = _half_grid(lo, hi, _grid_steps(grouped, lo, hi))
    step, low = scale.astype(np.float32), mins.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):     # a step below float16's least: every u 0
        u = np.where(step[:, :, None] != 0, np.rint((grouped - low[:, :, None]) / step[:, :, None]), 0)
    return _pack_groups(np.clip(u, 0, 15), k), pack_halves(scale), pack_halves(mins)


def quantize_int4_symmetric(w: np.ndarray, group: int) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """(packed int8 (N, Kp / 2), scale (N, 2G)) when every group of `w` is on Q4_0's grid, w = (u - 8) * scale
    with the scale a float16 and u in [0, 15] (a GGUF's Q4_0 tensor: llama.cpp takes a block's scale as its
    value of largest magnitude over -8); else None. Stored without mins, the kernels' min is -8 scale."""
    w = linear_weight(w)
    if len(w) > 1 and quantize_int4_symmetric(w[:1], group) is None:     # most weights fail at their first row
        return None
    n, k = w.shape
    grouped, _ = _groups(w, group)
    flat = grouped.reshape(-1, group)
    extreme = flat[np.arange(len(flat)), np.abs(flat).argmax(axis=1)]
    scale = (extreme / np.float32(-8)).astype(np.float16)
    if not np.array_equal(scale.astype(np.float32), extreme / np.float32(-8)):
        return None
    step = scale.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(step[:, None] != 0, flat / step[:, None] + 8, 8)
    q = np.rint(u)
    if not ((np.abs(u - q) <= 1e-3).all() and q.min() >= 0 and q.max() <= 15):
        return None
    return _pack_groups(q.reshape(n, -1, group), k), pack_halves(scale.reshape(n, -1))


def quantize_int8_group(w: np.ndarray, group: int) -> Tuple[np.ndarray, np.ndarray]:
    """(q int8 (N, K) in panels (pack_int8), scale (N, 2G) as pack_halves) of `w`, K a multiple of 32: per group
    of `group` along K d = max |w| / 127 as a float16, q = w / d rounded (llama.cpp's Q8_0 in groups of 32: a
    weight already in those blocks comes back as it is)."""
    w = linear_weight(w)
    n, k = w.shape
    if k % 32 or group not in GROUP_SIZES:
        raise ValueError(f"grouped int8 needs rows of a multiple of 32 weights (not {k}) in groups of "
                         f"{', '.join(map(str, GROUP_SIZES))} (not {group})")
    # a view where the groups fill the rows (a 7B model's largest table is 0.5 GB in float32)
    grouped = w.reshape(n, k // group, group) if k % group == 0 else _groups(w, group)[0]
    d = np.maximum(grouped.max(axis=2), -grouped.min(axis=2)) / np.float32(127)
    if d.max(initial=0) > np.finfo(np.float16).max:
        raise ValueError(f"a weight of magnitude {127 * d.max():.4g} is beyond 127 times float16's "
                         f"{np.finfo(np.float16).max:.0f}, the type of grouped int8's scales")
    half = d.astype(np.float16)
    d = half.astype(np.float32)
    q = grouped / np.where(d != 0, d, 1)[:, :, None]     # d 0: every value of the group rounds to 0
    np.clip(np.rint(q, out=q), -127, 127, out=q)
    return pack_int8(q.reshape(n, -1)[:, :k].astype(np.int8)), pack_halves(half)


def quantize(w: np.ndarray, scheme: str, group: int = 32) -> Tuple[str, list]:
    """(op storage name of OP_TYPES, the constant inputs after x) of `w` under `scheme` (WEIGHT_SCHEMES;
    "none" keeps float32). int4 stores a min per group (0.625 bytes a weight in groups of 32): symmetric int4
    kept 58 % of SmolLM2-135M's top-1 choices (teacher-forced, 1024 tokens), with a min 100 % (its GGUF is
    Q4_1: the same grid) (docs/quantization.md); a weight already on Q4_0's grid is stored as Q4_0 is,
    without mins (0.5625 bytes). int8 in groups (int8_group) unless `group` is PER_CHANNEL or a row is not a
    multiple of 32 (int8: one scale per output channel)."""
    if scheme == "int8":
        if group == PER_CHANNEL or linear_weight(w).shape[1] % 32:
            return "int8", list(quantize_int8(w))
        return "int8_group", list(quantize_int8_group(w, group))
    if scheme == "int4":
        symmetric = quantize_int4_symmetric(w, group)
        return ("int4_sym", list(symmetric)) if symmetric else ("int4_min", list(quantize_int4(w, group)))
    if scheme == "none":
        return "float32", [linear_weight(w)]
    if scheme == "float32":
        return "float32_p16", [pack_f32_panels(w)]
    raise ValueError(f"quantization weights {scheme!r}: allowed {', '.join(WEIGHT_SCHEMES)}")
