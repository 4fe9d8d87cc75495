"""ChatGLM-6B's tokenizer (``ice_text.model``) on a sentencepiece model trained here (no downloads).

The model reproduces the released ice_text.model's id layout: ``<unk> <s> </s> <pad> <n>`` are
ids 0-4, the trained pieces follow, unused filler pieces pad the text part to 130000 pieces,
then come GLM's specials ``[MASK] [gMASK] [sMASK] <unused_0> <sop> <eop> <ENC> <dBLOCK>``
(130000-130007; control pieces, as icetk added them), ``<|tab|>`` (130008), ``<|blank_2|>`` ...
``<|blank_80|>`` (130009-130087) and the 256 byte pieces (130088-130343): 130344 pieces, as
upstream's model. Not reproduced: the released model's 130000 trained pieces and its normaliser
(the identity here, so all text round-trips).
"""
from __future__ import annotations

import json
import shutil

import pytest

from lite_runtime.contract.errors import ArtifactError, ConfigError
from lite_runtime.decode.streamers import RowDetokenizer, TextStreamer, continuation_text
from lite_runtime.tokenizers import (ChatGLM6BTokenizer, JiebaSentencePieceTokenizer, SentencePieceTokenizer,
                                     load_tokenizer, tokenizer_class_for)
from support.chatglm6b_model import (CODE, SPECIALS, WHITESPACE, trained_model, upstream_ids, upstream_text,
                                     with_glm_layout)

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

MASK, GMASK, SOP, EOP = 130000, 130001, 130004, 130005
QUESTION = "中国的首都是哪个城市？"
LONG_BLANKS = "a" + " " * 80 + "b" + " " * 81 + "c" + " " * 165 + "d"
TEXTS = [QUESTION, "问：你好\n答：你好👋！我是人工智能助手。\n", CODE, LONG_BLANKS, " 前面一个空格", "\n开头换行",
         "结尾空格 ", "tab\t\tand  two", "<n> written out", "\n", " ", ""]
TEXT_IDS = ["question", "dialog", "code", "long-blanks", "leading-space", "leading-newline", "trailing-space",
            "tabs", "literal-marker", "newline", "space", "empty"]
FFFD = "\ufffd"


@pytest.fixture(scope="module")
def plain_model():
    return trained_model()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, plain_model):
    folder = tmp_path_factory.mktemp("chatglm6b")
    (folder / "ice_text.model").write_bytes(with_glm_layout(plain_model))
    return folder


