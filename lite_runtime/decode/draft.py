"""Speculative decoding with a draft model: a small export with the target's tokenizer guesses each
row's next tokens greedily (`--speculative draft:DIR[:K]`); the target verifies them (speculation.py).

The draft owns a session of its own, loaded once, whose cache row i serves the target's row i. It
remembers the tokens whose K/V each of its rows holds. When asked, a row keeps the longest prefix that
this shares with the row's text (the target rejected some guesses, or the slot holds another request
now: the same tokens at the same positions have the same K/V), feeds the rest (the new request's
prompt in chunks), then feeds its own guesses one at a time. All asking rows go through the same
packed steps, so a step of the draft costs about one call of its graph whatever the number of rows.
"""
from __future__ import annotations

import os
from typing import Dict, List, Sequence, Tuple

import numpy as np

from lite_runtime.backends.kv_cache import PackedKVCache
from lite_runtime.contract.errors import ConfigError, ToolchainError
from lite_runtime.contract.families import get_family
from lite_runtime.contract.hashes import file_sha256
from lite_runtime.contract.manifest import Manifest, load_manifest
from lite_runtime.decode.speculation import DraftSpec

CHUNK = 128      # most text tokens a row feeds in one draft step


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


class DraftModel:
    """The `guess(rows)` of speculation.Speculation, answered by a draft export's greedy tokens."""

    def __init__(self, session, k: int = 4):
        m = session.manifest
        self.session, self.k = session, k
        self.pad_id, self.seq_length = m.pad_token_id, m.seq_length
        self.chunk = max(1, min(CHUNK, m.seq_length))
        self.held: List[List[int]] = [[] for _ in range(m.batch_size)]   # each row's tokens whose K/V the cache has

    @classmethod
    def load(cls, spec: DraftSpec, target: Manifest, backend: str, num_threads: int) -> "DraftModel":
        """The draft of `spec` for serving `target` on `backend`, after checking that it can guess for it."""
        from lite_runtime.backends import load_session
        where = f"--speculative draft:{spec.folder}"
        try:
            draft = load_manifest(spec.folder)
        except ToolchainError as e:
            raise ConfigError(f"{where}: {e}") from None
        check_draft(draft, target, where)
        draft.verify_files()
        return cls(load_session(backend, draft, num_threads=num_threads), spec.k)

    def guess(self, rows: Dict[int, Tuple[Sequence[int], int]]) -> Dict[int, List[int]]:
        """The guesses of the rows asking this step: row -> (its text, the most guesses it has room for)."""
        feed, wanted, out = {}, {}, {}
        for row, (tokens, limit) in rows.items():
            out[row] = []
            # the text and all but the last guess must fit in the draft's own positions
            wanted[row] = min(self.k, limit, self.seq_length + 1 - len(tokens))
            if wanted[row] <= 0:
                continue
            # Keep at least the last token to feed: its logits give the first guess.
            kept = min(common_prefix(self.held[row], tokens), len(tokens) - 1)
            del self.held[row][kept:]
            feed[row] = list(tokens[kept:])
        while feed:
            size = max(1, min(self.chunk, PackedKVCache.max_tokens // len(feed)))   # a step's tokens stay bounded
            logits = self._step({row: pending[:size] for row, pending in feed.items()})
            for row in list(feed):
                fed = feed[row][:size]
                self.held[row] += fed
                del feed[row][:len(fed)]
                if feed[row]:
                    continue          # the text's next chunk at the next step
                out[row].append(int(np.argmax(logits[row])))
                if len(out[row]) < wanted[row]:
                    feed[row] = [out[row][-1]]
                else:
                    del feed[row]
        return out

    def _step(self, feeds: Dict[int, List[int]]) -> np.ndarray:
        """One packed step of the draft: row r feeds feeds[r] after what it holds (others idle)."""
        batch = len(self.held)
        width = max(map(len, feeds.values()))
        tokens = np.full((batch, width), self.pad_id, np.int32)
        counts = np.zeros(batch, np.int32)
        past = np.array([len(held) for held in self.held], np.int32)
        for row, fed in feeds.items():
            tokens[row, :len(fed)] = fed
            counts[row] = len(fed)
        # Families with per-row graph inputs (GLM) are refused (check_draft), so a step feeds no others.
        return self.session.step(tokens, counts, past)

    def close(self) -> None:
        self.session.close()


def check_draft(draft: Manifest, target: Manifest, where: str) -> None:
    """Refuse, in one line naming both exports, a draft that cannot guess for `target`."""
    both = f"the draft {draft.root} and the target {target.root}"
    for m in (target, draft):
        if get_family(m.family).whole_prompts:
            raise ConfigError(f"{where}: {m.root} is a {m.family} export, whose prompts attend both ways: a draft "
                              "model guesses only for causal families; use --speculative ngram[:K]")
        if m.dims.adapter_slots:
            raise ConfigError(f"{where}: {m.root} has SLoRA adapters (one per row), which a draft model does not "
                              "follow; use --speculative ngram[:K]")
    if draft.kv_cache != "packed" or draft.world_size != 1:
        raise ConfigError(f"{where}: the draft {draft.root} has kv_cache {draft.kv_cache!r} on {draft.world_size} "
                          "rank(s); allowed: a packed export on one rank (export it with kv_cache: packed)")
    if draft.batch_size < target.batch_size:
        raise ConfigError(f"{where}: the draft {draft.root} has {draft.batch_size} cache rows, the target "
                          f"{target.root} {target.batch_size}: a draft needs at least as many (export it with "
                          f"batch_size: {target.batch_size})")
    if draft.vocab_size != target.vocab_size:
        raise ConfigError(f"{where}: {both} have vocabularies of {draft.vocab_size} and {target.vocab_size} tokens; "
                          "a draft must have the target's tokenizer")
    hashes = [tokenizer_hash(m) for m in (draft, target)]
    if None in hashes or hashes[0] != hashes[1]:
        names = [os.path.basename(m.tokenizer or "(none)") for m in (draft, target)]
        raise ConfigError(f"{where}: {both} have different tokenizer files ({names[0]} and {names[1]}, sha256 "
                          f"{(hashes[0] or '-')[:12]} and {(hashes[1] or '-')[:12]}); a draft must have the "
                          "target's tokenizer")


def tokenizer_hash(m: Manifest):
    """The sha256 of the export's main tokenizer file (the manifest records no tokenizer hashes), or None."""
    path = m.tokenizer_path()
    return file_sha256(path) if path and os.path.isfile(path) else None
