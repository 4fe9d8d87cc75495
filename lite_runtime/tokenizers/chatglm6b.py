"""ChatGLM-6B's (GLM v1) ``ice_text.model``: sentencepiece behind whitespace markers and an id offset.

As the ChatGLMTokenizer of MindFormers (``glm_6b``) and of THUDM's chatglm-6b behave:

- before sentencepiece sees a text, "\\n" becomes ``<n>``, "\\t" ``<|tab|>`` and a run of 2 to 80
  spaces ``<|blank_N|>`` (a longer run: as many ``<|blank_80|>`` as fit, then the rest); these are
  pieces of the model, and decoding turns them back into whitespace. Sentencepiece puts its "▁"
  dummy prefix before every text, as upstream's default does;
- model ids are sentencepiece ids plus ``num_image_tokens``: 0 for the released checkpoints
  (130528 embedding rows; MindFormers' default, and chatglm-6b's tokenizer_config.json since
  April 2023), 20000 for the first release (150528 rows, icetk's image ids first). It is taken
  from the ``tokenizer_config.json`` beside the model (0 when the file or its key is missing);
  ids below it (``<image_N>``) decode to nothing;
- GLM's special tokens are pieces of the model, after its 130000 text pieces: ``[MASK]``
  ``[gMASK]`` ``[sMASK]`` ``<unused_0>`` ``<sop>`` ``<eop>`` ``<ENC>`` ``<dBLOCK>`` (130000-130007),
  then ``<|tab|>``, ``<|blank_2|>`` ... ``<|blank_80|>`` and the 256 byte pieces: 130344 pieces.
  The specials encode as single ids wherever they appear in a text;
- ``encode(text, add_special_tokens=True)`` appends ``[gMASK] <sop>``: ChatGLM-6B's prompt ends
  with them and the answer follows ``<sop>``. EOS is ``<eop>``, pad ``<pad>``; ``<sop>`` is the
  BOS, prepended only with ``add_bos=True``.

Decoding maps each marker piece to its whitespace (upstream replaces the strings ``<n>`` ...
in the decoded text), so a run of tokens decodes to the same text whole or streamed a token at
a time; the two differ only for a marker spelt by several ordinary pieces, which encoding never
produces. Text round-trips when the model's normaliser keeps it.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Optional

from lite_runtime.contract.errors import ArtifactError, ConfigError
from lite_runtime.tokenizers.base import TokenizerOptions, checked_special_tokens
from lite_runtime.tokenizers.hf_json import read_json
from lite_runtime.tokenizers.sentencepiece_model import SentencePieceTokenizer

VOCAB_FILE = "ice_text.model"
GLM_SPECIALS = ("[MASK]", "[gMASK]", "[sMASK]", "<unused_0>", "<sop>", "<eop>", "<ENC>", "<dBLOCK>")
GMASK, SOP, EOP, PAD = "[gMASK]", "<sop>", "<eop>", "<pad>"
NEWLINE, TAB = "<n>", "<|tab|>"
MAX_BLANK = 80
_SPACES = re.compile(" {2,}")


def blank_token(n: int) -> str:
    return f"<|blank_{n}|>"


def _blanks(match: re.Match) -> str:
    full, rest = divmod(len(match.group()), MAX_BLANK)
    return blank_token(MAX_BLANK) * full + (blank_token(rest) if rest > 1 else " " * rest)


def glm_text(text: str) -> str:
    """What sentencepiece encodes for ``text``: newlines, tabs and runs of spaces as marker pieces."""
    return _SPACES.sub(_blanks, text.replace("\n", NEWLINE).replace("\t", TAB))


def num_image_tokens_beside(model_path: str) -> int:
    """``num_image_tokens`` of the tokenizer_config.json in the model's folder, else 0."""
    config = os.path.join(os.path.dirname(os.path.abspath(model_path)), "tokenizer_config.json")
    if not os.path.isfile(config):
        return 0
    value = read_json(config).get("num_image_tokens", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArtifactError(
            f"tokenizer: {config!r}: num_image_tokens must be a non-negative integer, got {value!r}")
    return value


class _GLMProcessor:
    """The model's SentencePieceProcessor seen through the id offset and the whitespace markers."""

    def __init__(self, processor, offset: int) -> None:
        self._processor = processor
        self._offset = offset
        markers = {NEWLINE: "\n", TAB: "\t", **{blank_token(n): " " * n for n in range(2, MAX_BLANK + 1)}}
        self._markers: Dict[int, str] = {}
        for piece, text in markers.items():
            piece_id = processor.piece_to_id(piece)
            if processor.id_to_piece(piece_id) == piece:
                self._markers[piece_id] = text

    def get_piece_size(self) -> int:
        return self._offset + self._processor.get_piece_size()

    def id_to_piece(self, token_id: int) -> str:
        if token_id < self._offset:
            return f"<image_{token_id}>"
        return self._processor.id_to_piece(token_id - self._offset)

    def piece_to_id(self, piece: str) -> int:
        return self._processor.piece_to_id(piece) + self._offset

    def encode(self, text: str, out_type=int) -> List[int]:
        return [i + self._offset for i in self._processor.encode(glm_text(text), out_type=int)]

    def decode(self, ids: List[int]) -> str:
        parts: List[str] = []
        run: List[int] = []
        marker = None
        for token in (i - self._offset for i in ids if i >= self._offset):
            if token in self._markers:
                parts += [self._run_text(marker, run), self._markers[token]]
                run, marker = [], token
            else:
                run.append(token)
        parts.append(self._run_text(marker, run))
        return "".join(parts)

    def _run_text(self, marker: Optional[int], run: List[int]) -> str:
        if not run or marker is None:
            return self._processor.decode(run)
        # Decoded alone the run would lose the space of a leading "▁"; after the marker it keeps it.
        return self._processor.decode([marker] + run)[len(self._processor.id_to_piece(marker)):]


class ChatGLM6BTokenizer(SentencePieceTokenizer):
    kind = "chatglm-6b"

    def __init__(self, model_path: str, options: TokenizerOptions = TokenizerOptions(), *,
                 num_image_tokens: Optional[int] = None) -> None:
        super().__init__(model_path)   # loads the model; what it set up for a plain model is redone below
        if num_image_tokens is None:
            offset = num_image_tokens_beside(self.path)
        elif isinstance(num_image_tokens, bool) or not isinstance(num_image_tokens, int) or num_image_tokens < 0:
            raise ConfigError(f"num_image_tokens: expected a non-negative integer, got {num_image_tokens!r}")
        else:
            offset = num_image_tokens
        self.num_image_tokens = offset
        # The plain set-up's special ids are the model's control pieces (and its bos/eos/pad, control too).
        control = {i + offset for i in self._special_ids}
        # The base class encodes and decodes the text between special tokens with self._sp.
        self._sp = _GLMProcessor(self._sp, offset)
        self._sp_size = self._sp.get_piece_size()

        self._added = {}
        self._extra_pieces = {}
        for token in GLM_SPECIALS:
            token_id = self._token_to_id(token)
            if token_id is not None:
                self._added[token] = token_id
        missing = [t for t in (GMASK, SOP, EOP) if t not in self._added]
        if missing:
            raise ArtifactError(
                f"tokenizer: {self.path!r} has no {', '.join(missing)} piece: not a ChatGLM-6B {VOCAB_FILE} "
                "(icetk's older model without the special pieces is not supported)"
            )
        for token in checked_special_tokens(options.special_tokens):
            if token not in self._added:
                token_id = self._token_to_id(token)
                if token_id is None:
                    token_id = self._sp_size + len(self._extra_pieces)
                    self._extra_pieces[token_id] = token
                self._added[token] = token_id
        self._vocab_size = self._sp_size + len(self._extra_pieces)
        self._split = re.compile("|".join(re.escape(t) for t in sorted(self._added, key=len, reverse=True)))

        pad = self._token_to_id(PAD)
        if pad is None and self._pad is not None:
            pad = self._pad + offset
        self._init_specials(
            found={"bos_token_id": self._added[SOP], "eos_token_id": self._added[EOP], "pad_token_id": pad},
            options=options,
            special_ids=control | set(self._added.values()),
        )
        self._suffix = [self._added[GMASK], self._added[SOP]]

    @property
    def suffix_ids(self) -> List[int]:
        """What ``encode(..., add_special_tokens=True)`` puts after the text: ``[gMASK] <sop>``."""
        return list(self._suffix)

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        ids = super().encode(text, add_special_tokens)
        return ids + self._suffix if add_special_tokens else ids
