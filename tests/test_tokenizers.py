"""lite_runtime.tokenizers on tokenizers built here (no downloads): a sentencepiece model and a
byte-level BPE tokenizer.json trained on a small corpus, a .tiktoken file from a rank table."""
from __future__ import annotations

import base64
import json
import os
import shutil

import numpy as np
import pytest

from lite_runtime.contract.errors import ArtifactError, ConfigError, ValidationError
from lite_runtime.decode.streamers import RowDetokenizer, TextStreamer, continuation_text
from lite_runtime.tokenizers import (HFJsonTokenizer, SentencePieceTokenizer, TiktokenTokenizer, Tokenizer,
                                     load_tokenizer)
from support.tokenizer_files import (MERGED, QUESTION, STREAM_TEXTS, TEXTS, train_byte_level_json, train_sentencepiece,
                                     write_tiktoken)

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`

CHATGLM_SPECIALS = ["[MASK]", "[gMASK]", "[sMASK]", "sop", "eop", "<|system|>", "<|user|>", "<|assistant|>"]
FFFD = "\ufffd"
KINDS = ["sp", "hf", "tiktoken"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    (root / "sp").mkdir(), (root / "qwen").mkdir()
    return {"sp": train_sentencepiece(root / "sp"), "hf": train_byte_level_json(root / "hf" / "tokenizer.json"),
            "tiktoken": write_tiktoken(root / "qwen" / "qwen.tiktoken")}


@pytest.fixture(scope="module")
def toks(files):
    return {kind: load_tokenizer(files[kind]) for kind in KINDS}


def raises(error, pattern, call, *args, **kwargs) -> str:
    """Calls `call`, which must raise `error` with a one-line message matching `pattern`."""
    with pytest.raises(error, match=pattern) as info:
        call(*args, **kwargs)
    assert "\n" not in str(info.value), str(info.value)
    return str(info.value)


# -- detection ------------------------------------------------------------------------
def test_load_detects_the_kind_from_file_and_folder(files, toks, tmp_path):
    classes = {"sp": SentencePieceTokenizer, "hf": HFJsonTokenizer, "tiktoken": TiktokenTokenizer}
    for kind in KINDS:
        assert type(toks[kind]) is classes[kind] and isinstance(toks[kind], Tokenizer)
        folder = load_tokenizer(os.path.dirname(files[kind]))
        assert type(folder) is classes[kind] and folder.path == files[kind]
    # a folder prefers tokenizer.json, then *.tiktoken, then tokenizer.model
    for kind, name in [("sp", "tokenizer.model"), ("tiktoken", "qwen.tiktoken"), ("hf", "tokenizer.json")]:
        shutil.copy(files[kind], tmp_path / name)
        assert type(load_tokenizer(tmp_path)) is classes[kind]


# -- round trips ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(toks, kind, text):
    tok = toks[kind]
    ids = tok.encode(text)
    assert all(type(i) is int for i in ids)
    assert tok.decode(ids) == text == tok.decode(np.array(ids, dtype=np.int64))


def test_chinese_uses_byte_pieces_and_multi_character_tokens(toks):
    sp, hf, tt = toks["sp"], toks["hf"], toks["tiktoken"]
    assert [sp.id_to_piece(i) for i in sp.encode("猫")][-3:] == ["<0xE7>", "<0x8C>", "<0xAB>"]
    hf_pieces = [hf.id_to_piece(i) for i in hf.encode(QUESTION)]
    assert "ä¸" in hf_pieces or any(len(p) > 3 for p in hf_pieces)  # byte-level pieces, merged
    assert [tt.id_to_piece(i) for i in tt.encode("中国")] == ["\\xe4\\xb8", "\\xad\\xe5\\x9b", "\\xbd"]
    assert tt.encode("hello world") == [256 + 3, 256 + 8] and len(tt.encode("中")) == 1
    # a character split over tokens: its start decodes to U+FFFD (what the streamer holds back)
    for tok, ids in [(hf, hf.encode("中")), (tt, tt.encode("中国"))]:
        assert tok.decode(ids[:1]).endswith(FFFD) and tok.decode(tok.encode("😀")[:-1]) == FFFD


# -- special tokens -------------------------------------------------------------------
def test_sentencepiece_adds_bos_unless_told(files, toks):
    tok = toks["sp"]
    plain = tok.encode("Hello")
    assert (tok.bos_token_id, tok.eos_token_id, tok.eos_token_ids, tok.pad_token_id) == (1, 2, [2], None)
    assert tok.encode("Hello", add_special_tokens=True) == [1] + plain
    assert load_tokenizer(files["sp"], add_bos=False).encode("Hello", add_special_tokens=True) == plain
    assert tok.decode([1] + plain + [2], skip_special_tokens=False) == "<s>Hello</s>"
    assert tok.decode([1] + plain + [2]) == "Hello"


def test_sentencepiece_chatglm_specials_and_prefix(files, toks):
    size = toks["sp"].vocab_size
    glm = load_tokenizer(files["sp"], special_tokens=CHATGLM_SPECIALS, prefix_tokens=["[gMASK]", "sop"])
    assert glm.vocab_size == size + len(CHATGLM_SPECIALS)
    gmask, sop, user, assistant = size + 1, size + 3, size + 6, size + 7
    plain = glm.encode("你好")
    assert glm.encode("你好", add_special_tokens=True) == [gmask, sop] + plain
    both = load_tokenizer(files["sp"], special_tokens=CHATGLM_SPECIALS, prefix_tokens=["[gMASK]"], add_bos=True)
    assert both.encode("你好", add_special_tokens=True) == [1, gmask] + plain
    ids = glm.encode("<|user|>\n你好<|assistant|>")
    assert ids[0] == user and ids[-1] == assistant and ids.count(user) == 1
    assert glm.decode(ids, skip_special_tokens=False) == "<|user|>\n你好<|assistant|>"
    assert glm.decode(ids) == "\n你好" and glm.id_to_piece(sop) == "sop"
    control = load_tokenizer(files["sp"], special_tokens=["</s>"])
    assert control.vocab_size == size and control.encode("a</s>")[-1] == 2


def test_json_prefix_follows_the_post_processor(files, tmp_path):
    gpt2 = load_tokenizer(files["hf"])  # ByteLevel post-processor: nothing added
    plain = gpt2.encode("Hello world")
    assert gpt2.encode("Hello world", add_special_tokens=True) == plain and gpt2.bos_token_id is None
    bloom = load_tokenizer(train_byte_level_json(tmp_path / "bloom" / "tokenizer.json", post_processor=None),
                           bos_token_id=1)
    assert bloom.bos_token_id == 1 and bloom.encode("Hello world", add_special_tokens=True) == plain
    assert load_tokenizer(bloom.path, bos_token_id=1, add_bos=True).prefix_ids == [1]
    llama = train_byte_level_json(tmp_path / "llama" / "tokenizer.json", post_processor="template")
    (tmp_path / "llama" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    assert load_tokenizer(llama).encode("Hello world", add_special_tokens=True) == [1] + plain
    assert load_tokenizer(llama, add_bos=False).encode("Hello world", add_special_tokens=True) == plain
    (tmp_path / "llama" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "add_bos_token": False}))
    assert load_tokenizer(llama).prefix_ids == []
    assert load_tokenizer(llama, prefix_tokens=["<|im_start|>"]).prefix_ids == [4]


def test_json_special_ids_and_config_files(files, tmp_path):
    folder = tmp_path / "qwen2"
    path = train_byte_level_json(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": None, "eos_token": {"content": "<|im_end|>", "lstrip": False}}))
    (folder / "special_tokens_map.json").write_text(  # tokenizer_config.json's null bos wins
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 0]}))
    tok = load_tokenizer(folder)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (None, 5, 3)
    assert tok.eos_token_ids == [5, 0]
    assert set(range(6)) <= tok.all_special_ids
    ids = tok.encode("<|im_start|>user\n你好<|im_end|>")
    assert ids[0] == 4 and ids[-1] == 5 and 4 not in tok.encode("im_start user")
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\n你好<|im_end|>"
    assert tok.decode(ids) == "user\n你好"
    assert load_tokenizer(path, eos_token_id=0, pad_token_id=2).eos_token_ids == [0, 5]
    extra = load_tokenizer(path, special_tokens=["<|user|>"])
    assert len(extra.encode("<|user|>")) == 1 and extra.encode("<|user|>")[0] in extra.all_special_ids


def test_tiktoken_qwen_special_tokens(toks):
    tok, n = toks["tiktoken"], 256 + len(MERGED)
    assert tok.vocab_size == n + 3 + 205
    assert (tok.bos_token_id, tok.eos_token_id, tok.eos_token_ids, tok.pad_token_id) == (None, n, [n, n + 2], None)
    assert tok.encode("<|im_start|>hello<|im_end|><|extra_0|><|extra_204|>") == [n + 1, 259, n + 2, n + 3,
                                                                                   n + 207]
    assert tok.encode("hello", add_special_tokens=True) == [259]
    assert tok.decode([n + 1, 259, n]) == "hello"
    assert tok.decode([n + 1, 259, n], skip_special_tokens=False) == "<|im_start|>hello<|endoftext|>"
    assert tok.encode("cafe\u0301") == tok.encode("caf\u00e9")  # NFC first, as Qwen does


def test_tiktoken_prefix_and_extra_specials(files):
    tok = load_tokenizer(files["tiktoken"], prefix_tokens=["<|im_start|>"], special_tokens=["<|user|>"])
    n = 256 + len(MERGED)
    assert tok.encode("hello", add_special_tokens=True) == [n + 1, 259]
    assert tok.encode("<|user|>") == [n + 208] and tok.vocab_size == n + 209


def test_qwen_folder_matches_tiktoken_itself(files, tmp_path):
    """A Qwen v1 folder (qwen.tiktoken beside config.json) is read by the tiktoken tokenizer, and ids
    of chat-formatted text equal tiktoken's own with Qwen's split pattern and specials (<|endoftext|>,
    <|im_start|>, <|im_end|> right after the ranks); decoding with the specials gives the text back."""
    import tiktoken
    folder = tmp_path / "qwen_7b"
    folder.mkdir()
    shutil.copy(files["tiktoken"], folder / "qwen.tiktoken")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen"}))
    tok = load_tokenizer(folder)
    assert type(tok) is TiktokenTokenizer
    lines = (folder / "qwen.tiktoken").read_bytes().splitlines()
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines)}
    n = len(ranks)
    pattern = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
    specials = {"<|endoftext|>": n, "<|im_start|>": n + 1, "<|im_end|>": n + 2}
    ref = tiktoken.Encoding("qwen_reference", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    for text in ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                 "中国的首都是哪个城市？ It's 2024, hello  world 😀<|im_end|>\n<|im_start|>assistant\n",
                 "hello world<|endoftext|>", "a\n\n  b 123"]:
        ids = tok.encode(text)
        assert ids == ref.encode(text, allowed_special="all"), text
        assert tok.decode(ids, skip_special_tokens=False) == text
    chat = tok.encode("<|im_start|>user<|im_end|>")
    assert (chat[0], chat[-1], tok.decode(chat)) == (n + 1, n + 2, "user")
    assert (tok.eos_token_id, tok.eos_token_ids) == (n, [n, n + 2])


# -- errors ---------------------------------------------------------------------------
def test_load_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope" / "tokenizer.json"
    assert str(missing) in raises(ArtifactError, "does not exist", load_tokenizer, missing)
    (tmp_path / "vocab.txt").write_text("a\n")
    raises(ArtifactError, r"vocab.txt.*not a known tokenizer file; allowed: tokenizer.json", load_tokenizer,
           tmp_path / "vocab.txt")
    raises(ArtifactError, r"no tokenizer in folder .*found vocab.txt\); allowed: tokenizer.json .*\*.tiktoken.*"
                          r"\*.model", load_tokenizer, tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    raises(ArtifactError, "configuration file, not a tokenizer", load_tokenizer, tmp_path / "tokenizer_config.json")
    (tmp_path / "a.tiktoken").write_text(""), (tmp_path / "b.tiktoken").write_text("")
    raises(ArtifactError, r"several \*.tiktoken files \(a.tiktoken, b.tiktoken\)", load_tokenizer, tmp_path)


def test_damaged_files(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0"}')
    raises(ArtifactError, "cannot read .*tokenizer.json.* as a tokenizers file", load_tokenizer,
           tmp_path / "tokenizer.json")
    (tmp_path / "bad.model").write_bytes(b"not a model")
    raises(ArtifactError, "cannot read sentencepiece model .*bad.model", load_tokenizer, tmp_path / "bad.model")
    bad = tmp_path / "bad.tiktoken"
    for content, pattern in [("aGVsbG8= 0\nnot base64! 1\n", r"bad.tiktoken' line 2: expected '<base64 token> <rank>'"),
                             ("YQ== 0\nYg== 2\n", r"ranks must be 0..1; 1 is missing"),
                             ("YQ== 0\nYg== 0\n", r"line 2: rank 0 or its token is negative or repeated"),
                             ("YQ== 0\n", "lacks 255 of the 256 single-byte tokens")]:
        bad.write_text(content)
        raises(ArtifactError, pattern, load_tokenizer, bad)
    path = train_byte_level_json(tmp_path / "cfg" / "tokenizer.json")
    (tmp_path / "cfg" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eot|>"}))
    raises(ArtifactError, r"eos_token '<\|eot\|>' of .*tokenizer_config.json' is not a token", load_tokenizer, path)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_ids_and_overrides(files, toks, kind):
    tok, size = toks[kind], toks[kind].vocab_size
    assert files[kind] in raises(ValidationError, rf"token id {size} is outside the vocabulary \[0, {size}\)",
                                 tok.decode, [5, size])
    raises(ValidationError, "token id -1", tok.decode, np.array([-1]))
    raises(ValidationError, "ids: expected integer token ids, got 'a'", tok.decode, [1, "a"])
    raises(ValidationError, "text: expected a str, got bytes", tok.encode, b"bytes")
    raises(ConfigError, rf"pad_token_id: {size} is outside the vocabulary", load_tokenizer, files[kind],
           pad_token_id=size)
    raises(ConfigError, "bos_token_id: expected an integer token id, got '1'", load_tokenizer, files[kind],
           bos_token_id="1")
    raises(ConfigError, r"prefix_tokens: '\[gMASK\]' is not a token of the vocabulary", load_tokenizer,
           files[kind], prefix_tokens=["[gMASK]"])
    raises(ConfigError, "special_tokens: expected a list of token strings", load_tokenizer, files[kind],
           special_tokens="<|user|>")


def test_add_bos_without_a_bos_is_refused(files):
    raises(ConfigError, "add_bos: .*qwen.tiktoken' has no BOS token", load_tokenizer, files["tiktoken"], add_bos=True)


# -- streaming ------------------------------------------------------------------------
class Recorder(list):
    """A TextStreamer file that keeps every write."""
    write = list.append

    def flush(self):
        pass


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_streamed_text_equals_full_decode(toks, kind, text):
    tok = toks[kind]
    ids = tok.encode(text)
    # the text really has tokens that decode to a broken character on their own
    assert any(FFFD in tok.decode([i]) for i in ids)
    decoder = RowDetokenizer(tok)
    chunks = [decoder.push([token]) for token in ids] + [decoder.flush()]
    assert "".join(chunks) == tok.decode(ids) == text
    assert not any(FFFD in chunk for chunk in chunks)

    out = Recorder()
    streamer = TextStreamer(tok, file=out)
    for token in ids:
        streamer.put([token])
    streamer.end()
    assert out[-1] == "\n" and "".join(out[:-1]) == text and not any(FFFD in chunk for chunk in out)


@pytest.mark.parametrize("kind", KINDS)
def test_continuation_after_a_prompt_equals_full_decode(toks, kind):
    """The streamer's prompt context may start inside a character: the text after each
    complete prompt is still exactly what the full decode adds."""
    tok = toks[kind]
    ids = tok.encode(QUESTION + " 😀🚀 ok")
    full = tok.decode(ids)
    splits = [k for k in range(1, len(ids)) if not tok.decode(ids[:k]).endswith(FFFD)]
    assert len(splits) >= 3
    for k in splits:
        assert continuation_text(tok, ids[:k], ids[k:]) == full[len(tok.decode(ids[:k])):]
