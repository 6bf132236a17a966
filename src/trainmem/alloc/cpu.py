"""The CPU allocators: PyTorch's CPU allocator (exact live bytes) and glibc malloc (resident memory).

Tensor bytes. c10's CPU allocator calls posix_memalign with 64-byte alignment and caches nothing
(c10/core/impl/alloc_cpu.cpp), so live tensor memory is the running sum of requests rounded up to 64 B.

Resident memory. Those requests go to glibc malloc (malloc/malloc.c), which keeps freed memory:
- a request at or above the mmap threshold (128 KiB at start) gets its own mmap, returned on free;
- freeing such a chunk raises the threshold to its size (up to 32 MiB on 64-bit) and the trim
  threshold to twice that: from then on, tensors below it live in the brk heap;
- the heap grows at its top; freed chunks coalesce with neighbours and stay resident, and the top is
  given back only when the free space there exceeds the trim threshold (keeping M_TOP_PAD, 128 KiB);
- a large request is served from a free chunk (best fit) or the top before sysmalloc maps or grows.
`GlibcModel` replays the stream through those rules and reports the peak of heap extent + mapped bytes.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict

from trainmem.targets import DeviceEvent

ALIGNMENT = 64
PAGE = 4096
MMAP_THRESHOLD_START = 128 * 1024  # DEFAULT_MMAP_THRESHOLD_MIN
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # DEFAULT_MMAP_THRESHOLD_MAX: 4 * 1024 * 1024 * sizeof(long)
TOP_PAD = 128 * 1024  # DEFAULT_TOP_PAD
CHUNK_OVERHEAD = 16  # size field + alignment to 16 (SIZE_SZ 8, MALLOC_ALIGNMENT 16)
MEMALIGN_SLACK = ALIGNMENT + 32  # _int_memalign asks nb + alignment + MINSIZE


def aligned(nbytes: int) -> int:
    return (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclasses.dataclass
class TensorReplay:
    peak_bytes: int
    peak_index: int  # index into the stream of the event that reached the peak
    live_at_peak: dict[int, DeviceEvent]  # key -> its alloc event
    final_bytes: int


def replay_tensors(stream: list[DeviceEvent]) -> TensorReplay:
    live: dict[int, DeviceEvent] = {}
    current = peak = 0
    peak_index = 0
    peak_keys: list[int] = []
    for index, event in enumerate(stream):
        if event.action == "alloc":
            live[event.key] = event
            current += aligned(event.nbytes)
            if current > peak:
                peak, peak_index, peak_keys = current, index, list(live)
        elif live.pop(event.key, None) is not None:
            current -= aligned(event.nbytes)
    # rebuild the live set at the peak from the keys recorded there
    by_key = {}
    for event in stream[: peak_index + 1]:
        if event.action == "alloc":
            by_key[event.key] = event
    return TensorReplay(peak, peak_index, {k: by_key[k] for k in peak_keys}, current)


class GlibcModel:
    """glibc malloc's main arena, as far as the resident footprint goes."""

    def __init__(self) -> None:
        self.mmap_threshold = MMAP_THRESHOLD_START
        self.trim_threshold = 2 * MMAP_THRESHOLD_START
        self.top_start = 0  # first byte of the top chunk; the heap is [0, brk)
        self.brk = 0
        self.mapped = 0
        self.free_sizes: list[tuple[int, int]] = []  # sorted (size, address) of free heap chunks
        self.free_at: dict[int, int] = {}  # address -> size
        self.free_ending: dict[int, int] = {}  # end address -> start address
        self.chunks: dict[int, tuple[str, int, int]] = {}  # key -> ("heap"|"mmap", address, size)
        self.peak_resident = 0

    def resident(self) -> int:
        return self.brk + self.mapped

    def malloc(self, key: int, nbytes: int) -> None:
        size = (nbytes + MEMALIGN_SLACK + CHUNK_OVERHEAD + 15) // 16 * 16
        found = self._best_fit(size)
        if found is not None:
            self._take_free(found, size, key)
        elif self.brk - self.top_start >= size:
            self._take_top(size, key)
        elif size >= self.mmap_threshold:
            mapped = (nbytes + MEMALIGN_SLACK + CHUNK_OVERHEAD + PAGE - 1) // PAGE * PAGE
            self.chunks[key] = ("mmap", 0, mapped)
            self.mapped += mapped
        else:
            grow = size - (self.brk - self.top_start) + TOP_PAD
            self.brk += (grow + PAGE - 1) // PAGE * PAGE
            self._take_top(size, key)
        self.peak_resident = max(self.peak_resident, self.resident())

    def free(self, key: int) -> None:
        kind, address, size = self.chunks.pop(key)
        if kind == "mmap":
            self.mapped -= size
            if self.mmap_threshold < size <= MMAP_THRESHOLD_MAX:
                self.mmap_threshold, self.trim_threshold = size, 2 * size
            return
        end = address + size
        if end in self.free_at:  # merge with the free chunk after
            size += self._remove_free(end)
        if address in self.free_ending:  # merge with the free chunk before
            before = self.free_ending[address]
            size += self._remove_free(before)
            address = before
        if address + size == self.top_start:
            self.top_start = address
            if self.brk - self.top_start > self.trim_threshold:
                self.brk = max(self.top_start + TOP_PAD, self.top_start) // PAGE * PAGE
                self.brk = max(self.brk, self.top_start)
        else:
            self._add_free(address, size)

    def _best_fit(self, size: int) -> int | None:
        index = bisect.bisect_left(self.free_sizes, (size, -1))
        return self.free_sizes[index][1] if index < len(self.free_sizes) else None

    def _take_free(self, address: int, size: int, key: int) -> None:
        chunk = self._remove_free(address)
        self.chunks[key] = ("heap", address, size)
        if chunk - size >= 32:  # MINSIZE: the remainder stays a free chunk
            self._add_free(address + size, chunk - size)
        else:
            self.chunks[key] = ("heap", address, chunk)

    def _take_top(self, size: int, key: int) -> None:
        self.chunks[key] = ("heap", self.top_start, size)
        self.top_start += size

    def _add_free(self, address: int, size: int) -> None:
        bisect.insort(self.free_sizes, (size, address))
        self.free_at[address] = size
        self.free_ending[address + size] = address

    def _remove_free(self, address: int) -> int:
        size = self.free_at.pop(address)
        del self.free_ending[address + size]
        self.free_sizes.pop(bisect.bisect_left(self.free_sizes, (size, address)))
        return size


def replay_resident(stream: list[DeviceEvent]) -> int:
    """Peak bytes glibc keeps resident for the stream's tensors (heap extent + mapped chunks)."""
    model = GlibcModel()
    for event in stream:
        if event.action == "alloc":
            model.malloc(event.key, event.nbytes)
        elif event.key in model.chunks:
            model.free(event.key)
    return model.peak_resident


def bytes_by_category(events: dict[int, DeviceEvent]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for event in events.values():
        totals[str(event.category)] += event.nbytes
    return dict(totals)
