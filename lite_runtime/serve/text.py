"""A request's text as its tokens arrive: incremental detokenisation (the decode loop's
`RowDetokenizer`) and stop strings, matched on the text and never emitted; and each token's own text
and bytes, as logprobs and TGI's token details report them (`TokenText`)."""
from __future__ import annotations

import re
from typing import Callable, Dict, Optional, Sequence, Tuple

from lite_runtime.decode.streamers import RowDetokenizer


class RequestText:
    """`add(token)` -> (text to send now, stopped); `finish()` -> what was held back.

    Text that could still become the start of a stop string is held until it cannot; when a stop
    string appears, the text before it is sent and generation should end."""

    def __init__(self, tokenizer, prompt: Sequence[int], stop: Sequence[str] = ()):
        self._rows = RowDetokenizer(tokenizer, context=list(prompt)[-4:])
        self._stop = [s for s in stop if s]
        self._held = ""
        self.text = ""          # everything sent so far
        self.stopped = False

    def add(self, token: int) -> Tuple[str, bool]:
        return self._release(self._rows.push([token]))

    def finish(self) -> str:
        if self.stopped:
            return ""
        out, _ = self._release(self._rows.flush(), final=True)
        return out

    def _release(self, new: str, final: bool = False) -> Tuple[str, bool]:
        if self.stopped:
            return "", True
        text = self._held + new
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if hits:
            out, self._held, self.stopped = text[:min(hits)], "", True
        else:
            keep = 0 if final else self._partial_stop(text)
            out, self._held = text[:len(text) - keep], text[len(text) - keep:]
        self.text += out
        return out, self.stopped

    def _partial_stop(self, text: str) -> int:
        """Length of the longest end of `text` that begins some stop string."""
        best = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if stop.startswith(text[-n:]):
                    best = n
                    break
        return best


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")      # sentencepiece's byte fallback
_ESCAPED_BYTE = re.compile(r"\\x([0-9a-f]{2})")        # a byte that is not UTF-8 on its own, as `\xNN`
_PROBES = ("Hello world, it is 12.", "naïve café\n你好 😀")


def _byte_level_chars() -> Dict[str, int]:
    """GPT-2's byte-level alphabet (`bytes_to_unicode`) inverted: the character of a byte-level BPE
    piece -> its byte (`Ġ` -> 0x20, `Ċ` -> 0x0A)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + shifted)] = b
            shifted += 1
    return chars


_BYTE_LEVEL = _byte_level_chars()


def _byte_level(piece: str) -> Optional[bytes]:
    try:
        return bytes(_BYTE_LEVEL[c] for c in piece)
    except KeyError:
        return None


def _escaped(piece: str) -> bytes:
    """A piece written as UTF-8 text with `\\xNN` for bytes that are not (tiktoken's pieces here)."""
    parts = _ESCAPED_BYTE.split(piece)
    return b"".join(bytes([int(p, 16)]) if i % 2 else p.encode("utf-8") for i, p in enumerate(parts))


def _metaspace(piece: str) -> bytes:
    """A sentencepiece piece: `▁` is a space, `<0xNN>` one byte."""
    byte = _BYTE_PIECE.fullmatch(piece)
    return bytes([int(byte.group(1), 16)]) if byte else piece.replace("\u2581", " ").encode("utf-8")


class TokenText:
    """Each token's own text and UTF-8 bytes, as OpenAI's logprobs report them (`" Paris"`, not the
    vocabulary's `ĠParis` or `▁Paris`; `bytes` the list of its byte values). A token holding part of
    a multi-byte character has those bytes, and as text its valid part with the rest as `\\xNN`.

    The tokenizer's pieces are read by the first of the vocabulary's spellings (byte-level BPE,
    UTF-8 with escaped bytes, sentencepiece's `▁` and `<0xNN>`) under which the pieces of a few
    probe texts make the bytes their decoding makes; with none, a token's bytes are its decoding's."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.specials = frozenset(int(i) for i in tokenizer.all_special_ids)
        self._cache: Dict[int, bytes] = {}
        self._spelling = self._find_spelling()

    def bytes(self, token: int) -> bytes:
        token = int(token)
        if token not in self._cache:
            self._cache[token] = self._bytes(token)
        return self._cache[token]

    def text(self, token: int) -> str:
        return self.bytes(token).decode("utf-8", errors="backslashreplace")

    def _bytes(self, token: int) -> bytes:
        piece = self.tokenizer.id_to_piece(token)
        if token in self.specials:
            return piece.encode("utf-8")
        spelled = self._spelling(piece) if self._spelling is not None else None
        if spelled is None:
            return self.tokenizer.decode([token], skip_special_tokens=False).encode("utf-8")
        return spelled

    def _find_spelling(self) -> Optional[Callable[[str], Optional[bytes]]]:
        best, best_score = None, 0
        for spelling in (_byte_level, _escaped, _metaspace):
            score = sum(self._spells(spelling, probe) for probe in _PROBES)
            if score > best_score:
                best, best_score = spelling, score
        return best

    def _spells(self, spelling, probe: str) -> bool:
        tok = self.tokenizer
        ids = [i for i in tok.encode(probe, add_special_tokens=False) if i not in self.specials]
        pieces = [spelling(tok.id_to_piece(i)) for i in ids]
        if not ids or any(p is None for p in pieces):
            return False
        made, decoded = b"".join(pieces), tok.decode(ids, skip_special_tokens=False).encode("utf-8")
        # sentencepiece adds a space before a text and drops it when decoding
        return made == decoded or made.lstrip(b" ") == decoded.lstrip(b" ")
