"""A request's text as its tokens arrive: incremental detokenisation (the decode loop's
`RowDetokenizer`) and stop strings, matched on the text and never emitted."""
from __future__ import annotations

from typing import Sequence, Tuple

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
