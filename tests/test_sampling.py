from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lite_runtime.contract.errors import ValidationError
from lite_runtime.decode.candidates import draw_positions, top_k_candidates, top_p_candidates
from lite_runtime.decode.sampling import (
    Sampler,
    SamplingParams,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    greedy,
    sample,
)

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

NEG_INF = -np.inf


def _log(probs):
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


def _kept(logits):
    return [sorted(np.flatnonzero(np.isfinite(row)).tolist()) for row in logits]


# --- single functions against hand-computed values -------------------------------------


def test_greedy_picks_row_maxima_as_int32():
    ids = greedy(np.array([[1.0, 3.0, 2.0], [5.0, 0.0, -1.0]], dtype=np.float32))
    assert ids.dtype == np.int32 and ids.tolist() == [1, 0]


def test_temperature_divides():
    out = apply_temperature(np.array([[2.0, -4.0]], dtype=np.float32), 2.0)
    np.testing.assert_array_equal(out, [[1.0, -2.0]])


def test_top_k_keeps_exactly_k_largest():
    logits = np.array([[1.0, 5.0, 3.0, 4.0], [0.0, -1.0, 2.0, 1.0]], dtype=np.float32)
    np.testing.assert_array_equal(
        apply_top_k(logits, 2), [[NEG_INF, 5.0, NEG_INF, 4.0], [NEG_INF, NEG_INF, 2.0, 1.0]]
    )
    np.testing.assert_array_equal(apply_top_k(logits, 0), logits)
    np.testing.assert_array_equal(apply_top_k(logits, 9), logits)


@pytest.mark.parametrize("vocab", [32000, 151936, 1009])
@pytest.mark.parametrize("k", [1, 7, 50, 300])
def test_top_k_candidates_match_a_full_sort(vocab, k):
    logits = np.random.default_rng(vocab + k).standard_normal((3, vocab)).astype(np.float32)
    values, ids = top_k_candidates(logits, k, sort=True)
    np.testing.assert_array_equal(values, -np.sort(-logits, axis=1)[:, :k])
    np.testing.assert_array_equal(np.take_along_axis(logits, ids, axis=1), values)


def test_top_p_keeps_tokens_until_mass_reached():
    logits = _log([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]])
    assert _kept(apply_top_p(logits, 0.79)) == [[0, 1], [2, 3]]
    assert _kept(apply_top_p(logits, 0.85)) == [[0, 1, 2], [1, 2, 3]]
    assert _kept(apply_top_p(logits, 0.4)) == [[0], [3]]  # the top token always stays
    np.testing.assert_array_equal(apply_top_p(logits, 1.0), logits)
    kept_values = apply_top_p(logits, 0.79)
    np.testing.assert_array_equal(kept_values[0, :2], logits[0, :2])


@pytest.mark.parametrize("scale", [0.5, 3.0, 8.0])
def test_top_p_is_exact_on_a_large_vocabulary(scale):
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((2, 32000)) * scale).astype(np.float32)
    logits[1] *= 0.25  # rows with very different nucleus sizes
    values, ids = top_p_candidates(logits, 0.9)
    for row in range(2):
        probs = np.exp(logits[row].astype(np.float64) - logits[row].max())
        probs /= probs.sum()
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]
        expected = set(order[before < 0.9].tolist())
        assert set(ids[row][np.isfinite(values[row])].tolist()) == expected


def test_repetition_penalty_ctrl_rule_with_counts():
    logits = np.array([[2.0, -2.0, 1.0, 0.5]], dtype=np.float32)
    ids = np.array([[0, 1, 1, 3]], dtype=np.int32)  # position 3 is padding
    out = apply_repetition_penalty(logits, ids, np.array([3]), 2.0)
    np.testing.assert_array_equal(out, [[1.0, -4.0, 1.0, 0.5]])  # 1 seen twice, once penalised


