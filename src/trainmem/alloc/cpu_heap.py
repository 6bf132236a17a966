"""The CPU allocators: PyTorch's CPU allocator (exact live bytes) and glibc malloc (resident memory).

Tensor bytes. c10's CPU allocator calls posix_memalign with 64-byte alignment and caches nothing
(c10/core/impl/alloc_cpu.cpp), so live tensor memory is the running sum of requests rounded up to 64 B.

Resident memory. Those requests go to glibc malloc (malloc/malloc.c, glibc 2.36), which keeps freed
memory. `GlibcModel` follows the main arena's rules:
- posix_memalign asks _int_malloc for nb + alignment + MINSIZE, then frees the misaligned lead and the
  spare tail as small chunks (_int_memalign);
- a small freed chunk goes to the tcache (7 per size, up to 1040 B) or a fastbin (up to 128 B) and is
  not coalesced: it keeps its neighbours apart. Fastbins are consolidated before a large request and
  when a free of 64 KiB or more coalesces (FASTBIN_CONSOLIDATION_THRESHOLD); the tcache never is;
- a request is served best-fit from free chunks, else from the top, else by mmap when it is at least
  the mmap threshold (128 KiB at start), else by growing the heap (request + M_TOP_PAD, page-rounded);
- freeing a mapped chunk raises the threshold to its size (up to 32 MiB) and the trim threshold to
  twice that; the heap top is given back (systrim) when it exceeds the trim threshold.
Resident = heap extent + mapped chunks. benchmarks/glibc_fidelity.py checks this against the real
glibc replaying the same allocations.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict

from trainmem.alloc.gc_paused import gc_paused
from trainmem.alloc.device_events import DeviceEvent, live_after

ALIGNMENT = 64  # c10's posix_memalign alignment
PAGE = 4096
MINSIZE = 32
SIZE_SZ = 8
TOP_PAD = 128 * 1024  # DEFAULT_TOP_PAD
MMAP_THRESHOLD_START = 128 * 1024  # DEFAULT_MMAP_THRESHOLD_MIN
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # DEFAULT_MMAP_THRESHOLD_MAX: 4 * 1024 * 1024 * sizeof(long)
MAX_FAST = 128  # DEFAULT_MXFAST: 64 * SIZE_SZ / 4
TCACHE_MAX_CHUNK = 1040  # chunk size of the last tcache bin (64 bins of 16 B from 32 B)
TCACHE_COUNT = 7
CONSOLIDATION_THRESHOLD = 65536
MIN_LARGE_SIZE = 1024
_ADDRESS_BITS = 56  # heap offsets stay below 2**56 (64 PiB)
_ADDRESS_MASK = (1 << _ADDRESS_BITS) - 1


def request_to_chunk(nbytes: int) -> int:
    """request2size: the request plus the size field, rounded up to 16 B, at least MINSIZE."""
    return max(MINSIZE, (nbytes + SIZE_SZ + 15) & ~15)


def aligned(nbytes: int) -> int:
    return (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclasses.dataclass
class TensorReplay:
    peak_bytes: int
    peak_index: int  # index into the stream of the event that reached the peak
    live_at_peak: dict[int, DeviceEvent]  # key -> its alloc event
    final_bytes: int


def replay_tensors(stream: list[DeviceEvent]) -> TensorReplay:
    """Live tensor bytes through the stream: the peak, where it is, and what is alive there."""
    live: set[int] = set()
    current = peak = peak_index = 0
    for index, event in enumerate(stream):
        if event.action == "alloc":
            live.add(event.key)
            current += aligned(event.nbytes)
            if current > peak:
                peak, peak_index = current, index
        elif event.key in live:
            live.discard(event.key)
            current -= aligned(event.nbytes)
    return TensorReplay(peak, peak_index, live_after(stream, peak_index), current)


class GlibcModel:
    """glibc malloc's main arena, as far as the resident footprint goes. Addresses are offsets in a
    virtual heap [0, brk); chunk addresses satisfy glibc's alignment (mem = chunk + 16)."""

    def __init__(self, pinned: bool = False) -> None:
        # pinned: every freed heap chunk has a live object above it, as the runtime's small objects can
        # leave one: nothing merges into the top and the heap is never trimmed (the high bound)
        self.pinned = pinned
        self.mmap_threshold = MMAP_THRESHOLD_START
        self.trim_threshold = 2 * MMAP_THRESHOLD_START
        self.top_start = 0  # first byte of the top chunk; the heap is [0, brk)
        self.brk = 0
        self.mapped = 0
        # binned free chunks, sorted by (size, address) packed into one int (size << _ADDRESS_BITS | address):
        # bisecting ints is faster than bisecting tuples, and the order is the same
        self.free_sizes: list[int] = []
        self.free_at: dict[int, int] = {}  # address -> size
        self.free_ending: dict[int, int] = {}  # end address -> start address
        self.fastbins: dict[int, int] = {}  # address -> size: free, but not coalesced until consolidation
        self.fast_by_size: dict[int, list[int]] = defaultdict(list)  # the same chunks per size, in free order
        self.tcache: dict[int, list[int]] = defaultdict(list)  # chunk size -> addresses (never coalesced)
        self.chunks: dict[int, tuple[str, int, int]] = {}  # key -> ("heap"|"mmap", address, size)
        self.peak_resident = 0

    def resident(self) -> int:
        return self.brk + self.mapped

    # The methods below run once per malloc and free of a replay (millions for a large model's long run): sizes are
    # rounded inline (request_to_chunk's arithmetic) and the bins' bookkeeping is written out where it is used,
    # which keeps CPython's call overhead out of the inner loop. The behaviour is the docstrings' and the module's.

    def malloc(self, key: int, nbytes: int, alignment: int = ALIGNMENT) -> None:
        """posix_memalign(alignment, nbytes), as _int_memalign does it."""
        nb = (nbytes + SIZE_SZ + 15) & ~15
        if nb < MINSIZE:
            nb = MINSIZE
        kind, address, size = self._int_malloc((nb + alignment + MINSIZE + SIZE_SZ + 15) & ~15)
        if kind == "heap":
            lead = -(address + 2 * SIZE_SZ) % alignment  # the user pointer is 16 B past the chunk
            if 0 < lead < MINSIZE:
                lead += alignment
            if lead:
                self._int_free(address, lead)
                address, size = address + lead, size - lead
            if size > nb + MINSIZE:
                self._int_free(address + nb, size - nb)
                size = nb
        self.chunks[key] = (kind, address, size)
        resident = self.brk + self.mapped
        if resident > self.peak_resident:
            self.peak_resident = resident

    def malloc_plain(self, key: int, nbytes: int) -> None:
        """malloc(nbytes): the tcache, then a fastbin of the exact size, then _int_malloc. The C++ and
        Python runtime allocate this way (benchmarks/glibc_fidelity.py replays them)."""
        nb = (nbytes + SIZE_SZ + 15) & ~15
        if nb < MINSIZE:
            nb = MINSIZE
        cached = self.tcache.get(nb)
        if cached:
            self.chunks[key] = ("heap", cached.pop(), nb)
            return
        if nb <= MAX_FAST:  # fastbins are LIFO per size
            same = self.fast_by_size.get(nb)
            if same:
                exact = same.pop()
                del self.fastbins[exact]
                self.chunks[key] = ("heap", exact, nb)
                return
        self.chunks[key] = self._int_malloc(nb)
        resident = self.brk + self.mapped
        if resident > self.peak_resident:
            self.peak_resident = resident

    def free(self, key: int) -> None:
        kind, address, size = self.chunks.pop(key)
        if kind == "mmap":
            self.mapped -= size
            if self.mmap_threshold < size <= MMAP_THRESHOLD_MAX:
                self.mmap_threshold, self.trim_threshold = size, 2 * size
            return
        self._int_free(address, size)

    def _int_malloc(self, nb: int) -> tuple[str, int, int]:
        if nb >= MIN_LARGE_SIZE and self.fastbins:
            self._consolidate()
        free_sizes = self.free_sizes
        index = bisect.bisect_left(free_sizes, nb << _ADDRESS_BITS)
        if index < len(free_sizes):  # best fit; the remainder stays free
            packed = free_sizes.pop(index)
            size, address = packed >> _ADDRESS_BITS, packed & _ADDRESS_MASK
            del self.free_at[address]
            del self.free_ending[address + size]
            if size - nb >= MINSIZE:  # _add_free of the remainder
                rest, rest_size = address + nb, size - nb
                bisect.insort(free_sizes, rest_size << _ADDRESS_BITS | rest)
                self.free_at[rest] = rest_size
                self.free_ending[rest + rest_size] = rest
                size = nb
            return "heap", address, size
        if self.brk - self.top_start >= nb + MINSIZE:
            self.top_start += nb
            return "heap", self.top_start - nb, nb
        if self.fastbins:
            self._consolidate()
            return self._int_malloc(nb)
        if nb >= self.mmap_threshold:  # sysmalloc: a mapping of its own
            size = (nb + SIZE_SZ + PAGE - 1) // PAGE * PAGE
            self.mapped += size
            return "mmap", 0, size
        grow = nb + TOP_PAD + MINSIZE - (self.brk - self.top_start)
        self.brk += (grow + PAGE - 1) // PAGE * PAGE
        self.top_start += nb
        return "heap", self.top_start - nb, nb

    def _int_free(self, address: int, size: int) -> None:
        if size <= TCACHE_MAX_CHUNK:
            cached = self.tcache[size]
            if len(cached) < TCACHE_COUNT:
                cached.append(address)  # only a plain malloc of this size takes it back
                return
        if size <= MAX_FAST:
            self.fastbins[address] = size
            self.fast_by_size[size].append(address)
            return
        merged = self._coalesce(address, size)
        if merged >= CONSOLIDATION_THRESHOLD:
            if self.fastbins:
                self._consolidate()
            top = self.brk - self.top_start
            if top >= self.trim_threshold and not self.pinned:  # systrim
                extra = (top - TOP_PAD - MINSIZE - 1) // PAGE * PAGE
                self.brk -= max(extra, 0)

    def _coalesce(self, address: int, size: int) -> int:
        """Merge with free neighbours, into the top when it borders it; returns the merged size."""
        free_at, free_ending, free_sizes = self.free_at, self.free_ending, self.free_sizes
        after = free_at.pop(address + size, None)
        if after is not None:  # _remove_free of the chunk above
            del free_ending[address + size + after]
            del free_sizes[bisect.bisect_left(free_sizes, after << _ADDRESS_BITS | (address + size))]
            size += after
        before = free_ending.pop(address, None)
        if before is not None:  # _remove_free of the chunk below
            below = free_at.pop(before)
            del free_sizes[bisect.bisect_left(free_sizes, below << _ADDRESS_BITS | before)]
            size += below
            address = before
        if address + size == self.top_start and not self.pinned:
            self.top_start = address
        else:  # _add_free
            bisect.insort(free_sizes, size << _ADDRESS_BITS | address)
            free_at[address] = size
            free_ending[address + size] = address
        return size

    def _consolidate(self) -> None:
        chunks, self.fastbins = sorted(self.fastbins.items()), {}
        self.fast_by_size.clear()
        for address, size in chunks:
            self._coalesce(address, size)

    def _add_free(self, address: int, size: int) -> None:
        bisect.insort(self.free_sizes, size << _ADDRESS_BITS | address)
        self.free_at[address] = size
        self.free_ending[address + size] = address

    def _remove_free(self, address: int) -> int:
        size = self.free_at.pop(address)
        del self.free_ending[address + size]
        self.free_sizes.pop(bisect.bisect_left(self.free_sizes, size << _ADDRESS_BITS | address))
        return size


