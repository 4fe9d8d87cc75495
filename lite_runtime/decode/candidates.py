"""Candidate sets of a batch of logits: each row's (values, ids) of shape (B, n), kept by top-k or top-p without
sorting the whole vocabulary, and one draw from each row's softmax. The building blocks of sampling.py."""
from __future__ import annotations

from functools import lru_cache
import math
from typing import Tuple

import numpy as np

_NEG_INF = np.float32(-np.inf)
_FIRST_NUCLEUS_CANDIDATES = 64


def top_k_candidates(logits: np.ndarray, k: int, *, sort: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest logits of each row and their ids; sorted descending if ``sort``.

    The row is split into groups and only the ``k`` groups with the largest maxima are
    partitioned: every value outside them is <= the k-th largest group maximum, and the
    chosen groups hold k values at least that large, so the result is the exact top-k
    while partitioning far fewer than V values. Group g holds the ids congruent to g
    modulo the group count, which keeps the group reductions vectorised.
    """
    batch, vocab = logits.shape
    k = min(k, vocab)
    size = _group_size(vocab, k)
    if size:
        n_groups = vocab // size
        grid = logits.reshape(batch, size, n_groups)
        chosen = np.argpartition(grid.max(axis=1), n_groups - k, axis=1)[:, n_groups - k:]
        pool = np.take_along_axis(grid, chosen[:, None, :], axis=2).reshape(batch, size * k)
        pool_ids = (np.arange(size)[:, None] * n_groups + chosen[:, None, :]).reshape(batch, size * k)
        picked = np.argpartition(pool, size * k - k, axis=1)[:, size * k - k:]
        values = np.take_along_axis(pool, picked, axis=1)
        ids = np.take_along_axis(pool_ids, picked, axis=1)
    else:
        ids = np.argpartition(logits, vocab - k, axis=1)[:, vocab - k:]
        values = np.take_along_axis(logits, ids, axis=1)
    if sort:
        order = np.argsort(-values, axis=1, kind="stable")
        values = np.take_along_axis(values, order, axis=1)
        ids = np.take_along_axis(ids, order, axis=1)
    return values, ids


def top_p_candidates(logits: np.ndarray, p: float) -> Tuple[np.ndarray, np.ndarray]:
    """Each row's nucleus as (values, ids) sorted descending, ``-inf`` past the nucleus.

    Probabilities are normalised over the whole row. The candidate set (the top n) starts
    at 64 and grows until every row's candidates hold mass >= ``p``: the next token then
    has a preceding mass >= ``p`` and is outside the nucleus, so the cut is exact. Only
    the final candidate set is sorted.
    """
    vocab = logits.shape[1]
    row_max = logits.max(axis=1, keepdims=True)
    log_norm = row_max[:, 0].astype(np.float64) + np.log(
        np.exp(logits - row_max).sum(axis=1, dtype=np.float64)
    )
    n = min(_FIRST_NUCLEUS_CANDIDATES, vocab)
    while True:
        values, ids = top_k_candidates(logits, n)
        probs = np.exp(values.astype(np.float64) - log_norm[:, None])
        mass = probs.sum(axis=1)
        if n == vocab or bool((mass >= p).all()):
            break
        # Every token left out is at most as likely as the least likely candidate, so at
        # least (p - mass) / that many more are needed.
        smallest = np.maximum(probs.min(axis=1), 1e-300)
        needed = n + int(np.ceil(((p - mass) / smallest).max()))
        n = min(max(4 * n, needed), vocab)
    order = np.argsort(-values, axis=1, kind="stable")
    values = np.take_along_axis(values, order, axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    probs = np.take_along_axis(probs, order, axis=1)
    keep = (np.cumsum(probs, axis=1) - probs) < p
    keep[:, 0] = True
    return np.where(keep, values, _NEG_INF), ids


def nucleus_of_candidates(values: np.ndarray, p: float) -> np.ndarray:
    """Top-p over a candidate set sorted descending, normalised over the candidates only
    (what top-p means after top-k); returns the values with ``-inf`` past the nucleus."""
    shifted = np.exp(values - values[:, :1])
    probs = shifted / shifted.sum(axis=1, keepdims=True, dtype=np.float64)
    keep = (np.cumsum(probs, axis=1) - probs) < p
    keep[:, 0] = True
    return np.where(keep, values, _NEG_INF)


def draw_positions(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Column index drawn per row from softmax(values) by inverse CDF, one uniform per row.

    Wide rows are summed per group first (group g = columns congruent to g modulo the
    group count), so the slow sequential cumulative sum runs over the group masses and
    one group instead of the whole row.
    """
    batch, width = values.shape
    weights = np.exp(values - values.max(axis=1, keepdims=True))
    rows = np.arange(batch)
    u = 1.0 - rng.random(batch)  # in (0, 1], so the target mass is > 0
    size = _group_size(width, 1) if width > 2048 else 0
    if not size:
        cdf = np.cumsum(weights, axis=1, dtype=np.float64)
        return _first_reaching(cdf, u * cdf[:, -1])
    n_groups = width // size
    grid = weights.reshape(batch, size, n_groups)
    group_mass = grid.sum(axis=1, dtype=np.float64)
    group_cdf = np.cumsum(group_mass, axis=1)
    target = u * group_cdf[:, -1]
    group = _first_reaching(group_cdf, target)
    inner_cdf = np.cumsum(grid[rows, :, group], axis=1, dtype=np.float64)
    inner_target = target - (group_cdf[rows, group] - group_mass[rows, group])
    member = _first_reaching(inner_cdf, np.minimum(inner_target, inner_cdf[:, -1]))
    return member * n_groups + group


def _first_reaching(cdf: np.ndarray, target: np.ndarray) -> np.ndarray:
    # First column whose cdf reaches the target, skipping the zero-weight prefix: that
    # column always has a positive weight, even when rounding puts target <= 0.
    below = (cdf < target[:, None]) | (cdf <= 0.0)
    return np.minimum(below.sum(axis=1), cdf.shape[1] - 1)


@lru_cache(maxsize=64)
def _group_size(width: int, k: int) -> int:
    """A divisor of ``width`` near sqrt(width / k), which balances the work of the two
    stages, or 0 when grouping would not pay off."""
    if k < 1 or width < 1024:
        return 0
    ideal = math.sqrt(width / k)
    candidates = [b for b in range(max(2, int(ideal / 2)), int(ideal * 2) + 1) if width % b == 0]
    if not candidates:
        return 0
    size = min(candidates, key=lambda b: abs(b - ideal))
    return size if k * size * 4 <= width else 0


def scatter(values: np.ndarray, ids: np.ndarray, shape: Tuple[int, int]) -> np.ndarray:
    """Logits of `shape` (B, V): the candidates' values at their ids, -inf elsewhere."""
    out = np.full(shape, _NEG_INF, dtype=np.float32)
    np.put_along_axis(out, ids, values, axis=1)
    return out
