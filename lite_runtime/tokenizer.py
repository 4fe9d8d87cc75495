"""Llama-style tokenizer over a sentencepiece ``tokenizer.model``.

Only sentencepiece models are read; a ``tokenizer.json`` (Hugging Face tokenizers) is
refused with an ArtifactError naming the file rather than half-supported.
"""

from __future__ import annotations

import os
from typing import FrozenSet, Iterable, List, Optional, Sequence, Union

import numpy as np

from lite_runtime.contract.errors import ArtifactError, ConfigError, ValidationError

TOKENIZER_FILE = "tokenizer.model"

TokenIds = Union[Sequence[int], np.ndarray]


class Tokenizer:
    """Encodes text to ids and decodes ids to text with a sentencepiece model.

    ``bos_token_id``/``eos_token_id``/``pad_token_id`` default to the model's own ids;
    pass an override when the model lacks one (Llama models usually have no pad id, in
    which case ``pad_token_id`` is None) or when the export's manifest says otherwise.
    """

    def __init__(
        self,
        model_path: str,
        *,
        bos_token_id: Optional[int] = None,
        eos_token_id: Optional[int] = None,
        pad_token_id: Optional[int] = None,
    ) -> None:
        import sentencepiece

        self.model_path = str(model_path)
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.Load(self.model_path)
        except (OSError, RuntimeError) as exc:
            raise ArtifactError(
                f"tokenizer: cannot read sentencepiece model {self.model_path!r}: {exc}"
            ) from exc
        self._sp = processor
        self._vocab_size = processor.get_piece_size()
        self._bos = self._special("bos_token_id", bos_token_id, processor.bos_id())
        self._eos = self._special("eos_token_id", eos_token_id, processor.eos_id())
        self._pad = self._special("pad_token_id", pad_token_id, processor.pad_id())
        control = {i for i in range(self._vocab_size) if processor.is_control(i)}
        named = {i for i in (self._bos, self._eos, self._pad) if i is not None}
        self._special_ids: FrozenSet[int] = frozenset(control | named)

    def _special(self, name: str, override: Optional[int], from_model: int) -> Optional[int]:
        if override is None:
            return from_model if from_model >= 0 else None
        if isinstance(override, bool) or not isinstance(override, (int, np.integer)):
            raise ConfigError(f"{name}: expected an integer token id, got {override!r}")
        if not 0 <= override < self._vocab_size:
            raise ConfigError(
                f"{name}: {override} is outside the vocabulary [0, {self._vocab_size}) of "
                f"{self.model_path!r}"
            )
        return int(override)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._bos

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._eos

    @property
    def pad_token_id(self) -> Optional[int]:
        return self._pad

    @property
    def all_special_ids(self) -> FrozenSet[int]:
        """Ids that ``decode(skip_special_tokens=True)`` drops: bos, eos, pad and every
        id the model marks as a control symbol."""
        return self._special_ids

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        """Ids of ``text``; with ``add_special_tokens`` the BOS id is prepended (Llama
        convention: no EOS is appended)."""
        if not isinstance(text, str):
            raise ValidationError(f"text: expected a str, got {type(text).__name__}")
        ids = self._sp.encode(text, out_type=int)
        if add_special_tokens and self._bos is not None:
            ids.insert(0, self._bos)
        return ids

    def decode(self, ids: TokenIds, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. With ``skip_special_tokens`` the ids in ``all_special_ids``
        are dropped; otherwise control tokens appear as their piece text (``<s>``)."""
        ids = self._checked_ids(ids)
        if skip_special_tokens:
            return self._sp.decode([i for i in ids if i not in self._special_ids])
        parts: List[str] = []
        start = 0
        for position, token in enumerate(ids):
            if token in self._special_ids:
                parts.append(self._sp.decode(ids[start:position]))
                parts.append(self._sp.id_to_piece(token))
                start = position + 1
        parts.append(self._sp.decode(ids[start:]))
        return "".join(parts)

    def batch_decode(self, rows: Iterable[TokenIds], skip_special_tokens: bool = True) -> List[str]:
        return [self.decode(row, skip_special_tokens) for row in rows]

    def id_to_piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(self._checked_ids([token_id])[0])

    def _checked_ids(self, ids: TokenIds) -> List[int]:
        if isinstance(ids, np.ndarray):
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                raise ValidationError(
                    f"ids: expected a 1-D integer array, got {ids.dtype} of shape {ids.shape}"
                )
            ids = ids.tolist()
        else:
            ids = list(ids)
            for token in ids:
                if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
                    raise ValidationError(f"ids: expected integer token ids, got {token!r}")
            ids = [int(token) for token in ids]
        if ids and (min(ids) < 0 or max(ids) >= self._vocab_size):
            bad = next(i for i in ids if not 0 <= i < self._vocab_size)
            raise ValidationError(
                f"ids: token id {bad} is outside the vocabulary [0, {self._vocab_size})"
            )
        return ids

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self.model_path!r}, vocab_size={self._vocab_size}, "
            f"bos={self._bos}, eos={self._eos}, pad={self._pad})"
        )


def load_tokenizer(
    path: str,
    *,
    bos_token_id: Optional[int] = None,
    eos_token_id: Optional[int] = None,
    pad_token_id: Optional[int] = None,
) -> Tokenizer:
    """A Tokenizer from a ``tokenizer.model`` file or a folder (e.g. an export) holding one."""
    path = os.fspath(path)
    if os.path.isdir(path):
        model = os.path.join(path, TOKENIZER_FILE)
        if not os.path.isfile(model):
            found = sorted(n for n in os.listdir(path) if n.startswith("tokenizer"))
            raise ArtifactError(
                f"tokenizer: no {TOKENIZER_FILE} in folder {path!r}"
                + (f" (found {', '.join(found)}; only sentencepiece .model files are supported)"
                   if found else "")
            )
        path = model
    elif not os.path.exists(path):
        raise ArtifactError(f"tokenizer: file {path!r} does not exist")
    if not path.endswith(".model"):
        raise ArtifactError(
            f"tokenizer: {path!r} is not a sentencepiece model; only .model files "
            f"(Llama-style {TOKENIZER_FILE}) are supported"
        )
    if not os.access(path, os.R_OK):
        raise ArtifactError(f"tokenizer: file {path!r} is not readable")
    return Tokenizer(
        path, bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id
    )
