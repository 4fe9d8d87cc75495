"""python tests/support/packed_split_runner.py EXPORT BACKEND: test_packed_calls' comparisons, in a process of their
own (real Lite must not share it with mindspore); prints the dicts `compare` and `lone_prompt` return."""
import sys

import numpy as np

PAST, PROMPT = 100, 20       # rows 0..B-2 have PAST cached positions; the last row's prompt joins them


def _filled(session, ids):
    """Every row but the last given PAST positions, in calls of 32 tokens."""
    session.cache.reset()
    batch = ids.shape[0]
    counts = np.array([PAST] * (batch - 1) + [0], np.int32)
    for start in range(0, PAST, 32):
        session.step(ids[:, start:start + 32], np.clip(counts - start, 0, 32).astype(np.int32),
                     np.minimum(counts, start).astype(np.int32))


def _mixed(session, ids, split_positions, picks=None):
    """One step: the rows with a past feed 1 token (3 with picks: a token and 2 guesses), the last row its
    PROMPT tokens. Returns (logits, graph calls made)."""
    cache = session.cache
    _filled(session, ids)
    keep, calls, run = cache.split_positions, [], session._run
    cache.split_positions = split_positions if split_positions is not None else keep
    session._run = lambda kind, feeds: calls.append(feeds[-1].shape) or run(kind, feeds)
    batch = ids.shape[0]
    fed = 1 if picks is None else 3
    counts = np.array([fed] * (batch - 1) + [PROMPT], np.int32)
    past = np.array([PAST] * (batch - 1) + [0], np.int32)
    tokens = ids[:, PAST:PAST + PROMPT]
    try:
        if picks is None:
            logits = session.step(tokens, counts, past)
        else:
            logits = session.verify(tokens, counts, past, np.array([fed] * (batch - 1) + [1], np.int64))
        return np.array(logits), len(calls)
    finally:
        cache.split_positions, session._run = keep, run


def compare(export, backend):
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    manifest = load_manifest(export)
    session = load_session(backend, manifest)
    ids = np.random.default_rng(0).integers(3, manifest.vocab_size, size=(manifest.batch_size, PAST + PROMPT),
                                            dtype=np.int64).astype(np.int32)
    out = {}
    for picks in (None, True):
        one, one_calls = _mixed(session, ids, 1 << 60, picks)
        two, two_calls = _mixed(session, ids, 1, picks)
        _, default_calls = _mixed(session, ids, None, picks)
        out["verify" if picks else "step"] = (float(np.abs(one - two).max()), float(np.abs(one).max()),
                                              one_calls, two_calls, default_calls)
    # the last row alone, on an empty cache: what its prompt's logits are without the other rows
    session.cache.reset()
    counts = np.array([0] * (manifest.batch_size - 1) + [PROMPT], np.int32)
    alone = session.step(ids[:, PAST:PAST + PROMPT], counts, np.zeros(manifest.batch_size, np.int32))[-1]
    two, _ = _mixed(session, ids, 1)
    out["alone"] = float(np.abs(np.array(alone) - two[-1]).max())
    session.close()
    return out


def lone_prompt(export, backend, length=40, chunk=8, new_tokens=6):
    """A prompt of `length` tokens in an engine with prompt chunks of `chunk`: alone, twice at once, then alone
    again (the cache grown by the others). Returns each run's greedy tokens and its graph calls' (tokens,
    cache positions)."""
    from lite_runtime.backends import load_session
    from lite_runtime.contract.manifest import load_manifest
    from lite_runtime.decode.engine import Engine, EngineRequest
    manifest = load_manifest(export)
    session = load_session(backend, manifest)
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, manifest.vocab_size, length)]
    calls, run = [], session._run
    session._run = lambda kind, feeds: calls.append((int(np.size(feeds[0])), feeds[-1].shape[-2])) or run(kind, feeds)
    out = {}
    for run_index, copies in enumerate((1, 2, 1)):
        engine, got = Engine(session, threaded=False, prefill_chunk=chunk), [[] for _ in range(copies)]
        for i in range(copies):
            engine.submit(EngineRequest(prompt, new_tokens, on_token=lambda t, lp, i=i: got[i].append(t),
                                        on_finish=lambda reason: None))
        calls.clear()
        engine.run_until_idle()
        out[run_index] = (got, list(calls))
    session.close()
    return out


if __name__ == "__main__":
    print(compare(sys.argv[1], sys.argv[2]))
    print(lone_prompt(sys.argv[1], sys.argv[2]))
