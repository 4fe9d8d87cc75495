"""Tensors read when they are taken, so that a model's source weights are never all held at once.

`WeightPlan.apply` takes a checkpoint's tensors one at a time (`pop`) and hands each converted tensor
to a `finish` step; a quantized export keeps only the quantized form, so at 7B its float weights
(27 GB as float32) are never in memory together: one tensor at a time is.
"""
from __future__ import annotations

from typing import Callable, Dict, Iterator, Tuple

import numpy as np

Loader = Callable[[], np.ndarray]


class LazyTensors:
    """A name -> tensor mapping whose values are read by their loaders when taken or looked at."""

    def __init__(self, loaders: Dict[str, Loader] = None):
        self._loaders: Dict[str, Loader] = dict(loaders or {})

    def add(self, name: str, loader: Loader) -> None:
        self._loaders[name] = loader

    def update(self, other: "LazyTensors") -> None:
        self._loaders.update(other._loaders)

    def keys(self):
        return list(self._loaders)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._loaders))

    def __len__(self) -> int:
        return len(self._loaders)

    def __contains__(self, name) -> bool:
        return name in self._loaders

    def __getitem__(self, name: str) -> np.ndarray:
        return self._loaders[name]()

    def __delitem__(self, name: str) -> None:
        del self._loaders[name]

    def items(self) -> Iterator[Tuple[str, np.ndarray]]:
        for name in list(self._loaders):
            yield name, self._loaders[name]()

    def pop(self, name: str, *default):
        if default and name not in self._loaders:
            return default[0]
        return self._loaders.pop(name)()
