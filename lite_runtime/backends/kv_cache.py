"""The KV cache of each kv mode, for every backend: what a prefill, a decode step and a continuous-batching step
feed, run through the backend (`run(kind, feeds)`) and write back. The paged store's blocks: paged_cache.py."""
from __future__ import annotations

import sys
from typing import Callable, List, Sequence

import numpy as np

from lite_runtime.contract.families import DYNAMIC, STEP, get_family
from lite_runtime.contract.manifest import Manifest
from lite_runtime.contract.quant import ATTEND_TYPE, PAGED_ATTEND_TYPE
from lite_runtime.contract.errors import UnsupportedError

Run = Callable[[str, List[np.ndarray]], List[np.ndarray]]    # (graph kind, feeds) -> outputs


class KVCache:
    """What one kv mode feeds and keeps: `prefill`, `decode` and `step` build the graph call's feeds,
    run it (`run(kind, feeds)`), write the new K/V rows back and return the logits (B, vocab)."""

    arrays: List[np.ndarray] = []      # the host's cache arrays, fed after the other inputs

    def __init__(self, manifest: Manifest):
        self.manifest = manifest

    def prefill(self, run: Run, input_ids: np.ndarray, valid_length: np.ndarray, extra: Sequence[np.ndarray]):
        raise NotImplementedError

    def decode(self, run: Run, input_ids: np.ndarray, valid_length: np.ndarray, extra: Sequence[np.ndarray]):
        raise NotImplementedError

    def step(self, run: Run, tokens: np.ndarray, counts: np.ndarray, past: np.ndarray, extra: Sequence[np.ndarray]):
        self.manifest.require_packed("continuous batching")


class InGraphCache(KVCache):
    """`in_graph` kv mode: the cache is the graphs' own state; nothing of it crosses a call."""

    def prefill(self, run, input_ids, valid_length, extra):
        return run("prefill", [input_ids, valid_length, *extra])[0]

    def decode(self, run, input_ids, valid_length, extra):
        return run("increment", [input_ids, valid_length, *extra])[0]


class HostKVCache(KVCache):
    """Per-layer key/value buffers owned by the host (`io` kv mode), fed to every increment.

    Arrays are allocated once per session and stay at the same addresses, so a backend may bind
    them to graph inputs without copying.
    """

    def __init__(self, manifest: Manifest):
        super().__init__(manifest)
        d = manifest.dims
        shape = (d.batch_size, d.kv_heads_per_rank, d.seq_length, d.head_dim)
        self.arrays: List[np.ndarray] = [np.zeros(shape, np.float32) for _ in range(2 * d.num_layers)]
        self._rows = np.arange(d.batch_size)

    def prefill(self, run, input_ids, valid_length, extra):
        outputs = run("prefill", [input_ids, valid_length, *extra])
        self.write_prefill(outputs[1:])
        return outputs[0]

    def decode(self, run, input_ids, valid_length, extra):
        outputs = run("increment", [input_ids, valid_length, *extra, *self.arrays])
        self.write_step(outputs[1:], valid_length - 1)
        return outputs[0]

    def write_prefill(self, new_rows: List[np.ndarray]) -> None:
        for cache, new in zip(self.arrays, new_rows):
            np.copyto(cache[:, :, :new.shape[2]], new)

    def write_step(self, new_rows: List[np.ndarray], positions: np.ndarray) -> None:
        """Write one new row per batch row at `positions` (B,)."""
        rows = self._rows
        for cache, new in zip(self.arrays, new_rows):
            cache[rows, :, positions, :] = new[:, :, 0, :]


