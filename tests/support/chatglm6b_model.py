"""ChatGLM-6B's ice_text.model layout on a sentencepiece model trained here (no downloads): the trained
model, the released id layout around it, and upstream's encode and decode of text (its markers for
newlines, tabs and runs of blanks). Shared by the tokenizer tests and the GLM export tests."""
from __future__ import annotations

import io

SPECIALS = ["[MASK]", "[gMASK]", "[sMASK]", "<unused_0>", "<sop>", "<eop>", "<ENC>", "<dBLOCK>"]
WHITESPACE = ["<|tab|>"] + [f"<|blank_{n}|>" for n in range(2, 81)]
TEXT_PIECES = 130000
CODE = "def add(a, b):\n\treturn a + b\n\n\nif x:\n    print(add(1,  2))   # three\n"
CORPUS = ["中国的首都是北京。北京是一个美丽的城市，上海是中国最大的城市之一。",
          "问：你好\n答：你好！我是人工智能助手，很高兴见到你。",
          "The quick brown fox jumps over the lazy dog. Hello world, this is a small test.",
          CODE, "for i in range(10):\n        total += i\n\treturn total"]


def upstream_input(text: str) -> str:
    """What upstream gives sentencepiece: "\\n" -> <n>, "\\t" -> <|tab|>, then runs of 80 down to 2 spaces."""
    text = text.replace("\n", "<n>").replace("\t", "<|tab|>")
    for n in range(80, 1, -1):
        text = text.replace(" " * n, f"<|blank_{n}|>")
    return text


def upstream_ids(sp, text: str, offset: int = 0):
    return [i + offset for i in sp.encode(upstream_input(text))]


def upstream_text(sp, ids, offset: int = 0) -> str:
    """Upstream's decode: sentencepiece's text of the ids past the offset, markers replaced."""
    text = sp.decode([i - offset for i in ids if i >= offset])
    text = text.replace("<n>", "\n").replace("<|tab|>", "\t")
    for n in range(2, 81):
        text = text.replace(f"<|blank_{n}|>", " " * n)
    return text


def trained_model() -> bytes:
    import sentencepiece as spm
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter([upstream_input(t) for t in CORPUS] * 20),
                                   model_writer=buf, model_type="unigram", vocab_size=150, hard_vocab_limit=False,
                                   character_coverage=0.98, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, user_defined_symbols=["<n>"],
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=3, minloglevel=2)
    return buf.getvalue()


def with_glm_layout(model: bytes) -> bytes:
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto.FromString(model)
    kind = pb.ModelProto.SentencePiece
    for k in range(len(proto.pieces), TEXT_PIECES):
        proto.pieces.add(piece=f"<filler_{k}>", score=0.0, type=kind.UNUSED)
    for piece in SPECIALS:
        proto.pieces.add(piece=piece, score=0.0, type=kind.CONTROL)
    for piece in WHITESPACE:
        proto.pieces.add(piece=piece, score=0.0, type=kind.USER_DEFINED)
    for byte in range(256):
        proto.pieces.add(piece=f"<0x{byte:02X}>", score=0.0, type=kind.BYTE)
    proto.trainer_spec.byte_fallback = True
    return proto.SerializeToString()
