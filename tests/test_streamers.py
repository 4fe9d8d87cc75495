from __future__ import annotations

import io
import threading

import numpy as np
import pytest

from support.tiny_models import train_byte_bpe_tokenizer
from lite_runtime.contract.errors import ValidationError
from lite_runtime.decode.streamers import RowDetokenizer, TextIteratorStreamer, TextStreamer
from lite_runtime.tokenizers import load_tokenizer

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a small test of streaming.",
    "你好，世界！今天天气很好。",
    "机器学习和深度学习",
    "emoji 😀 rocket 🚀 ok",
]
TEXTS = [
    "Hello world",
    "你好世界，机器学习！",
    "猫 犬 鱼 and 😀🚀 mixed 中文 text",  # 猫犬鱼 are not in the corpus: byte pieces
    "a  b   c",
    "  leading spaces",
    "ünïcödé ñ 日本語のテキスト",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(train_byte_bpe_tokenizer(tmp_path_factory.mktemp("sp"), CORPUS))


class CountingTokenizer:
    """Wraps a tokenizer and records the length of every decoded window."""

    def __init__(self, inner):
        self.inner = inner
        self.all_special_ids = inner.all_special_ids
        self.windows = []

    def decode(self, ids, skip_special_tokens=True):
        self.windows.append(len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def _stream_one_by_one(tokenizer, ids):
    decoder = RowDetokenizer(tokenizer)
    chunks = [decoder.push([token]) for token in ids]
    chunks.append(decoder.flush())
    return [chunk for chunk in chunks if chunk]


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_full_decode_and_never_splits_characters(tok, text):
    ids = tok.encode(text)
    chunks = _stream_one_by_one(tok, ids)
    assert "".join(chunks) == tok.decode(ids)
    assert not any("\ufffd" in chunk for chunk in chunks)


def test_multi_byte_characters_arrive_whole(tok):
    ids = tok.encode("猫😀")
    assert len(ids) >= 7  # 3 + 4 byte pieces (plus a space piece)
    assert _stream_one_by_one(tok, ids) == ["猫", "😀"]


def test_random_token_sequences_match_full_decode(tok):
    rng = np.random.default_rng(0)
    pieces = [tok.encode(text) for text in TEXTS + CORPUS]
    space = next(i for i in range(tok.vocab_size) if tok.id_to_piece(i) == "\u2581")
    # specials, unk, stray bytes and bare space pieces (runs of them are where the
    # decoder's leading-space stripping could leak across the window)
    extras = [1, 2, 0, 3, 200, space, space]
    for _ in range(300):
        ids = []
        for _ in range(rng.integers(1, 8)):
            if rng.random() < 0.4:
                ids += [int(rng.choice(extras))] * int(rng.integers(1, 4))
            ids += pieces[rng.integers(len(pieces))]
        assert "".join(_stream_one_by_one(tok, ids)) == tok.decode(ids), ids


def test_decoded_window_stays_small(tok):
    counting = CountingTokenizer(tok)
    ids = tok.encode(" ".join(TEXTS * 20)) + [2] * 200  # a finished row keeps receiving EOS
    assert "".join(_stream_one_by_one(counting, ids)) == tok.decode(ids)
    assert len(ids) > 400 and max(counting.windows) <= 12


def test_several_tokens_per_put_and_array_inputs(tok):
    ids = tok.encode(TEXTS[2])
    streamer = TextIteratorStreamer(tok)
    for start in range(0, len(ids), 3):
        streamer.put(np.array([ids[start:start + 3]], dtype=np.int32))
    streamer.end()
    assert "".join(streamer.rows[0]) == tok.decode(ids)


def _feed_batch(streamer, rows, eos=2):
    """One put per step; a finished row gets EOS (row 0) or nothing (other rows)."""
    for step in range(max(len(r) for r in rows) + 3):
        entries = []
        for index, row in enumerate(rows):
            if step < len(row):
                entries.append(row[step])
            else:
                entries.append(eos if index == 0 else [])
        streamer.put(entries)
    streamer.end()


def test_iterator_streamer_keeps_rows_separate(tok):
    rows = [tok.encode(text) for text in TEXTS[:3]]
    streamer = TextIteratorStreamer(tok, batch_size=3)
    _feed_batch(streamer, rows)
    for index, row in enumerate(rows):
        assert "".join(streamer.rows[index]) == tok.decode(row)
    by_row = {0: "", 1: "", 2: ""}
    for index, text in streamer:
        by_row[index] += text
    assert by_row == {i: tok.decode(row) for i, row in enumerate(rows)}


def test_iterator_streamer_with_producer_thread(tok):
    rows = [tok.encode(text) for text in TEXTS[1:3]]
    streamer = TextIteratorStreamer(tok, batch_size=2, timeout=30)
    producer = threading.Thread(target=_feed_batch, args=(streamer, rows))
    producer.start()
    received = {0: [], 1: []}
    for index, text in streamer:
        received[index].append(text)
    producer.join()
    assert ["".join(received[i]) for i in range(2)] == [tok.decode(r) for r in rows]
    assert len(received[1]) > 1  # streamed in pieces, not as one block


def test_text_streamer_prints_one_row_live(tok):
    out = io.StringIO()
    streamer = TextStreamer(tok, file=out)
    ids = tok.encode(TEXTS[1])
    for token in ids[:-1]:
        streamer.put([token])
    assert out.getvalue() and tok.decode(ids).startswith(out.getvalue())
    streamer.put([ids[-1]])
    streamer.end()
    assert out.getvalue() == tok.decode(ids) + "\n"


def test_text_streamer_never_interleaves_a_batch(tok):
    rows = [tok.encode(text) for text in TEXTS[:3]]
    out = io.StringIO()
    _feed_batch(TextStreamer(tok, file=out), rows)
    assert out.getvalue() == "".join(tok.decode(r) + "\n" for r in rows)

    files = [io.StringIO() for _ in rows]
    _feed_batch(TextStreamer(tok, file=files), rows)
    assert [f.getvalue() for f in files] == [tok.decode(r) + "\n" for r in rows]


def test_misuse_is_reported(tok):
    streamer = TextIteratorStreamer(tok, batch_size=2)
    with pytest.raises(ValidationError, match="2 rows"):
        streamer.put([5])
    with pytest.raises(ValidationError, match="new_ids"):
        streamer.put(5)
    streamer.end()
    with pytest.raises(ValidationError, match="after end"):
        streamer.put([5, 6])
    with pytest.raises(ValidationError, match="batch_size"):
        TextIteratorStreamer(tok, batch_size=0)
