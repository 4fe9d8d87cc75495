"""PanguAlpha's jieba + sentencepiece tokenizer (``vocab.model``) on a sentencepiece model
trained here on jieba-segmented Chinese couplets and English (no downloads)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from lite_runtime.contract.errors import ConfigError
from lite_runtime.decode.streamers import RowDetokenizer, TextStreamer, continuation_text
from lite_runtime.tokenizers import JiebaSentencePieceTokenizer, SentencePieceTokenizer, load_tokenizer

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = ["上联：欢天喜地度佳节 下联：笑逐颜开迎佳期 横批：幸福快乐",
          "上联：春风得意花千树 下联：秋月扬辉水一方 横批：春意盎然",
          "中国的首都是北京。北京是一个美丽的城市。",
          "Hello world, this is a small test.\nThe quick brown fox jumps over the lazy dog."]
COUPLET = "上联：欢天喜地度佳节 下联："
QUESTION = "中国的首都是哪个城市？"
MIXED = "Hello  world,\nthis is 中国\n\n the  end "
TEXTS = [COUPLET, QUESTION, MIXED, "下联：笑逐颜开迎佳期 😀", "\n", ""]
TEXT_IDS = ["couplet", "question", "mixed", "emoji", "newline", "empty"]
SPECIALS = ["<eod>", "<eot>", "<pad>"]   # PanguAlpha's names; user-defined pieces 3, 4, 5 here
FFFD = "\ufffd"


def pangu_input(text: str) -> str:
    """What upstream gives sentencepiece: jieba words, " " -> U+2582 and "\\n" -> U+2583, joined by spaces."""
    import jieba
    marks = {" ": "\u2582", "\n": "\u2583"}
    return " ".join("".join(marks.get(c, c) for c in word) for word in jieba.cut(text, cut_all=False))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import sentencepiece as spm
    folder = tmp_path_factory.mktemp("pangu")
    corpus = os.path.join(str(folder), "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join([pangu_input(line) for line in CORPUS] * 20))
    # identity normalisation keeps full-width punctuation; byte fallback covers unseen characters
    spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(str(folder), "vocab"), vocab_size=400,
                                   model_type="bpe", byte_fallback=True, character_coverage=0.98,
                                   normalization_rule_name="identity", user_defined_symbols=SPECIALS,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    os.remove(corpus)
    return folder


@pytest.fixture(scope="module")
def sp(model_dir):
    import sentencepiece as spm
    return spm.SentencePieceProcessor(model_file=str(model_dir / "vocab.model"))


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(model_dir)


def test_vocab_model_is_dispatched_to_jieba(model_dir, tmp_path):
    assert type(load_tokenizer(model_dir / "vocab.model")) is JiebaSentencePieceTokenizer
    assert type(load_tokenizer(model_dir, jieba=False)) is SentencePieceTokenizer
    other = tmp_path / "tokenizer.model"
    shutil.copyfile(model_dir / "vocab.model", other)
    assert type(load_tokenizer(tmp_path)) is SentencePieceTokenizer
    assert type(load_tokenizer(other, jieba=True)) is JiebaSentencePieceTokenizer
    with pytest.raises(ConfigError, match="jieba: expected True, False or None"):
        load_tokenizer(model_dir, jieba="yes")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="jieba: applies to sentencepiece"):
        load_tokenizer(tmp_path / "tokenizer.json", jieba=True)


@pytest.mark.parametrize("text", TEXTS, ids=TEXT_IDS)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("text", TEXTS, ids=TEXT_IDS)
def test_ids_are_upstreams(tok, sp, text):
    assert tok.encode(text) == sp.encode(pangu_input(text))


def test_spaces_and_newlines_become_marks(tok):
    text = "Hello  world,\nthe 上联"   # every character has a piece: no byte fallback
    pieces = "".join(tok.id_to_piece(i) for i in tok.encode(text))
    assert pieces.replace("\u2581", "") == "Hello\u2582\u2582world,\u2583the\u2582上联"


def test_special_tokens(tok, sp):
    eot, eod, pad = (sp.piece_to_id(t) for t in ("<eot>", "<eod>", "<pad>"))
    assert (eod, eot, pad) == (3, 4, 5)
    assert (tok.eos_token_id, tok.eos_token_ids, tok.pad_token_id, tok.bos_token_id) == (eot, [eot], pad, 1)
    assert {eot, eod, pad, 1, 2} <= tok.all_special_ids
    ids = tok.encode(COUPLET)
    assert tok.encode(COUPLET, add_special_tokens=True) == ids   # upstream adds no BOS
    assert tok.decode(ids + [eot, pad]) == COUPLET
    assert tok.decode(ids + [eot], skip_special_tokens=False) == COUPLET + "<eot>"


def test_overrides(model_dir, sp):
    tok = load_tokenizer(model_dir, add_bos=True, eos_token_id=2, pad_token_id=0)
    assert tok.encode(QUESTION, add_special_tokens=True) == [1] + sp.encode(pangu_input(QUESTION))
    assert (tok.eos_token_id, tok.pad_token_id) == (2, 0)


class Recorder(list):
    write = list.append

    def flush(self):
        pass


@pytest.mark.parametrize("text", [COUPLET + "笑逐颜开迎佳期", QUESTION + " 😀", MIXED],
                         ids=["couplet", "question", "mixed"])
def test_streamed_text_equals_full_decode(tok, text):
    ids = tok.encode(text)
    decoder = RowDetokenizer(tok)
    chunks = [decoder.push([token]) for token in ids] + [decoder.flush()]
    assert "".join(chunks) == tok.decode(ids) == text
    assert not any(FFFD in chunk for chunk in chunks)

    out = Recorder()
    streamer = TextStreamer(tok, file=out)
    for token in ids:
        streamer.put([token])
    streamer.end()
    assert "".join(out) == text + "\n"


def test_question_has_byte_pieces(tok):
    """So the streaming tests see characters split over several tokens."""
    assert any(FFFD in tok.decode([i]) for i in tok.encode(QUESTION))


def test_continuation_after_a_prompt(tok):
    ids = tok.encode(COUPLET + "笑逐颜开迎佳期 " + QUESTION)
    full = tok.decode(ids)
    for k in range(1, len(ids)):
        if not tok.decode(ids[:k]).endswith(FFFD):
            assert continuation_text(tok, ids[:k], ids[k:]) == full[len(tok.decode(ids[:k])):]


def test_jieba_is_imported_lazily_and_quietly(model_dir, tmp_path):
    shutil.copyfile(model_dir / "vocab.model", tmp_path / "tokenizer.model")
    script = (
        "import sys\n"
        "from lite_runtime.tokenizers import load_tokenizer\n"
        f"load_tokenizer({str(tmp_path)!r}).encode('中国')\n"
        "assert 'jieba' not in sys.modules\n"
        f"print(load_tokenizer({str(model_dir)!r}).encode('中国'))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert run.stdout.strip() != "[]"
