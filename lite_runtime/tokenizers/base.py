"""The tokenizer interface every implementation offers, and the checks they share.

Implementations load their files, then call ``_init_specials`` with the ids their files
name; they provide ``_encode_text`` (no special ids added), ``_decode_ids`` (special ids
present are rendered as their text), ``_piece`` and ``_token_to_id``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from lite_runtime.contract.errors import ConfigError, ValidationError

TokenIds = Union[Sequence[int], np.ndarray]


@dataclass(frozen=True)
class TokenizerOptions:
    """What a tokenizer is told beyond its files (load_tokenizer's keywords, an export's tokenizer_options): ids
    that override the files' BOS, EOS and PAD; BOS forced on or off in ``encode(..., add_special_tokens=True)``;
    the token strings of the prompt's prefix; strings that must encode as single ids."""
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    add_bos: Optional[bool] = None
    prefix_tokens: Optional[Sequence[str]] = None
    special_tokens: Optional[Sequence[str]] = None


class Tokenizer(abc.ABC):
    """Text to ids and ids to text.

    ``encode(text, add_special_tokens=True)`` prepends the family's prefix: by default the
    BOS id when the tokenizer has one and its files say to add it; ``add_bos`` overrides
    that, and ``prefix_tokens`` (token strings, e.g. ``["[gMASK]", "sop"]``) replace the
    default prefix (BOS then comes first only with ``add_bos=True``). No EOS is appended.
    """

    kind = "tokenizer"
    # Whether `encode` itself turns the special tokens written in a text into their ids (tokenizers'
    # added tokens) rather than reading them as text.
    matches_special_tokens = False

    def __init__(self, path: str) -> None:
        self.path = str(path)
        self._vocab_size = 0
        self._bos: Optional[int] = None
        self._eos: Optional[int] = None
        self._eos_ids: Tuple[int, ...] = ()
        self._pad: Optional[int] = None
        self._special_ids: FrozenSet[int] = frozenset()
        self._prefix: List[int] = []

    # -- what implementations provide -------------------------------------------------
    @abc.abstractmethod
    def _encode_text(self, text: str) -> List[int]:
        """Ids of ``text`` with nothing added."""

    @abc.abstractmethod
    def _decode_ids(self, ids: List[int]) -> str:
        """Text of checked ids; special ids among them appear as their token text."""

    @abc.abstractmethod
    def _piece(self, token_id: int) -> str:
        """The vocabulary entry of a checked id."""

    @abc.abstractmethod
    def _token_to_id(self, token: str) -> Optional[int]:
        """Id of a token string of the vocabulary (specials included), else None."""

    # -- set-up shared by implementations ---------------------------------------------
    def _init_specials(
        self,
        *,
        found: Dict[str, Optional[int]],
        options: "TokenizerOptions",
        extra_eos: Iterable[int] = (),
        special_ids: Iterable[int] = (),
        files_prefix: Sequence[int] = (),
        files_add_bos: Optional[bool] = None,
    ) -> None:
        """``found``: bos/eos/pad_token_id named by the files; ``options``: the caller's (its ids override them).
        ``files_prefix``: ids the files put before a text; ``files_add_bos``: an explicit
        yes/no of the files about BOS (tokenizer_config.json's ``add_bos_token``)."""
        names = ("bos_token_id", "eos_token_id", "pad_token_id")
        chosen = {}
        for name in names:
            override = getattr(options, name)
            chosen[name] = found.get(name) if override is None else self._checked_override(name, override)
        self._bos, self._eos, self._pad = (chosen[name] for name in names)
        eos_ids = [self._eos] + [int(i) for i in extra_eos]
        self._eos_ids = tuple(dict.fromkeys(i for i in eos_ids if i is not None))
        named = {i for i in (self._bos, self._pad) if i is not None}
        self._special_ids = frozenset(set(int(i) for i in special_ids) | named | set(self._eos_ids))
        self._prefix = self._build_prefix(list(files_prefix), files_add_bos, options.add_bos, options.prefix_tokens)

    def _checked_override(self, name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ConfigError(f"{name}: expected an integer token id, got {value!r}")
        if not 0 <= value < self._vocab_size:
            raise ConfigError(
                f"{name}: {value} is outside the vocabulary [0, {self._vocab_size}) of {self.path!r}"
            )
        return int(value)

    def _build_prefix(self, files_prefix: List[int], files_add_bos: Optional[bool],
                      add_bos: Optional[bool], prefix_tokens: Optional[Sequence[str]]) -> List[int]:
        if add_bos is not None and not isinstance(add_bos, bool):
            raise ConfigError(f"add_bos: expected True, False or None, got {add_bos!r}")
        files_bos = bool(files_prefix) and self._bos is not None and files_prefix[0] == self._bos
        rest = files_prefix[1:] if files_bos else files_prefix
        default_bos = files_bos if files_add_bos is None else files_add_bos
        if prefix_tokens is not None:
            rest, default_bos = self._resolve_tokens("prefix_tokens", prefix_tokens), False
        want_bos = default_bos if add_bos is None else add_bos
        if want_bos and self._bos is None:
            if add_bos:
                raise ConfigError(f"add_bos: {self.path!r} has no BOS token; give bos_token_id as well")
            want_bos = False
        return ([self._bos] if want_bos else []) + rest

    def _resolve_tokens(self, name: str, tokens: Sequence[str]) -> List[int]:
        if isinstance(tokens, str) or not isinstance(tokens, (list, tuple)):
            raise ConfigError(f"{name}: expected a list of token strings, got {tokens!r}")
        ids = []
        for token in tokens:
            token_id = self._token_to_id(token) if isinstance(token, str) and token else None
            if token_id is None:
                raise ConfigError(f"{name}: {token!r} is not a token of the vocabulary of {self.path!r}")
            ids.append(token_id)
        return ids

    # -- the interface ----------------------------------------------------------------
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
    def eos_token_ids(self) -> List[int]:
        """Every id that ends generation, ``eos_token_id`` first."""
        return list(self._eos_ids)

    @property
    def pad_token_id(self) -> Optional[int]:
        return self._pad

    @property
    def all_special_ids(self) -> FrozenSet[int]:
        """Ids that ``decode(skip_special_tokens=True)`` drops."""
        return self._special_ids

    @property
    def prefix_ids(self) -> List[int]:
        """What ``encode(..., add_special_tokens=True)`` puts before the text."""
        return list(self._prefix)

    @property
    def suffix_ids(self) -> List[int]:
        """What ``encode(..., add_special_tokens=True)`` puts after the text (ChatGLM-6B: ``[gMASK] <sop>``)."""
        return []

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        if not isinstance(text, str):
            raise ValidationError(f"text: expected a str, got {type(text).__name__}")
        ids = self._encode_text(text)
        return self._prefix + ids if add_special_tokens else ids

    def decode(self, ids: TokenIds, skip_special_tokens: bool = True) -> str:
        ids = self._checked_ids(ids)
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        return self._decode_ids(ids)

    def batch_decode(self, rows: Iterable[TokenIds], skip_special_tokens: bool = True) -> List[str]:
        return [self.decode(row, skip_special_tokens) for row in rows]

    def id_to_piece(self, token_id: int) -> str:
        return self._piece(self._checked_ids([token_id])[0])

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
                f"ids: token id {bad} is outside the vocabulary [0, {self._vocab_size}) of {self.path!r}"
            )
        return ids

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.path!r}, vocab_size={self._vocab_size}, bos={self._bos}, "
            f"eos={list(self._eos_ids)}, pad={self._pad}, prefix={self._prefix})"
        )


def checked_special_tokens(tokens: Optional[Sequence[str]]) -> List[str]:
    """``special_tokens`` as a list of distinct non-empty strings."""
    if tokens is None:
        return []
    if isinstance(tokens, str) or not isinstance(tokens, (list, tuple)):
        raise ConfigError(f"special_tokens: expected a list of token strings, got {tokens!r}")
    for token in tokens:
        if not isinstance(token, str) or not token:
            raise ConfigError(f"special_tokens: expected non-empty strings, got {token!r}")
    return list(dict.fromkeys(tokens))
