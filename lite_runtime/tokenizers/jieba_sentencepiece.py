"""PanguAlpha's ``vocab.model``: jieba word segmentation in front of sentencepiece.

As MindFormers' PanguAlphaTokenizer does: the text is cut into words by ``jieba.cut``
(accurate mode, HMM on), spaces and newlines inside each word become U+2582 / U+2583,
the words are joined with spaces and sentencepiece encodes the result. Decoding is
sentencepiece's, then every space is removed (they only separated words) and U+2582 /
U+2583 become spaces and newlines again. As no space survives, the text of a run of
tokens is the concatenation of its tokens' texts, so incremental (streamed) decoding
gives the full decode's text.

Special tokens, upstream's names looked up in the model: ``<eot>`` ends a text and is the
EOS (sentencepiece's own EOS when the model has no ``<eot>``); ``<eod>`` and ``<pad>`` are
special too. ``<s>`` is the BOS, but as upstream nothing is prepended unless ``add_bos=True``.

Text round-trips exactly when its only whitespace is spaces and newlines and the model's
normaliser keeps it (MindFormers' examples show the released vocab.model turning "：" into ":").
"""

from __future__ import annotations

import logging
import warnings
from typing import List

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.tokenizers.base import TokenizerOptions
from lite_runtime.tokenizers.sentencepiece_model import SentencePieceTokenizer

VOCAB_FILE = "vocab.model"
EOT, EOD, PAD = "<eot>", "<eod>", "<pad>"
_TO_MARKS = str.maketrans(" \n", "\u2582\u2583")
_FROM_MARKS = str.maketrans("\u2582\u2583", " \n")


def jieba_cut():
    """``jieba.cut`` with its dictionary loaded, and without jieba's messages on stderr."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # older jieba/setuptools pairs warn about pkg_resources
            import jieba
    except ImportError as exc:
        raise UnsupportedError(
            f"tokenizer: a {VOCAB_FILE} (PanguAlpha) needs the jieba package: pip install jieba"
        ) from exc
    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return jieba.cut


class _JiebaProcessor:
    """A SentencePieceProcessor whose encode/decode are PanguAlpha's; the rest is the processor's."""

    def __init__(self, processor, cut) -> None:
        self._processor = processor
        self._cut = cut

    def __getattr__(self, name):
        if name == "_processor":   # not set yet: copy and pickle build objects without __init__
            raise AttributeError(name)
        return getattr(self._processor, name)

    def encode(self, text: str, out_type=int):
        words = (word.translate(_TO_MARKS) for word in self._cut(text, cut_all=False))
        return self._processor.encode(" ".join(words), out_type=out_type)

    def decode(self, ids: List[int]) -> str:
        return self._processor.decode(ids).replace(" ", "").translate(_FROM_MARKS)


class JiebaSentencePieceTokenizer(SentencePieceTokenizer):
    kind = "jieba+sentencepiece"

    def __init__(self, model_path: str, options: TokenizerOptions = TokenizerOptions()) -> None:
        super().__init__(model_path, options)
        # The base class encodes and decodes the text between special tokens with self._sp.
        self._sp = _JiebaProcessor(self._sp, jieba_cut())
        # It set up the specials of a plain model (self._bos/_eos/_pad are the model's own ids
        # unless overridden); PanguAlpha's are named pieces, and it adds no BOS by default.
        eot, eod, pad = (self._token_to_id(t) for t in (EOT, EOD, PAD))
        self._init_specials(
            found={"bos_token_id": self._bos,
                   "eos_token_id": self._eos if eot is None else eot,
                   "pad_token_id": self._pad if pad is None else pad},
            options=options,
            special_ids=self._special_ids | {i for i in (eot, eod, pad) if i is not None},
        )
