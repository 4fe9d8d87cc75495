"""Backend registry. Each backend module is imported only when chosen, so the `mslite` process
never loads mindspore."""
from __future__ import annotations

import importlib

from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.manifest import Manifest
from lite_runtime.backends.base import Session

BACKENDS = {"ms": ("lite_runtime.backends.ms_backend", "MSSession"),
            "mslite": ("lite_runtime.backends.mslite_backend", "MSLiteSession")}


def load_session(backend: str, manifest: Manifest, rank: int = 0, **options) -> Session:
    """Load one rank's graphs of `manifest` with `backend`; options go to the backend."""
    if backend not in BACKENDS:
        raise UnsupportedError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    module_name, class_name = BACKENDS[backend]
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(manifest, rank, **options)


__all__ = ["BACKENDS", "Session", "load_session"]
