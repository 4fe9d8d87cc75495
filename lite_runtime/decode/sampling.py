"""Host-side next-token selection: small pure numpy functions over a batch of logits.

Every function takes ``logits`` of shape (B, V) and returns a new array; no input is
modified. Masked-out entries are ``-inf``. A ``Sampler`` is built once per request from
``SamplingParams`` and composes only the active steps, so a greedy request costs one
``argmax`` (plus the repetition penalty when one is set).

No step sorts the whole vocabulary: top-k uses ``np.argpartition``; top-p partitions a
candidate set, sorts only that and grows it until the requested mass is reached, which
gives the exact nucleus (a full sort happens only when the nucleus really is most of the
vocabulary). The candidate sets and the draw: candidates.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from lite_runtime.contract.errors import ValidationError
from lite_runtime.decode.candidates import (_NEG_INF, draw_positions, nucleus_of_candidates, scatter,
                                            top_k_candidates, top_p_candidates)



# --- processors: (B, V) logits -> new (B, V) logits ------------------------------------


def apply_repetition_penalty(
    logits: np.ndarray, token_ids: np.ndarray, valid: np.ndarray, penalty: float
) -> np.ndarray:
    """CTRL-style penalty on every token id that occurs among a row's real tokens.

    ``token_ids`` is (B, T) int; ``valid`` is either per-row counts (B,) — the first
    ``valid[b]`` entries of row b are real — or a (B, T) bool mask. Ids at padding
    positions are ignored whatever their value. Positive logits are divided by
    ``penalty``, negative ones multiplied; a token seen several times is penalised once.
    """
    logits = np.asarray(logits, dtype=np.float32)
    ids, mask = _real_positions(np.asarray(token_ids), valid, logits.shape[0])
    out = logits.copy()
    rows = np.arange(ids.shape[0])
    if mask is not None:
        has_real = mask.any(axis=1)
        # Padding positions are pointed at the row's first real id, so every write to a
        # duplicated index carries the same penalised value; rows without any real
        # token are left out.
        first_real = ids[rows, mask.argmax(axis=1)]
        rows = np.flatnonzero(has_real)
        ids = np.where(mask, ids, first_real[:, None])[rows]
    if ids.size == 0:
        return out
    vocab = logits.shape[1]
    if ids.min() < 0 or ids.max() >= vocab:
        bad = ids[(ids < 0) | (ids >= vocab)][0]
        raise ValidationError(
            f"token_ids: id {int(bad)} at a real (non-padding) position is outside the "
            f"vocabulary [0, {vocab})"
        )
    picked = out[rows[:, None], ids]
    out[rows[:, None], ids] = np.where(
        picked > 0, picked / np.float32(penalty), picked * np.float32(penalty)
    )
    return out


def apply_presence_frequency(logits: np.ndarray, generated: List[np.ndarray], presence: float,
                             frequency: float) -> np.ndarray:
    """OpenAI's penalties over each row's generated tokens: `presence` once per token that occurs,
    `frequency` times its count, both subtracted from its logit."""
    out = np.array(logits, dtype=np.float32)
    for row, tokens in enumerate(generated):
        if len(tokens):
            ids, counts = np.unique(np.asarray(tokens, np.int64), return_counts=True)
            out[row, ids] -= np.float32(presence) + np.float32(frequency) * counts.astype(np.float32)
    return out


def apply_logit_bias(logits: np.ndarray, bias: Dict[int, float]) -> np.ndarray:
    """`bias` (token id -> value) added to every row's logits."""
    out = np.array(logits, dtype=np.float32)
    out[:, list(bias)] += np.array(list(bias.values()), np.float32)
    return out