def test_repetition_penalty_ignores_padding_even_when_it_repeats_a_real_id():
    logits = np.array([[2.0, 4.0, 6.0], [2.0, 4.0, 6.0], [2.0, 4.0, 6.0]], dtype=np.float32)
    ids = np.array([[2, 0, 0], [1, 2, 1], [-1, -1, 7]], dtype=np.int32)
    counts = np.array([1, 1, 0])
    out = apply_repetition_penalty(logits, ids, counts, 2.0)
    np.testing.assert_array_equal(out, [[2.0, 4.0, 3.0], [2.0, 2.0, 6.0], [2.0, 4.0, 6.0]])
    mask = np.array([[False, False, True], [True, False, False], [False, False, False]])
    out = apply_repetition_penalty(logits, np.array([[-1, 5, 0], [2, 0, 0], [9, 9, 9]]), mask, 2.0)
    np.testing.assert_array_equal(out, [[1.0, 4.0, 6.0], [2.0, 4.0, 3.0], [2.0, 4.0, 6.0]])


def test_repetition_penalty_rejects_real_ids_outside_vocab():
    logits = np.zeros((1, 4), dtype=np.float32)
    with pytest.raises(ValidationError, match="id 4 .*outside the vocabulary"):
        apply_repetition_penalty(logits, np.array([[1, 4]]), np.array([2]), 1.3)
    with pytest.raises(ValidationError, match="valid"):
        apply_repetition_penalty(logits, np.array([[1, 2]]), np.array([3]), 1.3)
    with pytest.raises(ValidationError, match="valid"):
        apply_repetition_penalty(logits, np.array([[1, 2]]), np.array([[True]]), 1.3)


def test_sample_never_draws_masked_tokens_and_follows_probabilities():
    rng = np.random.default_rng(0)
    logits = np.tile(_log([[0.7, 0.2, 0.1, 1e-9]]), (20000, 1))
    logits[:, 3] = NEG_INF
    counts = np.bincount(sample(logits, rng), minlength=4) / 20000
    assert counts[3] == 0
    np.testing.assert_allclose(counts[:3], [0.7, 0.2, 0.1], atol=0.015)


def test_wide_rows_are_drawn_in_proportion():
    logits = np.full((4000, 32000), NEG_INF, dtype=np.float32)
    logits[:, [7, 12345, 31999]] = _log([0.5, 0.25, 0.25])
    drawn = draw_positions(logits, np.random.default_rng(3))
    assert set(drawn.tolist()) == {7, 12345, 31999}
    assert abs(np.mean(drawn == 7) - 0.5) < 0.04


# --- inputs are never modified --------------------------------------------------------


def test_no_function_modifies_its_inputs():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((3, 5000)).astype(np.float32)
    ids = rng.integers(0, 5000, (3, 40)).astype(np.int32)
    counts = np.array([40, 3, 0])
    kept = (logits.copy(), ids.copy(), counts.copy())
    calls = [
        lambda: apply_temperature(logits, 0.7),
        lambda: apply_top_k(logits, 10),
        lambda: apply_top_p(logits, 0.8),
        lambda: apply_repetition_penalty(logits, ids, counts, 1.3),
        lambda: apply_repetition_penalty(logits, ids, ids > 100, 0.7),
        lambda: greedy(logits),
        lambda: sample(logits, rng),
        lambda: top_k_candidates(logits, 20, sort=True),
        lambda: top_p_candidates(logits, 0.5),
    ]
    for params in [
        SamplingParams(),
        SamplingParams(repetition_penalty=1.2),
        SamplingParams(do_sample=True, top_k=20, top_p=0.7, temperature=0.6, repetition_penalty=1.1),
        SamplingParams(do_sample=True, top_p=0.9, temperature=1.5),
    ]:
        calls.append(lambda s=Sampler(params): s(logits, ids, counts))
    for call in calls:
        result = call()
        for before, now in zip(kept, (logits, ids, counts)):
            np.testing.assert_array_equal(before, now)
        for out in result if isinstance(result, tuple) else (result,):
            assert not np.shares_memory(out, logits)


# --- Sampler ------------------------------------------------------------------------------


def test_greedy_whenever_do_sample_is_off_or_top_k_is_one():
    logits = np.random.default_rng(2).standard_normal((4, 100)).astype(np.float32)
    expected = logits.argmax(axis=1).tolist()
    for params in [
        SamplingParams(),
        SamplingParams(top_k=50, top_p=0.3, temperature=3.0),
        SamplingParams(do_sample=True, top_k=1, temperature=5.0),
    ]:
        ids = Sampler(params)(logits)
        assert ids.dtype == np.int32 and ids.shape == (4,) and ids.tolist() == expected


