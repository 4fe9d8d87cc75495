"""Streaming generated text while the decode loop runs.

The decode loop calls ``streamer.put(new_ids)`` once per step with the tokens each row
produced in that step, and ``streamer.end()`` once when generation stops (also on
failure, from a ``finally``). The prompt is never put. ``new_ids`` is one entry per row:
an int (one token), a sequence of ints (zero or more tokens; empty for a row that has
finished), or a (B,) / (B, n) integer array.

Each row is detokenised on its own and incrementally: only a short window of the row's
recent tokens is decoded per step, text ending in U+FFFD (an incomplete multi-byte
character from byte-fallback tokens) is held back until complete, and the concatenated
chunks of a row equal ``tokenizer.decode(all_new_ids_of_that_row)``.
"""

from __future__ import annotations

import queue
import sys
from typing import IO, Iterator, List, Optional, Protocol, Sequence, Tuple, Union

import numpy as np

from lite_runtime.contract.errors import ValidationError

_INCOMPLETE = "\ufffd"
# A UTF-8 character is at most 4 bytes, i.e. 4 byte-fallback tokens; text still
# incomplete after this many held tokens is genuinely invalid and is let through.
_MAX_HELD_TOKENS = 8


class Streamer(Protocol):
    def put(self, new_ids: object) -> None: ...

    def end(self) -> None: ...


CONTEXT_TOKENS = 4   # prompt tokens kept as left context when decoding what follows them


class RowDetokenizer:
    """Turns one row's token ids into text chunks as they arrive.

    Keeps ``prefix`` (tokens whose text is out, kept as left context so that spaces and
    multi-token characters decode as in the full sequence) and ``held`` (tokens whose
    text is not out yet). Each push decodes ``prefix + held`` and emits what follows the
    prefix's own text; the prefix then becomes the tokens just emitted, so the decoded
    window stays a few tokens long.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True, context: Sequence[int] = ()) -> None:
        """``context``: the last prompt tokens, so the first new token decodes as it does after
        the prompt (sentencepiece drops a leading space when a piece is decoded alone)."""
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        special = getattr(tokenizer, "all_special_ids", None) or ()
        self._special = frozenset(int(i) for i in special)
        self._prefix: List[int] = [int(t) for t in context]
        self._prefix_text = self._decode(self._prefix) if self._prefix else ""
        self._held: List[int] = []

    def push(self, ids: Sequence[int]) -> str:
        """Adds tokens; returns the text they completed (possibly empty)."""
        if not ids:
            return ""
        self._held.extend(ids)
        text = self._decode(self._prefix + self._held)
        if text.endswith(_INCOMPLETE) and len(self._held) < _MAX_HELD_TOKENS:
            return ""
        new_text = text[len(self._prefix_text):]
        if not new_text:
            # Only skipped special tokens (e.g. EOS/pad fed to a finished row): drop them
            # so they do not grow the window.
            if self._skip and all(token in self._special for token in self._held):
                self._held = []
            return ""
        self._advance(text)
        return new_text

    def flush(self) -> str:
        """Text of any held tokens, complete or not; call once at the end."""
        if not self._held:
            return ""
        text = self._decode(self._prefix + self._held)
        new_text = text[len(self._prefix_text):]
        self._advance(text)
        return new_text

    def _advance(self, text: str) -> None:
        # A context whose own text is empty (e.g. only a "▁" piece) would let the
        # decoder's leading-space stripping run on into the next tokens, so such tokens
        # stay attached to the previous context instead of replacing it.
        held_text = self._decode(self._held)
        if held_text:
            self._prefix, self._prefix_text = self._held, held_text
        else:
            self._prefix, self._prefix_text = self._prefix + self._held, text
        self._held = []

    def _decode(self, ids: List[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)


def continuation_text(tokenizer, prompt_ids: Sequence[int], new_ids: Sequence[int],
                      skip_special_tokens: bool = True) -> str:
    """The text `new_ids` add after the prompt, spaces included; equal to what a streamer prints."""
    decoder = RowDetokenizer(tokenizer, skip_special_tokens, prompt_ids[-CONTEXT_TOKENS:])
    return decoder.push(list(new_ids)) + decoder.flush()


def split_rows(new_ids: object, batch_size: Optional[int]) -> List[List[int]]:
    """``put``'s argument as one list of new token ids per row."""
    if isinstance(new_ids, np.ndarray):
        if new_ids.ndim not in (1, 2) or not np.issubdtype(new_ids.dtype, np.integer):
            raise ValidationError(
                f"new_ids: expected a (B,) or (B, n) integer array, got {new_ids.dtype} "
                f"of shape {new_ids.shape}"
            )
        rows = new_ids.reshape(new_ids.shape[0], -1).tolist()
    elif isinstance(new_ids, (str, bytes)) or not hasattr(new_ids, "__iter__"):
        raise ValidationError(
            f"new_ids: expected one entry per row (a list or array), got {new_ids!r}"
        )
    else:
        rows = []
        for entry in new_ids:
            if isinstance(entry, (int, np.integer)) and not isinstance(entry, bool):
                rows.append([int(entry)])
            elif isinstance(entry, np.ndarray):
                rows.append(entry.reshape(-1).tolist())
            else:
                rows.append([int(token) for token in entry])
    if batch_size is not None and len(rows) != batch_size:
        raise ValidationError(
            f"new_ids: expected one entry per row ({batch_size} rows), got {len(rows)}"
        )
    return rows