def apply_min_p(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Keep the tokens whose probability is at least `min_p` times the row's most likely one's."""
    logits = np.asarray(logits, dtype=np.float32)
    floor = logits.max(axis=1, keepdims=True) + np.float32(math.log(min_p))
    return np.where(logits >= floor, logits, _NEG_INF).astype(np.float32)


def suppress_tokens(logits: np.ndarray, rows: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """`ids` made impossible in the rows marked by `rows` (B,) bool."""
    out = np.array(logits, dtype=np.float32)
    out[np.ix_(np.flatnonzero(rows), list(ids))] = _NEG_INF
    return out


def token_logprobs(logits: np.ndarray, token: int, k: int) -> Tuple[float, List[Tuple[int, float]]]:
    """A row's chosen token's log-probability and the `k` most likely tokens' (id, logprob), best first."""
    shifted = logits.astype(np.float64) - logits.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    k = min(k, logprobs.size - 1)
    top = np.argpartition(-logprobs, k)[:k] if k else []
    return float(logprobs[token]), sorted(((int(i), float(logprobs[i])) for i in top), key=lambda pair: -pair[1])


def apply_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Logits divided by ``temperature`` (> 0); 1.0 returns an unchanged copy."""
    return np.asarray(logits, dtype=np.float32) / np.float32(temperature)


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep exactly the ``k`` largest logits of each row (ties broken arbitrarily); 0 = off."""
    logits = np.asarray(logits, dtype=np.float32)
    if k <= 0 or k >= logits.shape[1]:
        return logits.copy()
    values, ids = top_k_candidates(logits, k)
    return scatter(values, ids, logits.shape)


def apply_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep each row's nucleus: the most likely tokens, in order, up to and including the
    one at which their softmax mass reaches ``p``; 1.0 = off."""
    logits = np.asarray(logits, dtype=np.float32)
    if p >= 1.0:
        return logits.copy()
    values, ids = top_p_candidates(logits, p)
    return scatter(values, ids, logits.shape)


# --- choosers: (B, V) logits -> (B,) int32 ids ------------------------------------------


def greedy(logits: np.ndarray) -> np.ndarray:
    """The id of each row's largest logit."""
    return np.argmax(logits, axis=-1).astype(np.int32)


def sample(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One id per row drawn from softmax(logits); ``-inf`` entries are never drawn.

    Uses exactly one uniform number per row, so a seeded generator reproduces a request.
    """
    return draw_positions(np.asarray(logits, dtype=np.float32), rng).astype(np.int32)


def _real_positions(
    token_ids: np.ndarray, valid: np.ndarray, batch: int
) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """``token_ids`` cut to the widest row's real tokens, and a mask of real positions
    (None when every position kept is real, the usual case at batch 1)."""
    if token_ids.ndim != 2 or token_ids.shape[0] != batch:
        raise ValidationError(
            f"token_ids: expected shape (batch={batch}, T), got {token_ids.shape}"
        )
    valid = np.asarray(valid)
    if valid.dtype == np.bool_:
        if valid.shape != token_ids.shape:
            raise ValidationError(
                f"valid: a bool mask must have the shape of token_ids {token_ids.shape}, "
                f"got {valid.shape}"
            )
        return token_ids, (None if valid.all() else valid)
    if valid.shape != (batch,) or not np.issubdtype(valid.dtype, np.integer):
        raise ValidationError(
            f"valid: expected per-row counts of real tokens, int of shape ({batch},), "
            f"or a bool mask of shape {token_ids.shape}; got {valid.dtype} {valid.shape}"
        )
    if batch == 0:
        return token_ids[:, :0], None
    shortest, width = int(valid.min()), int(valid.max())
    if shortest < 0 or width > token_ids.shape[1]:
        raise ValidationError(
            f"valid: counts must lie in [0, {token_ids.shape[1]}] (the width of "
            f"token_ids), got {valid.tolist()}"
        )
    token_ids = token_ids[:, :width]
    if shortest == width:
        return token_ids, None
    return token_ids, np.arange(width)[None, :] < valid[:, None]


# --- per-request configuration ---------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """Generation arguments of one request, checked once on construction.

    ``do_sample=False`` means greedy whatever top_k/top_p/temperature say, and
    ``top_k=1`` is greedy too (the upstream defaults are do_sample=False, top_k=1).
    ``top_k=0`` and ``top_p=1.0`` switch those filters off. ``seed=None`` draws fresh
    entropy; an int makes the request reproducible.
    OpenAI's and vLLM's: ``presence_penalty`` / ``frequency_penalty`` over the generated tokens,
    ``min_p`` (sampling only), ``logit_bias`` (token id -> added logit) and ``min_tokens`` (no stop
    id before that many new tokens; the sampler is told the stop ids).
    """

    do_sample: bool = False
    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    logit_bias: Optional[Dict[int, float]] = None
    min_tokens: int = 0

    @classmethod
    def of(cls, fields, **decided) -> "SamplingParams":
        """The parameters from an object with fields of these names (a request's or GenerationOptions), those
        `decided` (what the object says in its own terms: the server's temperature 0, top_k -1) replacing its."""
        names = [f.name for f in dataclasses.fields(cls) if f.name not in decided]
        return cls(**{name: getattr(fields, name) for name in names}, **decided)

    def __post_init__(self) -> None:
        if not isinstance(self.do_sample, (bool, np.bool_)):
            raise ValidationError(f"do_sample: expected True or False, got {self.do_sample!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValidationError(
                f"top_k: expected an integer >= 0 (0 switches top-k off), got {self.top_k!r}"
            )
        if not _is_real(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValidationError(
                f"top_p: expected a number in (0, 1] (1.0 switches top-p off), got {self.top_p!r}"
            )
        if not _is_real(self.temperature) or not self.temperature > 0.0:
            raise ValidationError(
                f"temperature: expected a finite number > 0, got {self.temperature!r}"
            )
        if not _is_real(self.repetition_penalty) or not self.repetition_penalty > 0.0:
            raise ValidationError(
                "repetition_penalty: expected a finite number > 0 (1.0 switches it off), "
                f"got {self.repetition_penalty!r}"
            )
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ValidationError(f"seed: expected None or an integer >= 0, got {self.seed!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2.0 <= value <= 2.0:
                raise ValidationError(f"{name}: expected a number in [-2, 2] (0 switches it off), got {value!r}")
        if not _is_real(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValidationError(f"min_p: expected a number in [0, 1] (0 switches it off), got {self.min_p!r}")
        if self.logit_bias is not None and (not isinstance(self.logit_bias, dict) or not all(
                _is_int(k) and k >= 0 and _is_real(v) and -100.0 <= v <= 100.0 for k, v in self.logit_bias.items())):
            raise ValidationError(f"logit_bias: expected a mapping of token ids (integers >= 0) to numbers in "
                                  f"[-100, 100], got {self.logit_bias!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValidationError(f"min_tokens: expected an integer >= 0, got {self.min_tokens!r}")

    @property
    def is_greedy(self) -> bool:
        return not self.do_sample or self.top_k == 1


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))


def _is_real(value: object) -> bool:
    return (
        isinstance(value, Real)
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(float(value))
    )


def for_sequence(params: SamplingParams, index: int) -> SamplingParams:
    """The sampling of a call's `index`-th sequence (prompt after prompt, and a prompt's choices in turn): seed +
    index, so that a seeded call is reproducible and its sequences are not copies of one another. The one seed
    policy of `pipeline()`, run_infer_main and the server."""
    return params if params.seed is None else dataclasses.replace(params, seed=params.seed + index)


class Sampler:
    """Picks the next token of every row; build one per request.

    ``sampler(logits, token_ids, valid)``: ``logits`` (B, V) float32 from the graph;
    ``token_ids`` (B, T) int32 holding each row's prompt and generated tokens so far
    (e.g. the decode loop's id buffer, any padding after them); ``valid`` the (B,) count
    of real tokens per row, or a (B, T) bool mask of real positions. ``token_ids`` and
    ``valid`` are read only when a penalty or ``min_tokens`` is set and may be None otherwise;
    ``prompt_lengths`` (B,) says where each row's generated tokens start (default: nothing of
    ``token_ids`` is generated). ``stop_ids`` are the ids ``min_tokens`` holds back.
    Returns (B,) int32. The sampler owns its ``np.random.Generator``, so successive
    calls continue one reproducible stream.
    """

    def __init__(self, params: SamplingParams, stop_ids: Sequence[int] = (), constraint=None) -> None:
        if not isinstance(params, SamplingParams):
            raise ValidationError(f"params: expected SamplingParams, got {type(params).__name__}")
        self.params = params
        self._constraint = constraint      # one row's grammar (constraints.py): its mask, then the choice told
        self._stop_ids = sorted(int(i) for i in stop_ids) if params.min_tokens else []
        self._needs_generated = bool(params.presence_penalty or params.frequency_penalty or self._stop_ids)
        self.rng = np.random.default_rng(params.seed)
        self._penalty = params.repetition_penalty if params.repetition_penalty != 1.0 else None
        self._greedy = params.is_greedy
        self._temperature = params.temperature if params.temperature != 1.0 else None
        self._top_k = params.top_k
        self._top_p = params.top_p if params.top_p < 1.0 else None
        self._min_p = params.min_p     # after temperature, as vLLM: on the distribution sampled from

    @property
    def reads_tokens(self) -> bool:
        """Whether calls need ``token_ids`` and ``valid``."""
        return self._penalty is not None or self._needs_generated

    def __call__(
        self,
        logits: np.ndarray,
        token_ids: Optional[np.ndarray] = None,
        valid: Optional[np.ndarray] = None,
        prompt_lengths: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        if self.reads_tokens and (token_ids is None or valid is None):
            raise ValidationError(
                "Sampler: a penalty or min_tokens is set, so token_ids and valid (counts of real "
                "tokens) must be passed"
            )
        p = self.params
        if self._needs_generated:
            counts = np.asarray(valid)
            counts = counts.sum(axis=1) if counts.dtype == np.bool_ else counts.reshape(-1)
            starts = np.zeros_like(counts) if prompt_lengths is None else np.asarray(prompt_lengths).reshape(-1)
            if self._stop_ids:
                logits = suppress_tokens(logits, counts - starts < p.min_tokens, self._stop_ids)
            if p.presence_penalty or p.frequency_penalty:
                generated = [token_ids[b, starts[b]:counts[b]] for b in range(len(counts))]
                logits = apply_presence_frequency(logits, generated, p.presence_penalty, p.frequency_penalty)
        if p.logit_bias:
            logits = apply_logit_bias(logits, p.logit_bias)
        if self._constraint is not None:
            logits = self._constraint.mask(logits)
        if self._penalty is not None:
            logits = apply_repetition_penalty(logits, token_ids, valid, self._penalty)
        tokens = greedy(logits) if self._greedy else self._sample(np.asarray(logits, dtype=np.float32))
        if self._constraint is not None:
            self._constraint.advance(int(tokens[0]))
        return tokens

    def _sample(self, logits: np.ndarray) -> np.ndarray:
        vocab = logits.shape[1]
        if 0 < self._top_k < vocab:
            # Sorted, so the draw does not depend on argpartition's arbitrary order: ranks whose
            # logits differ in the last bits (tensor parallel) still pick the same token.
            values, ids = top_k_candidates(logits, self._top_k, sort=True)
            if self._temperature is not None:  # order-preserving, so safe after top-k
                values = values / np.float32(self._temperature)
            if self._min_p:
                values = apply_min_p(values, self._min_p)
            if self._top_p is not None:
                values = nucleus_of_candidates(values, self._top_p)
        else:
            if self._temperature is not None:
                logits = apply_temperature(logits, self._temperature)
            if self._min_p:
                logits = apply_min_p(logits, self._min_p)
            if self._top_p is None:
                return sample(logits, self.rng)
            values, ids = top_p_candidates(logits, self._top_p)
        positions = draw_positions(values, self.rng)
        return ids[np.arange(ids.shape[0]), positions].astype(np.int32)
