from __future__ import annotations

import numpy as np
import pytest

from support.tiny_models import train_byte_bpe_tokenizer
from lite_runtime.contract.errors import ArtifactError, ConfigError, ValidationError
from lite_runtime.tokenizers import SentencePieceTokenizer as Tokenizer, load_tokenizer
from lite_runtime.tokenizers.base import TokenizerOptions

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a small test of the tokenizer.",
    "你好，世界！今天天气很好。",
    "机器学习和深度学习",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sp")
    train_byte_bpe_tokenizer(folder, CORPUS)
    return folder


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(model_dir / "tokenizer.model")


def test_special_ids_and_vocab(tok):
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, None)
    assert tok.vocab_size == 400
    assert {1, 2} <= tok.all_special_ids and 0 not in tok.all_special_ids


@pytest.mark.parametrize("text", ["Hello world", "你好世界", "猫 and 犬 😀 ok", ""])
def test_round_trip_including_byte_fallback(tok, text):
    ids = tok.encode(text)
    assert all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text


def test_unseen_characters_use_byte_pieces(tok):
    ids = tok.encode("猫")  # not in the corpus: three UTF-8 byte pieces
    assert [tok.id_to_piece(i) for i in ids][-3:] == ["<0xE7>", "<0x8C>", "<0xAB>"]


def test_add_special_tokens_prepends_bos_only(tok):
    plain = tok.encode("Hello")
    assert tok.encode("Hello", add_special_tokens=True) == [1] + plain
    assert tok.encode("Hello", add_special_tokens=False) == plain


def test_decode_skips_special_tokens_unless_asked(tok):
    ids = [1] + tok.encode("Hello world") + [2]
    assert tok.decode(ids) == "Hello world"
    assert tok.decode(np.array(ids, dtype=np.int32)) == "Hello world"
    shown = tok.decode(ids, skip_special_tokens=False)
    assert shown.startswith("<s>") and shown.endswith("</s>") and "Hello world" in shown
    assert tok.batch_decode([ids, ids[:3]]) == ["Hello world", tok.decode(ids[:3])]


def test_decode_rejects_ids_outside_vocab(tok):
    with pytest.raises(ValidationError, match="token id 400 is outside the vocabulary"):
        tok.decode([5, 400])
    with pytest.raises(ValidationError, match="-1"):
        tok.decode(np.array([-1]))
    with pytest.raises(ValidationError, match="text"):
        tok.encode(b"bytes")


def test_overrides(model_dir):
    tok = load_tokenizer(model_dir, pad_token_id=0, eos_token_id=2)
    assert tok.pad_token_id == 0 and 0 in tok.all_special_ids
    with pytest.raises(ConfigError, match="pad_token_id: 400 is outside"):
        Tokenizer(str(model_dir / "tokenizer.model"), TokenizerOptions(pad_token_id=400))
    with pytest.raises(ConfigError, match="bos_token_id"):
        Tokenizer(str(model_dir / "tokenizer.model"), TokenizerOptions(bos_token_id="1"))


def test_load_from_export_folder(model_dir):
    assert load_tokenizer(str(model_dir)).encode("Hello") == load_tokenizer(
        model_dir / "tokenizer.model"
    ).encode("Hello")


def test_load_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope" / "tokenizer.model"
    with pytest.raises(ArtifactError, match="does not exist") as info:
        load_tokenizer(missing)
    assert str(missing) in str(info.value)

    (tmp_path / "tokenizer.json").write_text("{}")        # a damaged tokenizer.json is named, not skipped
    with pytest.raises(ArtifactError, match="cannot read .*tokenizer.json") as info:
        load_tokenizer(tmp_path)
    assert len(str(info.value).splitlines()) == 1

    broken = tmp_path / "broken.model"
    broken.write_bytes(b"not a model")
    with pytest.raises(ArtifactError, match="cannot read sentencepiece model") as info:
        load_tokenizer(broken)
    assert str(broken) in str(info.value)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ArtifactError, match="no tokenizer") as info:
        load_tokenizer(empty)
    assert str(empty) in str(info.value)