class _RowStreams:
    """Per-row detokenisers behind ``put``/``end``; subclasses decide where text goes."""

    def __init__(self, tokenizer, batch_size: Optional[int], skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self._skip = skip_special_tokens
        self._rows: Optional[List[RowDetokenizer]] = None
        self._ended = False

    def prime(self, contexts: Sequence[Sequence[int]]) -> None:
        """Give each row its prompt's last tokens as decoding context; call before the first put."""
        self.batch_size = len(contexts)
        self._rows = [RowDetokenizer(self.tokenizer, self._skip, c) for c in contexts]
        self._on_start(len(contexts))

    def put(self, new_ids: object) -> None:
        if self._ended:
            raise ValidationError("streamer: put() after end(); use a new streamer per request")
        rows = split_rows(new_ids, self.batch_size)
        if self._rows is None:
            self.prime([() for _ in rows])
        for row, (decoder, ids) in enumerate(zip(self._rows, rows)):
            text = decoder.push(ids)
            if text:
                self._on_text(row, text)

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        for row, decoder in enumerate(self._rows or []):
            text = decoder.flush()
            if text:
                self._on_text(row, text)
        self._on_end()

    def _on_start(self, batch_size: int) -> None:
        pass

    def _on_text(self, row: int, text: str) -> None:
        raise NotImplementedError

    def _on_end(self) -> None:
        pass


class TextStreamer(_RowStreams):
    """Prints generated text as it is produced.

    ``file`` is one writable text file (default ``sys.stdout``) or a sequence of them,
    one per row. With one file and a batch, row 0 is printed live and every other row is
    printed as its own block at ``end()``, so rows are never interleaved; pass one file
    per row to see every row live. A newline is written after each row's text at the end.
    """

    def __init__(
        self,
        tokenizer,
        file: Union[IO[str], Sequence[IO[str]], None] = None,
        skip_special_tokens: bool = True,
    ) -> None:
        files = None if file is None or hasattr(file, "write") else list(file)
        super().__init__(tokenizer, len(files) if files is not None else None, skip_special_tokens)
        self._file = file
        self._files = files
        self._later: List[List[str]] = []

    def _target(self, row: int) -> Optional[IO[str]]:
        if self._files is not None:
            return self._files[row]
        if row == 0:
            return self._file if self._file is not None else sys.stdout
        return None

    def _on_start(self, batch_size: int) -> None:
        self._later = [[] for _ in range(batch_size)]

    def _on_text(self, row: int, text: str) -> None:
        out = self._target(row)
        if out is None:
            self._later[row].append(text)
        else:
            out.write(text)
            out.flush()

    def _on_end(self) -> None:
        if self._files is not None:
            for out in self._files:
                out.write("\n")
                out.flush()
            return
        out = self._file if self._file is not None else sys.stdout
        out.write("\n")
        for chunks in self._later[1:]:
            out.write("".join(chunks) + "\n")
        out.flush()


class _RowIterator:
    def __init__(self, chunks: "queue.Queue[Optional[str]]", timeout: Optional[float]) -> None:
        self._chunks = chunks
        self._timeout = timeout

    def __iter__(self) -> Iterator[str]:
        while True:
            text = self._chunks.get(timeout=self._timeout)
            if text is None:
                return
            yield text


class TextIteratorStreamer(_RowStreams):
    """Text chunks for a consumer thread while generation runs in another.

    ``for row, text in streamer`` yields every chunk of every row in production order;
    ``for text in streamer.rows[i]`` yields only row i's chunks (each row has its own
    queue, so rows never mix). Use one of the two. Both stop after ``end()``; with a
    ``timeout`` a stalled producer raises ``queue.Empty`` instead of blocking forever.
    ``batch_size`` must be given up front so that ``rows`` exists before the first put.
    """

    def __init__(
        self,
        tokenizer,
        batch_size: int = 1,
        skip_special_tokens: bool = True,
        timeout: Optional[float] = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValidationError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
        super().__init__(tokenizer, batch_size, skip_special_tokens)
        self._timeout = timeout
        self._all: "queue.Queue[Optional[Tuple[int, str]]]" = queue.Queue()
        self._per_row = [queue.Queue() for _ in range(batch_size)]
        self.rows = [_RowIterator(chunks, timeout) for chunks in self._per_row]

    def prime(self, contexts: Sequence[Sequence[int]]) -> None:
        if len(contexts) != len(self._per_row):
            raise ValidationError(f"TextIteratorStreamer(batch_size={len(self._per_row)}) has a queue for "
                                  f"{len(self._per_row)} row(s) but the request has {len(contexts)} prompts; "
                                  f"make it with batch_size={len(contexts)}")
        super().prime(contexts)

    def _on_text(self, row: int, text: str) -> None:
        self._per_row[row].put(text)
        self._all.put((row, text))

    def _on_end(self) -> None:
        for chunks in self._per_row:
            chunks.put(None)
        self._all.put(None)

    def __iter__(self) -> Iterator[Tuple[int, str]]:
        while True:
            item = self._all.get(timeout=self._timeout)
            if item is None:
                return
            yield item