def replay_actions(actions, pinned: bool = False) -> int:
    """Peak resident bytes for tensors and runtime objects interleaved (alloc/small_objects.py):
    tensors and 64-byte-aligned objects through posix_memalign, the rest through malloc."""
    return replay_growth(actions, {}, pinned)[0]


def replay_growth(actions, marks: dict[int, object], pinned: bool = False) -> tuple[int, dict[object, int]]:
    """replay_actions, and the peak so far just before each mark (action index -> label): one replay of a long
    run gives the peak of every shorter run that is a prefix of it (alloc/steady_state.py)."""
    model = GlibcModel(pinned)
    seen: dict[object, int] = {}
    start = 0
    with gc_paused():
        for index in sorted(marks):
            _advance(model, actions[start:index])
            seen[marks[index]] = model.peak_resident
            start = index
        _advance(model, actions[start:])
    return model.peak_resident, seen


def _advance(model: GlibcModel, actions) -> None:
    chunks, tcache = model.chunks, model.tcache
    malloc, malloc_plain, free = model.malloc, model.malloc_plain, model.free
    for action, key, nbytes, aligned, transient in actions:
        if action == "free":
            if key in chunks:
                free(key)
            continue
        if aligned:
            malloc(key, nbytes)
        else:
            if transient:
                nb = (nbytes + SIZE_SZ + 15) & ~15
                if tcache.get(nb if nb > MINSIZE else MINSIZE):
                    continue  # malloc pops a tcache chunk and free pushes it back: nothing changes
            malloc_plain(key, nbytes)
        if transient:
            free(key)


def replay_resident(stream: list[DeviceEvent]) -> int:
    """Peak bytes glibc keeps resident for the stream's tensors (heap extent + mapped chunks)."""
    model = GlibcModel()
    for event in stream:
        if event.action == "alloc":
            model.malloc(event.key, event.nbytes)
        elif event.key in model.chunks:
            model.free(event.key)
    return model.peak_resident
