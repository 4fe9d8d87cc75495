"""Checks of a graph before its first call: its inputs against the manifest, and the collective
operators it holds (which a runtime without collectives must refuse)."""
from __future__ import annotations

import mmap
import re
from typing import List, Sequence

from lite_runtime.contract.errors import ArtifactError
from lite_runtime.contract.families import TensorSpec

# MindSpore 2.0 records construct argument names in MindIR ("<graph>:input_ids"); later versions
# record generated names ("<graph>:Parameter_11"), and the exporter passes the per-layer caches (and
# SLoRA's adapter ids) as `*kv`, recorded as "kv0", "kv1", ... Generated names carry no meaning: the
# position stands in. MindSpore 2.0 prefixes "ф" to the named arguments of some graphs taking `*kv`
# (the step segments'): the name after it is the argument's.
_GENERATED = re.compile(r"Parameter_\d+|kv\d+")
_CLONED = "\u0444"


def short_name(graph_name: str) -> str:
    name = graph_name.rsplit(":", 1)[-1]
    return name[len(_CLONED):] if name.startswith(_CLONED) else name


def names_match(graph_name: str, spec_name: str) -> bool:
    name = short_name(graph_name)
    return name == spec_name or bool(_GENERATED.fullmatch(name))


def check_graph_inputs(actual: Sequence[TensorSpec], expected: List[TensorSpec], where: str) -> None:
    """Raise ArtifactError naming the first input whose count, name, dtype or shape differs."""
    if len(actual) != len(expected):
        raise ArtifactError(f"{where}: the graph has {len(actual)} inputs but the manifest lists "
                            f"{len(expected)} ({', '.join(s.name for s in expected)}); export again")
    for i, (got, want) in enumerate(zip(actual, expected)):
        problem = None
        if not names_match(got.name, want.name):
            problem = f"is named {short_name(got.name)!r}"
        elif got.dtype != want.dtype:
            problem = f"has dtype {got.dtype}"
        elif tuple(got.shape) != tuple(want.shape):
            problem = f"has shape {tuple(got.shape)}"
        if problem:
            raise ArtifactError(f"{where}: graph input {i} {problem}, but the manifest expects "
                                f"{want.name} {want.dtype} {tuple(want.shape)}; export again")


# MindIR names each node's primitive "REF::<Name>"; these are the collectives MindSpore exports.
_COLLECTIVE = re.compile(rb"REF::(AllReduce|AllGather|ReduceScatter|AlltoAll|Broadcast|Send|Receive)\b")


def collectives_in(path: str) -> List[str]:
    """Names of the collective operators in the MindIR file `path` (read without MindSpore)."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return sorted({m.group(1).decode() for m in _COLLECTIVE.finditer(data)})
