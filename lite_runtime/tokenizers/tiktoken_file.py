"""A ``*.tiktoken`` BPE file (Qwen v1's ``qwen.tiktoken``) through ``tiktoken``.

The file has one ``<base64 of the token's bytes> <rank>`` per line; a token's id is its
rank. The pattern string and the special tokens are Qwen's: ``<|endoftext|>``,
``<|im_start|>``, ``<|im_end|>``, then ``<|extra_0|>`` ... ``<|extra_204|>``, numbered
in that order right after the last rank (151643... for the real file); ``special_tokens``
not among them get ids after those. Like Qwen, text is NFC-normalised before encoding,
special-token strings in it encode as their ids, and there is no BOS: ``eos_token_id``
is ``<|endoftext|>`` and ``eos_token_ids`` adds ``<|im_end|>``.
"""

from __future__ import annotations

import base64
import binascii
import unicodedata
from typing import Dict, List, Optional

from lite_runtime.contract.errors import ArtifactError
from lite_runtime.tokenizers.base import Tokenizer, TokenizerOptions, checked_special_tokens

QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
QWEN_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END) + tuple(f"<|extra_{i}|>" for i in range(205))


def read_ranks(path: str) -> Dict[bytes, int]:
    """The mergeable ranks of a ``.tiktoken`` file, checked line by line."""
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ArtifactError(f"tokenizer: cannot read {path!r}: {exc}") from exc
    ranks: Dict[bytes, int] = {}
    seen = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError("expected '<base64 token> <rank>'")
            token, rank = base64.b64decode(fields[0], validate=True), int(fields[1])
            if rank < 0 or rank in seen or token in ranks:
                raise ValueError(f"rank {rank} or its token is negative or repeated")
        except (ValueError, binascii.Error) as exc:
            raise ArtifactError(f"tokenizer: {path!r} line {number}: {exc}") from exc
        ranks[token] = rank
        seen.add(rank)
    if not ranks:
        raise ArtifactError(f"tokenizer: {path!r} holds no '<base64 token> <rank>' lines")
    if max(seen) != len(ranks) - 1:  # ids are ranks: holes would be ids without a token
        hole = next(r for r in range(len(ranks)) if r not in seen)
        raise ArtifactError(f"tokenizer: {path!r}: ranks must be 0..{len(ranks) - 1}; {hole} is missing")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ArtifactError(
            f"tokenizer: {path!r} lacks {len(missing)} of the 256 single-byte tokens "
            f"(first: 0x{missing[0]:02X}); a byte-level BPE file must hold all of them"
        )
    return ranks


class TiktokenTokenizer(Tokenizer):
    kind = "tiktoken"

    def __init__(self, bpe_path: str, options: TokenizerOptions = TokenizerOptions()) -> None:
        import tiktoken

        super().__init__(bpe_path)
        self._ranks = read_ranks(self.path)
        names = list(dict.fromkeys(QWEN_SPECIAL_TOKENS + tuple(checked_special_tokens(options.special_tokens))))
        start = len(self._ranks)
        self._specials = {name: start + index for index, name in enumerate(names)}
        try:
            self._enc = tiktoken.Encoding(
                "qwen", pat_str=QWEN_PATTERN, mergeable_ranks=self._ranks, special_tokens=self._specials
            )
        except Exception as exc:  # tiktoken's own consistency checks
            raise ArtifactError(f"tokenizer: cannot build a tiktoken encoding from {self.path!r}: {exc}") from exc
        self._allowed = set(self._specials)
        self._vocab_size = start + len(names)
        self._init_specials(
            found={"eos_token_id": self._specials[ENDOFTEXT]},
            options=options,
            extra_eos=[self._specials[ENDOFTEXT], self._specials[IM_END]],
            special_ids=self._specials.values(),
        )

    def _encode_text(self, text: str) -> List[int]:
        text = unicodedata.normalize("NFC", text)
        return self._enc.encode(text, allowed_special=self._allowed, disallowed_special=())

    def _decode_ids(self, ids: List[int]) -> str:
        # Bytes of all tokens joined, then decoded: a character split over tokens comes
        # out whole, an incomplete one at the end as U+FFFD (the streamer holds it back).
        return self._enc.decode_bytes(ids).decode("utf-8", errors="replace")

    def _piece(self, token_id: int) -> str:
        """The token's text; bytes that are not UTF-8 on their own appear as ``\\xNN``."""
        return self._enc.decode_single_token_bytes(token_id).decode("utf-8", errors="backslashreplace")

    def _token_to_id(self, token: str) -> Optional[int]:
        if token in self._specials:
            return self._specials[token]
        return self._ranks.get(token.encode("utf-8"))
