"""Tokenizer files built here (no downloads), shared by the tokenizer and server tests: a Llama-style
sentencepiece model and a byte-level BPE tokenizer.json trained on a small corpus, a .tiktoken file from
a rank table, and the texts they are checked on."""
from __future__ import annotations

import base64
import os

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world, this is a small test of the tokenizer.",
          "你好，世界！今天天气很好。", "中国的首都是北京。", "机器学习和深度学习", "emoji 😀 rocket 🚀 ok"]
QUESTION = "中国的首都是哪个城市？"
TEXTS = ["Hello world", QUESTION, "emoji 😀🚀 ok", "猫 犬 and 😀 mixed 中文", "a  b\n\nc", ""]
STREAM_TEXTS = [QUESTION + " 😀🚀", "猫😀犬🚀 ok 中国", "🚀🚀 城市？"]
HF_SPECIALS = ["<|endoftext|>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]


def train_sentencepiece(folder) -> str:
    """A Llama-style sentencepiece BPE (unk 0, bos 1, eos 2, byte fallback) with Llama's
    identity normalisation and kept whitespace, so that full-width punctuation and runs
    of spaces round-trip."""
    import sentencepiece as spm
    text, prefix = os.path.join(str(folder), "corpus.txt"), os.path.join(str(folder), "tokenizer")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(CORPUS * 20))
    spm.SentencePieceTrainer.train(input=text, model_prefix=prefix, vocab_size=400, model_type="bpe",
                                   byte_fallback=True, character_coverage=0.98, unk_id=0, bos_id=1, eos_id=2,
                                   pad_id=-1, normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   minloglevel=2)
    return prefix + ".model"


def train_byte_level_json(path, post_processor="byte_level") -> str:
    """A GPT-2-style byte-level BPE tokenizer.json; `post_processor`: byte_level (GPT-2),
    None (Bloom) or template (Llama: "<s> $A")."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, processors, trainers
    tk = HFTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=HF_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(CORPUS * 20, trainer)
    tk.post_processor = {"byte_level": processors.ByteLevel(trim_offsets=False), None: None,
                         "template": processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
                         }[post_processor]
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    tk.save(str(path))
    return str(path)


# The rank table of the .tiktoken file: all single bytes, then merges (each token's
# left-to-right prefixes come first, so BPE can build it). Some cross characters:
# b"\xad\xe5\x9b" is the end of 中 and the start of 国 and outranks 中 itself, so "中国"
# is [e4 b8][ad e5 9b][bd] while "中" alone is one token.
MERGED = [b"he", b"hel", b"hell", b"hello", b" w", b" wo", b" wor", b" worl", b" world",
          "中".encode()[:2], b"\xad\xe5", b"\xad\xe5\x9b", "中".encode(), "国".encode()[1:],
          "城".encode()[:2], " 😀".encode()[:3]]


def write_tiktoken(path) -> str:
    ranks = [bytes([b]) for b in range(256)] + MERGED
    with open(str(path), "w") as f:
        f.writelines(f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in enumerate(ranks))
    return str(path)