@pytest.fixture(scope="module")
def sp(model_dir):
    import sentencepiece as spm
    return spm.SentencePieceProcessor(model_file=str(model_dir / "ice_text.model"))


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def first_release(tmp_path_factory, model_dir):
    """The first release's ids: 20000 image ids before the text ids (tokenizer_config.json says so)."""
    folder = tmp_path_factory.mktemp("chatglm6b_icetk_ids")
    shutil.copyfile(model_dir / "ice_text.model", folder / "ice_text.model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"num_image_tokens": 20000}))
    return load_tokenizer(folder)


def test_the_layout_is_the_released_models(sp):
    assert sp.get_piece_size() == 130344
    assert [sp.id_to_piece(i) for i in range(5)] == ["<unk>", "<s>", "</s>", "<pad>", "<n>"]
    assert [sp.piece_to_id(p) for p in SPECIALS] == list(range(130000, 130008))
    assert [sp.piece_to_id(p) for p in WHITESPACE] == list(range(130008, 130088))
    assert (sp.piece_to_id("<0x00>"), sp.piece_to_id("<0xFF>")) == (130088, 130343)


def test_ice_text_model_is_dispatched(model_dir, tmp_path):
    model = model_dir / "ice_text.model"
    assert type(load_tokenizer(model)) is ChatGLM6BTokenizer
    assert type(load_tokenizer(model_dir, jieba=False)) is ChatGLM6BTokenizer   # jieba off: it has none
    assert tokenizer_class_for(str(model), jieba=True) is JiebaSentencePieceTokenizer
    shutil.copyfile(model, tmp_path / "tokenizer.model")
    assert type(load_tokenizer(tmp_path)) is SentencePieceTokenizer   # other names: plain sentencepiece


def test_special_tokens(tok):
    assert (tok.bos_token_id, tok.eos_token_id, tok.eos_token_ids, tok.pad_token_id) == (SOP, EOP, [EOP], 3)
    assert tok.vocab_size == 130344 and tok.prefix_ids == [] and tok.suffix_ids == [GMASK, SOP]
    assert set(range(130000, 130008)) | {1, 2, 3} <= tok.all_special_ids
    assert not {0, 4, 130008, 130009} & tok.all_special_ids   # <unk>, <n>, <|tab|>, <|blank_2|> are text
    for i, token in enumerate(SPECIALS):
        assert tok.encode(token) == [MASK + i] and tok.id_to_piece(MASK + i) == token


@pytest.mark.parametrize("text", TEXTS, ids=TEXT_IDS)
def test_round_trip(tok, text):
    expected = text.replace("<n>", "\n")   # as upstream, the written-out marker decodes to a newline
    assert tok.decode(tok.encode(text)) == expected


@pytest.mark.parametrize("text", TEXTS, ids=TEXT_IDS)
def test_ids_and_text_are_upstreams(tok, sp, text):
    ids = tok.encode(text)
    assert ids == upstream_ids(sp, text)
    assert tok.decode(ids) == upstream_text(sp, ids)


def test_markers_are_single_pieces(tok, sp):
    ids = tok.encode("a\nb\tc  d" + " " * 83 + "e")
    assert [tok.id_to_piece(i) for i in ids if tok.id_to_piece(i).startswith("<")] == \
        ["<n>", "<|tab|>", "<|blank_2|>", "<|blank_80|>", "<|blank_3|>"]
    assert ids.count(4) == 1 and 130008 in ids   # <n>, <|tab|>


def test_question_ids(tok, sp):
    ids = tok.encode(QUESTION, add_special_tokens=True)
    assert ids == sp.encode(QUESTION) + [GMASK, SOP]   # no whitespace: the preprocessing changes nothing
    assert ids[0] == sp.piece_to_id("\u2581")   # sentencepiece's dummy prefix: upstream's "你好" is [5, ...]
    assert tok.decode(ids) == QUESTION
    assert tok.decode(ids, skip_special_tokens=False) == QUESTION + "[gMASK]<sop>"


def test_special_tokens_inside_a_text(tok, sp):
    text = "问：你好<sop>答：[gMASK]"
    ids = tok.encode(text)
    assert ids == upstream_ids(sp, "问：你好") + [SOP] + upstream_ids(sp, "答：") + [GMASK]
    assert tok.decode(ids) == upstream_text(sp, ids) == "问：你好 答："   # the second text's "▁" is a space
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_prompt_options(model_dir, sp):
    q = upstream_ids(sp, QUESTION)
    assert load_tokenizer(model_dir, add_bos=True).encode(QUESTION, True) == [SOP] + q + [GMASK, SOP]
    assert load_tokenizer(model_dir, prefix_tokens=["[MASK]"]).encode(QUESTION, True) == [MASK] + q + [GMASK, SOP]
    assert load_tokenizer(model_dir, eos_token_id=2, pad_token_id=0).eos_token_ids == [2]
    extra = load_tokenizer(model_dir, special_tokens=["<|user|>", "<eop>"])
    assert extra.encode("<|user|>") == [130344] and extra.vocab_size == 130345 and extra.encode("<eop>") == [EOP]


def test_first_release_id_offset(first_release, sp, model_dir):
    tok = first_release
    assert (tok.num_image_tokens, tok.vocab_size) == (20000, 150344)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (150004, 150005, 20003)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=True)
        assert ids == upstream_ids(sp, text, 20000) + [150001, 150004]
        assert tok.decode(ids) == upstream_text(sp, ids, 20000) == text.replace("<n>", "\n")
    assert tok.encode("\n") == [20000 + sp.piece_to_id("\u2581"), 20004]
    assert tok.id_to_piece(7) == "<image_7>" and tok.decode([7] + tok.encode("你好") + [19999]) == "你好"
    direct = ChatGLM6BTokenizer(str(model_dir / "ice_text.model"), num_image_tokens=20000)
    assert direct.encode(CODE) == tok.encode(CODE)


