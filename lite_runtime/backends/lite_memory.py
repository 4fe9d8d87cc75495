"""What loading an export on MindSpore Lite on CPU takes in memory, checked before the first Build.

Lite 2.0 builds every weight in this process's memory, more than once, and a load that does not fit
is killed by the kernel without a word (the io form of a 1.1B model at 24 GB after 95 s). So
`MSLiteSession` estimates the load's peak first and refuses, in one line, what exceeds the memory
available. The estimate is a multiple of the bytes of the weight files the load reads (the graph or
`.ms` files the manifest lists for this rank, with their external data: the io form's two graphs
each hold a copy of their own) plus Lite's fixed `LITE_FIXED_BYTES`. The multiples, measured at 1.1B
(docs/performance.md, "Real-size models"; a float16 export counts twice its bytes: Lite widens float16 weights to
float32 on CPU):
- `mindir`: a MindIR (weights inside or as external data), which Lite converts at Build: 3.9x
  (16.4 GB for one step graph's 4.4 GB, 3.7x, of which 12.3 GB stay; the io form's second graph is
  built while the first keeps its 2.8x, so 3.9x of both graphs' weights overstates its peak by a sixth);
- `ms`: a `.ms` per graph (weights inside, or `.msw` beside): Lite's copy and the kernels' packed
  copy, 2.0x (3.0x for weights inside when the release is off, `LITE_RELEASE_WEIGHTS=0`); a `.ms` whose
  products all run on the project's kernels (`head_on_kernel`: `target: cpu`'s default), which read
  Lite's copy, 1.5x (1.47x measured by tests/test_export_memory.py; 2.0x when the release is off, 1.9x
  measured: Lite reads the file itself then);
- `ms_segments`: one rank's step as `.ms` segments, each giving back Lite's original weights after its
  Build: 1.2x (1.14-1.16x measured; 2.0x without the release).
The memory available is `MemAvailable` of /proc/meminfo, or less: `LITE_MEMORY_LIMIT_GB` (a
container's limit, which /proc/meminfo does not show) lowers it, never raises it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

from lite_runtime.backends.lite_native import RELEASE_ENV
from lite_runtime.contract.errors import ConfigError, ResourceError
from lite_runtime.contract.families import graph_kinds
from lite_runtime.contract.manifest import Manifest

GB = 1e9
LITE_FIXED_BYTES = int(0.25 * GB)    # Lite's libraries and what it keeps (0.26 GB measured after close)
MULTIPLES = {"mindir": 3.9, "ms": 2.0, "ms_segments": 1.2}
MULTIPLES_WITHOUT_RELEASE = {"mindir": 3.9, "ms": 3.0, "ms_segments": 2.0}
KERNELS_MS_MULTIPLES = {True: 1.5, False: 2.0}      # one .ms on the project's kernels, by the release
LIMIT_ENV = "LITE_MEMORY_LIMIT_GB"       # the memory a load may count on, when lower than MemAvailable
MEMINFO = "/proc/meminfo"
_FORM_WORDS = {"mindir": "MindIR graph", "ms": ".ms model", "ms_segments": ".ms segment"}


@dataclass
class LoadEstimate:
    form: str                 # a key of MULTIPLES
    files: List[str]          # what the load reads, relative to the export
    weight_bytes: int         # their size (float16 counted twice: Lite widens it to float32)
    multiple: float

    @property
    def peak_bytes(self) -> int:
        return int(self.multiple * self.weight_bytes) + LITE_FIXED_BYTES

    def words(self) -> str:
        models = len([f for f in self.files if f.endswith((".ms", ".mindir"))])
        converted = ", which Lite converts at Build" if self.form == "mindir" else ""
        weights = self.weight_bytes
        size = f"{weights / GB:.1f} GB" if weights >= GB / 10 else f"{weights / 1e6:.1f} MB"
        return (f"{models} {_FORM_WORDS[self.form]}{'s' if models != 1 else ''} with {size} of weights{converted}: "
                f"{self.multiple:g}x that + Lite's {LITE_FIXED_BYTES / GB:g} GB")


def loaded_files(manifest: Manifest, rank: int, lite_format: str) -> Tuple[List[str], bool]:
    """The files one rank's load reads, relative to the export (each model file, then its external
    data), and whether any of them is a MindIR; the choice of `MSLiteSession._open`: a graph's `.ms`
    when the export has one and `lite_format` is not 'mindir'."""
    names = list(manifest.segments) if manifest.collectives == "host" else list(graph_kinds(manifest.kv_cache))
    files, mindir = [], False
    for name in names:
        entry = manifest.segments.get(name) if manifest.collectives == "host" else manifest.graphs.get(name)
        lite = manifest.lite_files.get(name) or []
        graph = entry.files if entry is not None else []
        if rank < len(lite) and lite_format != "mindir":
            model = lite[rank]
        elif rank < len(graph):
            model, mindir = graph[rank], True
        else:                # a manifest short of files: the load names what is missing
            continue
        files += [model] + list(manifest.external_data.get(model, []))
    return files, mindir


def estimate_load(manifest: Manifest, rank: int = 0, lite_format: str = "auto") -> LoadEstimate:
    """The peak memory of loading `manifest`'s rank on Lite on CPU (see the module's docstring)."""
    files, mindir = loaded_files(manifest, rank, lite_format)
    size = 0
    for rel in files:
        try:
            size += os.path.getsize(os.path.join(manifest.root, rel))
        except OSError:          # missing: the load itself names it
            pass
    if manifest.compute_dtype == "float16":
        size *= 2
    form = "mindir" if mindir else "ms_segments" if manifest.collectives == "host" else "ms"
    release = os.environ.get(RELEASE_ENV, "1") != "0"
    multiple = (MULTIPLES if release else MULTIPLES_WITHOUT_RELEASE)[form]
    if form == "ms" and any(f.endswith(".msw") for f in files):
        multiple = MULTIPLES["ms"]        # .ms + .msw: 2.0x, released or not
    elif form == "ms" and manifest.quantization.get("head_on_kernel"):
        multiple = KERNELS_MS_MULTIPLES[release]
    return LoadEstimate(form, files, size, multiple)


def available_memory(meminfo: str = MEMINFO) -> Tuple[Optional[int], str]:
    """(bytes this load may count on, where the figure comes from); (None, ...) when unknown (no /proc)."""
    found = None
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return found, "MemAvailable"
    try:
        limit = int(float(text) * GB)
        if limit < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{LIMIT_ENV}={text!r} is not a number of GB (e.g. 8 or 0.5)") from None
    if found is not None and found <= limit:
        return found, f"MemAvailable, below {LIMIT_ENV}={text}"
    return limit, f"{LIMIT_ENV}={text}" + ("" if found is None else f", below MemAvailable {found / GB:.1f} GB")


def check_load_memory(manifest: Manifest, rank: int = 0, lite_format: str = "auto") -> LoadEstimate:
    """Refuse (ResourceError, one line) a load whose estimated peak exceeds the memory available."""
    estimate = estimate_load(manifest, rank, lite_format)
    available, source = available_memory()
    if available is None or estimate.peak_bytes <= available:
        return estimate
    where = manifest.root or os.path.dirname(manifest.file) or "the export"
    if manifest.world_size > 1:
        where += f" (rank {rank})"
    raise ResourceError(f"{where} needs about {estimate.peak_bytes / GB:.1f} GB to load on MindSpore Lite on CPU "
                        f"({estimate.words()}), more than the {available / GB:.1f} GB available ({source}); "
                        + _advice(manifest, estimate, lite_format))


def _advice(manifest: Manifest, estimate: LoadEstimate, lite_format: str) -> str:
    if estimate.form == "mindir" and manifest.lite_files and lite_format == "mindir":
        return "load its .ms models instead (lite_format 'auto')"
    if estimate.form == "mindir":
        return ("export it again for CPU: add `target: cpu` to its export yaml and run it with the MindSpore 2.0 "
                "environment (make export-lite CONFIG=<yaml>): one step graph as .ms, about 1.2-2x the weights")
    if estimate.form == "ms":
        return ("export it again with `target: cpu` and `parallel: {collectives: host}` in its yaml (compute_dtype "
                "float32): one rank's step as .ms segments, about 1.2x the weights")
    return "this is the form that loads with the least memory: free memory or use a larger machine"
