"""File hashes: the sha256 of a file, and a record of the hashes already checked, so that an export
of many gigabytes is hashed at its first load rather than at every one (hashing took longer than
Lite's Build: docs/measured-choices.md).

A record is keyed by the file's identity (real path, size, modification time, inode), so a file
that was rewritten, truncated or replaced is hashed again. The record lives in the user's cache
folder; when it cannot be read or written, every file is simply hashed."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Dict

MAX_RECORDS = 4096


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def record_path() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "llm-lite-export", "checked-sha256.json")


class CheckedHashes:
    """`matches(path, expected)`: whether `path` has sha256 `expected`, hashing it only when its
    identity is not on record with that hash; `save()` keeps what was learnt."""

    def __init__(self):
        try:
            with open(record_path(), encoding="utf-8") as f:
                self.known: Dict[str, str] = dict(json.load(f))
        except (OSError, ValueError, TypeError):
            self.known = {}
        self.changed = False

    def matches(self, path: str, expected: str) -> bool:
        st = os.stat(path)
        key = f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        if self.known.get(key) == expected:
            return True
        if file_sha256(path) != expected:
            return False
        self.known[key] = expected
        self.changed = True
        return True

    def save(self) -> None:
        if not self.changed:
            return
        path = record_path()
        known = dict(list(self.known.items())[-MAX_RECORDS:])
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(known, f)
            os.replace(tmp, path)
        except OSError:
            pass