def test_bad_num_image_tokens(model_dir, tmp_path):
    shutil.copyfile(model_dir / "ice_text.model", tmp_path / "ice_text.model")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"num_image_tokens": "20000"}))
    with pytest.raises(ArtifactError, match="num_image_tokens must be a non-negative integer"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"num_image_tokens": 0}))
    assert load_tokenizer(tmp_path).encode(QUESTION) == load_tokenizer(model_dir).encode(QUESTION)
    with pytest.raises(ConfigError, match="num_image_tokens: expected a non-negative integer"):
        ChatGLM6BTokenizer(str(tmp_path / "ice_text.model"), num_image_tokens=-1)


def test_a_model_without_glm_pieces_is_refused(plain_model, tmp_path):
    (tmp_path / "ice_text.model").write_bytes(plain_model)
    with pytest.raises(ArtifactError, match=r"has no \[gMASK\], <sop>, <eop> piece: not a ChatGLM-6B"):
        load_tokenizer(tmp_path)


class Recorder(list):
    write = list.append

    def flush(self):
        pass


def streamed(tok, ids):
    decoder = RowDetokenizer(tok)
    chunks = [decoder.push([token]) for token in ids] + [decoder.flush()]
    assert not any(FFFD in chunk for chunk in chunks)
    return "".join(chunks)


@pytest.mark.parametrize("text", TEXTS[:8], ids=TEXT_IDS[:8])
def test_streamed_text_equals_full_decode(tok, text):
    ids = tok.encode(text, add_special_tokens=True)
    assert streamed(tok, ids) == tok.decode(ids) == text.replace("<n>", "\n")
    out = Recorder()
    streamer = TextStreamer(tok, file=out)
    for token in ids:
        streamer.put([token])
    streamer.end()
    assert "".join(out) == tok.decode(ids) + "\n"


def test_streamed_markers_and_spaces_between_steps(tok, sp):
    """Generated ids that encode would not give: markers before "▁" pieces, a marker spelt by ordinary pieces."""
    space = sp.piece_to_id("\u2581")
    pieces = [sp.piece_to_id(p) for p in ("\u2581t", "<n>", "\u2581a", "<|blank_3|>", "\u2581", "<|tab|>", "<n>")]
    assert 0 not in pieces
    spelt = [sp.piece_to_id(p) for p in ("<", "n", ">")]
    assert 0 not in spelt
    for ids in (pieces, [space] + pieces, pieces + spelt + pieces, [EOP, 4, 4, space, 4]):
        assert streamed(tok, ids) == tok.decode(ids)
    assert tok.decode(pieces) == "t\n a    \t\n"
    assert tok.decode(spelt) == "<n>"   # only the <n> piece is a newline (upstream would print one here)


def test_continuation_after_a_prompt(tok):
    ids = tok.encode("问：你好\n答：" + CODE + QUESTION)
    full = tok.decode(ids)
    for k in range(1, len(ids)):
        if not tok.decode(ids[:k]).endswith(FFFD):
            assert continuation_text(tok, ids[:k], ids[k:]) == full[len(tok.decode(ids[:k])):]


def test_question_has_byte_pieces(tok):
    """So the streaming tests see characters split over several tokens."""
    assert any(130088 <= i < 130344 for i in tok.encode(QUESTION))
