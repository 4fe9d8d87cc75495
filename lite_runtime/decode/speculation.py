"""Speculative decoding by prompt lookup: guesses of a row's next tokens, verified in one packed step.

A decoding row feeds its last token and up to k guessed ones; the step returns the logits after each
of them (`Session.verify`). The row's own sampler then chooses token after token as plain decoding
would, and keeps going while its choice equals the guess that was fed next: every accepted guess is a
token whose K/V the step already wrote. The first choice that differs (or the one after the last
guess) is kept too, so a step yields 1 .. k + 1 tokens, and the cache positions past the accepted
ones are simply overwritten later (the graph reads a row only below its past length).

The guess is a distribution with all its mass on one token, for which this rule is the standard
rejection rule: the guess is accepted with the target's probability of it, and a rejection samples
the target without it. A seeded sampler draws the same numbers in the same order, so the text equals
plain decoding's, sampled or greedy.

Guesses come from the row's own text (n-gram prompt lookup): the longest recent n-gram (n = 3 or 2)
ending the text that also occurred earlier, and the tokens that followed it there. Edits, summaries
and answers that quote their input repeat long runs of it. Or from a small draft export with the same
tokenizer (`draft:DIR`, draft.py), which guesses greedily whatever the text.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from lite_runtime.contract.errors import ConfigError

ALLOWED = ("allowed: ngram[:K] (prompt lookup) or draft:DIR[:K] (DIR: a packed export with the target's "
           "tokenizer), K guessed tokens a step, 1 to 16 (default 4)")


def _guesses(text: str, k: str, where: str) -> int:
    if k and not (k.isdigit() and 1 <= int(k) <= 16):
        raise ConfigError(f"{where} {text!r}: K {k!r} is not a number from 1 to 16; {ALLOWED}")
    return int(k) if k else 4


@dataclass(frozen=True)
class DraftSpec:
    """`draft:DIR[:K]`, parsed: the draft export is loaded once the target is (draft.DraftModel.load)."""
    folder: str
    k: int = 4


@dataclass(frozen=True)
class Speculation:
    """`ngram` with `k` guesses a step, looked up by n-grams of `max_ngram` .. `min_ngram` tokens (a single
    token's earlier place guessed right too rarely: on SmolLM2's free answers 10 % against 32 % from two,
    and the longer steps cost more than they saved)."""
    k: int = 4
    max_ngram: int = 3
    min_ngram: int = 2

    @classmethod
    def parse(cls, text: str, where: str = "--speculative", drafts: bool = False):
        """`ngram`, `ngram:K` (a Speculation), and with `drafts` (a caller that loads them:
        draft.DraftModel.load) `draft:DIR` or `draft:DIR:K` (a DraftSpec)."""
        method, _, rest = text.partition(":")
        if method == "ngram":
            return cls(k=_guesses(text, rest, where))
        if method == "draft" and not drafts:
            raise ConfigError(f"{where} {text!r}: a draft model is served by lite-serve --speculative draft:DIR "
                              "only; allowed here: ngram or ngram:K, K guessed tokens a step, 1 to 16")
        if method == "draft" and rest:
            folder, _, k = rest.rpartition(":") if rest.rpartition(":")[2].isdigit() else (rest, "", "")
            if not os.path.isdir(folder):
                raise ConfigError(f"{where} {text!r}: the draft export {folder} is not a folder; {ALLOWED}")
            return DraftSpec(folder, _guesses(text, k, where))
        raise ConfigError(f"{where} {text!r}: {ALLOWED}")

    def guess(self, rows: Dict[int, Tuple[Sequence[int], int]]) -> Dict[int, List[int]]:
        """The guesses of the rows asking this step: row -> (its text, the most guesses it has room for)."""
        return {row: self.propose(tokens, limit) for row, (tokens, limit) in rows.items()}

    def propose(self, tokens: Sequence[int], limit: int) -> List[int]:
        """At most min(k, limit) tokens that followed the latest earlier occurrence of the text's last n-gram."""
        limit = min(self.k, limit)
        if limit <= 0 or len(tokens) < 2:
            return []
        text = np.asarray(tokens)
        ends = np.flatnonzero(text[:-1] == text[-1])[::-1]     # earlier places of the last token, latest first
        for n in range(min(self.max_ngram, len(text) - 1), self.min_ngram - 1, -1):
            for end in ends:
                if end >= n - 1 and np.array_equal(text[end - n + 1:end + 1], text[-n:]):
                    return text[end + 1:end + 1 + limit].tolist()
        return []


@dataclass
class SpeculationStats:
    """Guessed tokens fed to verification steps and those accepted (the acceptance rate)."""
    proposed: int = 0
    accepted: int = 0

    def add(self, proposed: int, accepted: int, metrics=None) -> None:
        self.proposed += proposed
        self.accepted += accepted
        if metrics is not None and proposed:
            metrics.speculation(proposed, accepted, self.accepted / self.proposed)