class PackedKVCache(KVCache):
    """The `packed` kv mode: per-layer key/value buffers fed a list of tokens of any rows per call.

    Every call (a prefill, a decode step, a continuous-batching step) is one list: each token's id,
    row and position, each row's past length and the index of its last token. The graph reads the
    cache only below each row's past length, so the cache grows after the call, to hold the new
    positions, which are written token by token (one fancy-indexed assignment per layer).

    The buffers are as small as the longest row allows, rounded up to a bucket so that the graph's
    shapes (and Lite's Resize, plus a slower first call) change only every bucket: a
    quarter of seq_length, within 16..64 positions. Growing reallocates and copies once; the arrays
    are contiguous so a backend binds them without copying. Keys are stored transposed
    (B, kv, hd, P), values (B, kv, P, hd): `arrays` alternates them, layer by layer.

    A call's new keys are scored against each other (N x N per head), so a prefill of many long rows
    goes in calls of at most `max_tokens` tokens: windows of positions, each reading the last one's
    keys from the cache. A family whose prompt attends both ways (GLM's prefix) is fed whole. 256 tokens
    a call (docs/measured-choices.md); a larger model's products outweigh its N x N more.

    Each token reads its row's cache over all P positions of the call (gathered per token), so the
    buffers shrink when the rows' pasts need at most half of them (`fit`), and a prompt that joins
    rows with long pasts, which would read their length for every one of its tokens, runs in a second
    call, given the cache cut to its own past (`_split`)."""

    max_tokens = 256
    wide = 4      # rows feeding more tokens than this (prompts) may run in a call of their own

    def __init__(self, manifest: Manifest):
        super().__init__(manifest)
        d = manifest.dims
        self.bucket = min(64, max(16, d.seq_length // 4))
        self._b, self._kv, self._hd = d.batch_size, d.kv_heads_per_rank, d.head_dim
        self._limit = d.seq_length
        self._layers = d.num_layers
        self.arrays: List[np.ndarray] = []
        self.reset()
        self.whole_prompts = get_family(manifest.family).whole_prompts
        self.max_picks = fixed_picks(manifest)
        self.split_positions = split_positions(manifest)

    @property
    def capacity(self) -> int:
        return self.arrays[1].shape[2]

    def _new(self, positions: int) -> List[np.ndarray]:
        key = np.zeros((self._b, self._kv, self._hd, positions), np.float32)
        value = np.zeros((self._b, self._kv, positions, self._hd), np.float32)
        return [a.copy() for _ in range(self._layers) for a in (key, value)]

    def reset(self) -> None:
        """One masked dummy position (Lite refuses zero-size dimensions)."""
        self.arrays = self._new(1)

    def ensure(self, positions: int) -> None:
        """Room for `positions` positions, keeping what is stored."""
        if positions <= self.capacity:
            return
        size = min(-(-positions // self.bucket) * self.bucket, max(self._limit, positions))
        grown = self._new(size)
        for i, (old, new) in enumerate(zip(self.arrays, grown)):
            if i % 2:
                new[:, :, :old.shape[2]] = old
            else:
                new[..., :old.shape[3]] = old
        self.arrays = grown

    def _span(self, past: np.ndarray) -> int:
        """The cache positions a call whose rows have `past` reads: their longest, up to a bucket."""
        return min(max(-(-int(past.max()) // self.bucket) * self.bucket, 1), self.capacity)

    def fit(self, past: np.ndarray) -> None:
        """Shrink the buffers to the rows' pasts (`past`, every row's) when those need at most half of
        them: the rows with long pasts have left, and every token reads its row over all the buffers'
        positions (docs/measured-choices.md)."""
        span = self._span(past)
        if self.capacity >= max(2 * span, span + self.bucket):
            self.arrays = [np.ascontiguousarray(a[:, :, :span] if i % 2 else a[..., :span])
                           for i, a in enumerate(self.arrays)]

    def _run_tokens(self, run, ids, rows, positions, past, last, extra, span=None):
        """One call; with `span` the cache is fed cut to its first `span` positions (a copy)."""
        self.fit(past)
        self.ensure(max(int(past.max()), 1))
        arrays = self.arrays if span is None or span >= self.capacity else \
            [np.ascontiguousarray(a[:, :, :span] if i % 2 else a[..., :span]) for i, a in enumerate(self.arrays)]
        outputs = run(STEP, [ids, rows, positions, past, last, *extra, *arrays])
        self.ensure(int(positions.max()) + 1)
        one = len(rows) == 1        # a batch-1 decode step: plain indices, a quarter of index arrays' cost
        r, p = (int(rows[0]), int(positions[0])) if one else (rows, positions)
        for i, (cache, new) in enumerate(zip(self.arrays, outputs[1:])):
            if i % 2:
                cache[r, :, p, :] = new[0] if one else new
            else:
                cache[r, :, :, p] = new[0] if one else new
        return outputs[0]

    def prefill(self, run, input_ids, valid_length, extra):
        self.reset()
        longest = int(valid_length.max())
        window = longest if self.whole_prompts else max(1, self.max_tokens // len(valid_length))
        logits = None
        for start in range(0, longest, window):
            counts = np.clip(valid_length - start, 0, window).astype(np.int32)
            out = self.step(run, input_ids[:, start:start + window], counts,
                            np.minimum(valid_length, start).astype(np.int32), extra)
            ending = (counts > 0) & (start + counts == valid_length)      # the rows whose last token was in it
            logits = out.copy() if logits is None else np.where(ending[:, None], out, logits)
        return logits

    def decode(self, run, input_ids, valid_length, extra):
        rows = np.arange(len(valid_length), dtype=np.int32)
        past = (valid_length - 1).astype(np.int32)
        return self._run_tokens(run, np.ascontiguousarray(input_ids[:, 0], np.int32), rows, past, past, rows, extra)

    def step(self, run, tokens, counts, past, extra, picks=None):
        """Row r's first counts[r] tokens, at positions past[r] on. Returns the logits of each row's last
        token (B, vocab; a row with none gets zeros), or with `picks` (B,) those of row r's last picks[r]
        tokens, row after row (sum(picks), vocab)."""
        counts, past = np.asarray(counts, np.int64), np.asarray(past, np.int32)
        wide = self._split(counts, past)
        if wide is None:
            return self._call(run, tokens, counts, past, extra, picks)

        def only(rows, values):
            return None if values is None else np.where(rows, values, 0)
        # a copy: a backend may hand back its output buffer, which the next call overwrites
        first = np.array(self._call(run, tokens, only(~wide, counts), past, extra, only(~wide, picks)))
        second = self._call(run, tokens, only(wide, counts), past, extra, only(wide, picks), self._span(past[wide]))
        if picks is None:
            return np.where(wide[:, None], second, first)
        which = np.repeat(wide, picks)          # row after row, each row's logits from the call that ran it
        out = np.empty((len(which),) + first.shape[1:], first.dtype)
        out[~which], out[which] = first, second
        return out

    def _split(self, counts: np.ndarray, past: np.ndarray):
        """The rows to run in a call of their own (a bool mask), or None for one call: the rows feeding
        more than `wide` tokens, when the cache positions they need not read, over all their tokens, reach
        `split_positions` (what a second reading of the weights costs)."""
        wide = counts > self.wide
        if not wide.any() or not (counts[~wide] > 0).any():
            return None
        unread = int(counts[wide].sum()) * (self.capacity - self._span(past[wide]))
        return wide if unread >= self.split_positions else None

    def _call(self, run, tokens, counts, past, extra, picks=None, span=None):
        rows = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        ends = np.cumsum(counts)
        index = np.arange(int(ends[-1])) - np.repeat(ends - counts, counts)    # each token's index in its row
        positions = (past[rows] + index).astype(np.int32)
        live = None
        if picks is None:
            # the head runs only for the rows that fed tokens (docs/measured-choices.md)
            live = np.flatnonzero(counts > 0) if counts.any() else np.arange(1)
            last = ends[live] - 1 if counts.any() else np.zeros(1, np.int64)
        else:
            picks = np.asarray(picks, np.int64)
            last = np.arange(int(picks.sum())) - np.repeat(np.cumsum(picks) - picks, picks) + \
                np.repeat(ends - picks, picks)
        wanted = len(last)
        if not wanted and self.max_picks is None:       # a call that picks none (prompt chunks): one row's, unused
            last = np.zeros(1, np.int64)
        if self.max_picks is not None and wanted != self.max_picks:
            if wanted > self.max_picks:
                raise UnsupportedError(f"this export returns {self.max_picks} logits a step, {wanted} were asked "
                                       "for (speculative decoding): export it again")
            last = np.concatenate([last, np.zeros(self.max_picks - wanted, last.dtype)])
        logits = self._run_tokens(run, np.ascontiguousarray(tokens[rows, index], np.int32), rows, positions,
                                  past, last.astype(np.int32), extra, span)[:wanted]
        if live is None or len(live) == len(counts):
            return logits
        every = np.zeros((len(counts),) + logits.shape[1:], logits.dtype)
        every[live] = logits[:len(live)]
        return every


def split_positions(manifest: Manifest) -> int:
    """Token x cache positions (a packed step's per-token gather of its row's cache) worth a second
    call: those whose keys and values, in every layer, are 3/4 of a rank's weights' bytes, estimated
    as 12 hidden² float32 a layer (a quantized export's are fewer bytes: this errs towards one call).
    (`tools/bench_mixed_step.py`; docs/measured-choices.md). With the attention kernel a token reads only its
    own row's past: never split."""
    if ATTEND_TYPE in manifest.kernels or PAGED_ATTEND_TYPE in manifest.kernels:
        return sys.maxsize
    d, config = manifest.dims, manifest.model_config
    hidden = d.hidden_size or int(config.get("hidden_size", 0))
    ranks = max(1, int(config.get("n_kv_heads", d.kv_heads_per_rank)) // d.kv_heads_per_rank)
    return max(1, 9 * hidden * hidden * 4 // ranks // (8 * d.kv_heads_per_rank * d.head_dim))


def fixed_picks(manifest: Manifest):
    """How many logits a packed step returns when that is fixed (B, exports before L was chosen per call), else None."""
    picked = next(s for s in manifest.graphs[STEP].inputs if s.name == "last_token").shape[0]
    return None if picked == DYNAMIC else picked


KV_CACHES = {"io": HostKVCache, "in_graph": InGraphCache, "packed": PackedKVCache}