def test_greedy_applies_repetition_penalty_over_real_tokens_only():
    logits = np.array([[3.0, 2.0, 1.0]], dtype=np.float32)
    sampler = Sampler(SamplingParams(repetition_penalty=2.0))
    ids = np.array([[0, 0]], dtype=np.int32)
    assert sampler(logits, ids, np.array([1])).tolist() == [1]  # 3/2 < 2
    assert sampler(logits, ids, np.array([0])).tolist() == [0]  # only padding
    with pytest.raises(ValidationError, match="token_ids and valid"):
        sampler(logits)


def test_same_seed_same_tokens_different_seed_different_tokens():
    flat = np.zeros((4, 1000), dtype=np.float32)

    def run(seed):
        sampler = Sampler(SamplingParams(do_sample=True, seed=seed))
        return np.stack([sampler(flat) for _ in range(10)])

    np.testing.assert_array_equal(run(11), run(11))
    assert not np.array_equal(run(11), run(12))


@pytest.mark.parametrize("kwargs", [{"top_k": 3}, {"top_k": 3, "temperature": 4.0}])
def test_top_k_sampler_never_emits_excluded_tokens(kwargs):
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((8, 32000)).astype(np.float32)
    allowed = [set(np.argsort(-row)[:3].tolist()) for row in logits]
    sampler = Sampler(SamplingParams(do_sample=True, seed=0, **kwargs))
    seen = [set() for _ in range(8)]
    for _ in range(300):
        for row, token in enumerate(sampler(logits).tolist()):
            seen[row].add(token)
    assert seen == allowed  # every allowed token shows up, nothing else does


def test_top_p_sampler_never_emits_excluded_tokens():
    logits = np.tile(_log([[0.45, 0.3, 0.15, 0.06, 0.04]]), (500, 1))
    sampler = Sampler(SamplingParams(do_sample=True, top_p=0.8, seed=1))
    assert set(sampler(logits).tolist()) == {0, 1, 2}


def test_top_p_after_top_k_uses_the_renormalised_top_k_mass():
    logits = np.tile(_log([[0.4, 0.3, 0.2, 0.1]]), (500, 1))
    # Over the full distribution top-p 0.5 keeps {0, 1}; over top-2 (4/7, 3/7) only {0}.
    assert set(Sampler(SamplingParams(do_sample=True, top_p=0.5, seed=0))(logits).tolist()) == {0, 1}
    both = Sampler(SamplingParams(do_sample=True, top_k=2, top_p=0.5, seed=0))
    assert set(both(logits).tolist()) == {0}


def test_temperature_sharpens_the_distribution():
    logits = np.tile(_log([[0.6, 0.4]]), (4000, 1))
    cold = Sampler(SamplingParams(do_sample=True, temperature=0.1, seed=0))(logits)
    assert np.mean(cold == 0) > 0.97


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": "0.9"}, "top_p"),
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"seed": -3}, "seed"),
        ({"do_sample": "yes"}, "do_sample"),
    ],
)
def test_invalid_params_name_argument_and_value(kwargs, name):
    with pytest.raises(ValidationError) as info:
        SamplingParams(**kwargs)
    message = str(info.value)
    assert message.startswith(name) and repr(next(iter(kwargs.values()))) in message


def test_params_are_frozen_and_accept_numpy_scalars():
    params = SamplingParams(do_sample=True, top_k=np.int64(5), top_p=np.float32(0.5), seed=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.top_k = 3
    assert Sampler(params)(np.zeros((2, 10), dtype=np.float32)).shape == (2,)


@pytest.mark.parametrize("top_k", [0, 3])
def test_min_p_applies_after_temperature_as_vllm(top_k):
    """Probabilities 0.6 / 0.3 / 0.1 and min_p 0.2: at temperature 1 the third (1/6 of the first) is dropped; at
    temperature 3 the distribution is flatter (the third is 0.55 of the first) and it is drawn."""
    logits = np.tile(_log([0.6, 0.3, 0.1]), (4000, 1))
    cold = Sampler(SamplingParams(do_sample=True, top_k=top_k, min_p=0.2, seed=1))(logits)
    warm = Sampler(SamplingParams(do_sample=True, top_k=top_k, min_p=0.2, temperature=3.0, seed=1))(logits)
    assert not (cold == 2).any() and set(cold.tolist()) == {0, 1}
    assert 0.15 < (warm == 2).mean() < 0.35          # 0.55 / (1 + 0.79 + 0.55) = 0.24 of the draws
