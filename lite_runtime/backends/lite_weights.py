"""Give back the second copy of the weights that MindSpore Lite 2.0 keeps after building a `.ms` model.

Measured on this project's exports (CPU, Lite 2.0): after `Model::Build` of a `.ms` file whose weights
are inside it, Lite holds its own byte-exact copy of the whole file (in memory its allocator mapped
during Build; a caller's buffer is copied too, so building from a file or a buffer makes no
difference) and, for every MatMul with a constant weight, a packed copy of that weight, which is all
the kernel reads from then on. Lite's own `FreePackOpWeight` frees such originals only when a tensor
owns its data, never inside the model buffer, so a model stays at about twice its MatMul weights.

`release_packed_originals` finds Lite's copy of the file among the memory mapped since Build began
(exactly one byte-exact copy, or nothing is done; read through the kernel, since other threads keep
changing those mappings), then, from the flatbuffer in that copy, the constant tensors that only MatMul
nodes read (as their weight input), returns the whole pages inside those tensors to the system
(`MADV_DONTNEED`) and makes them inaccessible (`PROT_NONE`), so that a read Lite was not expected to make
fails loudly instead of seeing zeros. `Released.restore()` makes the
pages usable again; call it before Lite frees the model.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import struct
import threading
from typing import Dict, List, Tuple

import numpy as np

MATMUL_FUSION = 89              # schema::PrimitiveType_MatMulFusion of Lite 2.0's ops.fbs
PAGE = mmap.PAGESIZE
MIN_TENSOR_BYTES = 2 * PAGE     # a smaller weight holds at most one whole page
_PROT_NONE, _PROT_RW, _MADV_DONTNEED = 0, mmap.PROT_READ | mmap.PROT_WRITE, 4

_libc = ctypes.CDLL(None, use_errno=True)
_libc.memmem.restype = ctypes.c_void_p
_libc.memmem.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
for _name in ("madvise", "mprotect"):
    getattr(_libc, _name).argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class _Table:
    """A flatbuffer table: fields by their index in the schema (vtable slot)."""

    def __init__(self, buf, pos: int):
        self.buf, self.pos = buf, pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vtable_len = struct.unpack_from("<H", buf, self.vtable)[0]

    def _offset(self, field: int) -> int:
        slot = 4 + 2 * field
        return struct.unpack_from("<H", self.buf, self.vtable + slot)[0] if slot < self.vtable_len else 0

    def _target(self, field: int):
        offset = self._offset(field)
        if not offset:
            return None
        at = self.pos + offset
        return at + struct.unpack_from("<I", self.buf, at)[0]

    def byte(self, field: int) -> int:
        offset = self._offset(field)
        return self.buf[self.pos + offset] if offset else 0

    def vector(self, field: int) -> Tuple[int, int]:
        """(start of the elements, their count) of a vector field."""
        at = self._target(field)
        return (0, 0) if at is None else (at + 4, struct.unpack_from("<I", self.buf, at)[0])

    def table(self, field: int):
        at = self._target(field)
        return None if at is None else _Table(self.buf, at)

    def tables(self, field: int) -> List["_Table"]:
        start, count = self.vector(field)
        return [_Table(self.buf, start + 4 * i + struct.unpack_from("<I", self.buf, start + 4 * i)[0])
                for i in range(count)]

    def uints(self, field: int) -> List[int]:
        start, count = self.vector(field)
        return list(struct.unpack_from(f"<{count}I", self.buf, start)) if count else []


def matmul_weight_ranges(buf) -> List[Tuple[int, int]]:
    """(offset, length) in a `.ms` file of the data of every constant tensor that only MatMul nodes read,
    each as its weight (second) input: Lite reads those into packed copies. Lite's schema (model.fbs):
    MetaGraph fields 3 inputIndex, 4 outputIndex, 6 nodes, 7 allTensors; CNode 2 primitive, 3 inputIndex;
    Primitive 0 value_type; Tensor 6 data."""
    graph = _Table(buf, struct.unpack_from("<I", buf, 0)[0])
    readers: Dict[int, List[bool]] = {}
    for node in graph.tables(6):
        primitive = node.table(2)
        copies = primitive is not None and primitive.byte(0) == MATMUL_FUSION
        for position, tensor in enumerate(node.uints(3)):
            readers.setdefault(tensor, []).append(copies and position == 1)
    boundary = set(graph.uints(3)) | set(graph.uints(4))
    ranges = []
    for index, tensor in enumerate(graph.tables(7)):
        start, length = tensor.vector(6)
        if length >= MIN_TENSOR_BYTES and index not in boundary and readers.get(index) and all(readers[index]):
            ranges.append((start, length))
    return ranges


def anonymous_regions() -> Dict[int, int]:
    """start -> size of the process's private writable mappings without a file."""
    regions = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if fields[1].startswith("rw") and (len(fields) == 5 or fields[5] == "[heap]"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                regions[start] = end - start
    return regions


def _resident_runs(regions: Dict[int, int], min_length: int) -> List[Tuple[int, int]]:
    """(start, length) of the runs of resident pages in `regions` at least `min_length` long (a copy
    just written is resident; Lite's allocator reserves far more than it touches)."""
    runs = []
    with open("/proc/self/pagemap", "rb") as pagemap:
        for start, length in regions.items():
            pagemap.seek(start // PAGE * 8)
            present = np.frombuffer(pagemap.read(length // PAGE * 8), np.uint64) >> np.uint64(63)
            edges = np.flatnonzero(np.diff(np.concatenate(([0], present.astype(np.int8), [0]))))
            for first, end in zip(edges[::2], edges[1::2]):
                if (end - first) * PAGE >= min_length:
                    runs.append((start + int(first) * PAGE, int(end - first) * PAGE))
    return runs


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


_libc.process_vm_readv.restype = ctypes.c_ssize_t
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                                   ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]


# Bytes a read through the kernel copies at a time. Its buffer is resident while the search runs, at the
# load's peak: two of 32 MB (the search's and the comparison's) raised a 69 MB int8 model's load peak by 64 MB.
READ_CHUNK = 1 << 20


class _SafeReader:
    """Reads this process's memory through the kernel (process_vm_readv): a page another thread unmaps
    or protects meanwhile (Lite's worker threads and malloc arenas keep changing the mappings we scan)
    ends the read short instead of killing the process."""

    def __init__(self, chunk: int = READ_CHUNK):
        self.buffer = np.empty(chunk, np.uint8)
        self.address = self.buffer.ctypes.data
        self._pid = ctypes.c_int(os.getpid())

    def read(self, address: int, n: int) -> int:
        """Copies up to `n` bytes at `address` into the buffer; returns how many it could."""
        local = _Iovec(self.address, min(n, self.buffer.size))
        remote = _Iovec(address, local.length)
        got = _libc.process_vm_readv(self._pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        return max(got, 0)


def _copies(regions: Dict[int, int], source: int, size: int) -> List[int]:
    """Addresses in `regions` holding the `size` bytes at `source`."""
    probe = min(size, 256)
    reader, found = _SafeReader(), []
    for start, length in _resident_runs(regions, size):
        at, end = start, start + length
        while end - at >= size:
            got = reader.read(at, end - at)
            if got < probe:
                break           # the run was unmapped or protected since it was listed
            offset = 0
            while True:
                hit = _libc.memmem(reader.address + offset, got - offset, source, probe)
                if not hit:
                    break
                offset = hit - reader.address
                if at + offset + size > end:
                    break
                if _same(at + offset, source, size):
                    found.append(at + offset)
                offset += 1
            at += got - probe + 1     # the next read overlaps this one by less than a probe
    return found


def _same(copy: int, source: int, size: int, chunk: int = READ_CHUNK) -> bool:
    """The `size` bytes at `copy` (read through the kernel) equal those at `source` (a clean file
    mapping, whose pages are dropped once compared)."""
    reader = _SafeReader(chunk)
    for offset in range(0, size, chunk):
        n = min(chunk, size - offset)
        equal = reader.read(copy + offset, n) == n and _libc.memcmp(reader.address, source + offset, n) == 0
        drop_file_pages(source + offset, n)
        if not equal:
            return False
    return True


def drop_file_pages(address: int, size: int) -> None:
    """Unmap the resident pages of a clean private file mapping (read again from the file if used)."""
    start = address // PAGE * PAGE
    _libc.madvise(start, address + size - start, _MADV_DONTNEED)


class DropWhileBuilding:
    """While Lite builds from a clean read-only file mapping (it copies the file first), keep that
    mapping's pages out of the process every `period` seconds: the file is not held in memory twice."""

    def __init__(self, address: int, size: int, period: float = 0.02):
        self.address, self.size, self.period = address, size, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lite-build-drop", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            drop_file_pages(self.address, self.size)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        drop_file_pages(self.address, self.size)


class Released:
    """Pages of Lite's model copy given back; `restore()` makes them accessible again. `copies`: how
    many copies of the model file Build left in memory it mapped (Lite 2.0: 1; None: not looked for)."""

    def __init__(self, spans: List[Tuple[int, int]], copies=None):
        self.spans, self.copies = spans, copies
        self.nbytes = sum(length for _, length in spans)
        self._mprotect = _libc.mprotect      # kept: restore() may run while the interpreter exits

    def restore(self) -> None:
        for start, length in self.spans:
            self._mprotect(start, length, _PROT_RW)
        self.spans = []


def release_packed_originals(source: int, size: int, before: Dict[int, int]) -> Tuple[Released, str]:
    """Give back the pages of the MatMul weights (matmul_weight_ranges) in Lite's copy of the `size`
    bytes at `source` (the file as passed to Build), looked for in the mappings that are new or resized
    since `before` (anonymous_regions() taken before Build). Returns what was released and, when
    nothing was, why."""
    changed = {a: s for a, s in anonymous_regions().items() if before.get(a) != s}
    copies = _copies(changed, source, size)
    if len(copies) != 1:
        return Released([], len(copies)), f"{len(copies)} copies of the model in the memory Build mapped (expected 1)"
    # The flatbuffer is read in Lite's copy, which is resident: read through the file mapping, each tensor
    # touched mapped its page cache's large folios whole (a 1.1B int4 model: 350 MB more peak RSS at load).
    ranges = matmul_weight_ranges((ctypes.c_ubyte * size).from_address(copies[0]))
    if not ranges:
        return Released([], 1), "no MatMul weights inside the model file"
    base, spans = copies[0], []
    for offset, length in ranges:
        first = -(-(base + offset) // PAGE) * PAGE
        last = (base + offset + length) // PAGE * PAGE
        if last > first:
            spans.append((first, last - first))
    released = Released([], 1)
    for start, length in spans:
        if _libc.madvise(start, length, _MADV_DONTNEED) or _libc.mprotect(start, length, _PROT_NONE):
            released.restore()
            return Released([], 1), f"madvise/mprotect failed: errno {ctypes.get_errno()}"
        released.spans.append((start, length))
        released.nbytes += length
    return released, ""
