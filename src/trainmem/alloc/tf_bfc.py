"""TensorFlow's BFC ("best-fit with coalescing") GPU allocator, replayed in pure Python (no TensorFlow).

Rules followed, from xla/tsl/framework/bfc_allocator.{h,cc} (tensorflow/tensorflow, the copy under
third_party/xla that TensorFlow 2.16-2.21 build; the classic path, without the newer spatial
partitioning, which GPUBFCAllocator never turns on):
- RoundedBytes: a request is rounded up to a multiple of kMinAllocationSize = 1 << kMinAllocationBits
  = 256 B; every chunk is a multiple of 256 B.
- BinNumForSize: 21 bins (kNumBins); bin b holds free chunks of size >= 256 << b (the last bin, 256 MiB
  and up, holds everything larger): b = min(20, floor(log2(max(size, 256) >> 8))). A bin's free chunks
  are ordered by size, then address (Bin::ChunkComparator).
- FindChunkPtr: from the request's bin upwards, the first free chunk with size >= the rounded request:
  the smallest that fits, the lowest address among equals. AllocateChunkFromLowEnd splits it only when
  `chunk->size >= rounded_bytes * 2 || chunk->size - rounded_bytes >= max_internal_fragmentation_bytes_`
  (128 << 20 unless Options::fragmentation_fraction > 0, then that fraction of the memory limit); an
  unsplit chunk is charged whole to bytes_in_use.
- DeallocateRawInternal / TryToCoalesce: a freed chunk merges with a free next neighbour, then with a
  free previous one, inside its region (regions of the GPU's DeviceMemAllocator are never joined:
  SubAllocator::SupportsCoalescing is false for it, so AddAllocationRegion, not AddOrExtend...).
- Extend: when no free chunk fits, a new region of max(rounded request, curr_region_allocation_bytes_)
  bytes (the region size doubles until the request fits; after an extension that did not need doubling
  it doubles once for the next one), capped by what is left of the memory limit (rounded down to 256 B);
  refused outright when the request exceeds that. The constructor starts curr_region_allocation_bytes_
  at RoundedBytes(min(limit, 2 MiB)) with allow_growth and at RoundedBytes(limit) without, so without
  growth the first allocation maps the whole limit in one region. If the sub-allocator fails, Extend
  retries with 0.9x (kBackpedalFactor) down to the request.
- AllocateRawInternal: find, else Extend and find, else (Options::garbage_collection)
  DeallocateFreeRegions — give back every region with no chunk in use, if the request then fits the
  limit — and Extend and find again; else out of memory. GPUBFCAllocator turns garbage collection on
  unless TF_ENABLE_GPU_GARBAGE_COLLECTION=false (gpu_bfc_allocator.cc GetGarbageCollectionValue).
- Stats (FinishChunkAllocation, MarkFree, Extend): bytes_in_use counts chunk sizes; peak_bytes_in_use its
  maximum; largest_alloc_size the largest chunk handed out; pool_bytes / peak_pool_bytes what the regions
  hold (stats_.bytes_reserved is not used by this allocator: it stays 0).
  tf.config.experimental.get_memory_info(device) returns {"current": bytes_in_use, "peak":
  peak_bytes_in_use} (tensorflow/python/tfe_wrapper.cc TFE_GetMemoryInfo).
Not modelled: timestamped chunks (GPUOptions.Experimental.timestamped_allocator, off by default), the
retry helper's wait for other threads' frees (a replayed stream has no concurrent frees), alignment
above 256 B (every chunk starts on a 256-B boundary, so LowEndAlignmentPadding is 0 for TF's 64-B tensors).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterable

from trainmem.alloc.replay import live_before
from trainmem.alloc.device_events import DeviceEvent
from trainmem.trace.events import Category

MiB = 1 << 20
K_MIN_ALLOCATION_BITS = 8  # bfc_allocator.h kMinAllocationBits
K_MIN_ALLOCATION_SIZE = 1 << K_MIN_ALLOCATION_BITS  # 256 B
K_NUM_BINS = 21  # bfc_allocator.h kNumBins: "the largest bin'd chunk size is 256 << 21 = 512MB"
DEFAULT_MAX_INTERNAL_FRAGMENTATION = 128 << 20  # BFCAllocator ctor: 128 MiB unless fragmentation_fraction > 0
GROWTH_INITIAL_REGION = 2 << 20  # BFCAllocator ctor: "2MiB smallest initial allocation" with allow_growth
BACKPEDAL_FACTOR = 0.9  # Extend: kBackpedalFactor when the sub-allocator fails
_REGION_GAP = 1 << 40  # address distance between regions: cuMemAlloc ranges are never adjacent here


def rounded_bytes(nbytes: int) -> int:
    """BFCAllocator::RoundedBytes: up to a multiple of 256 B (0 stays 0; AllocateRaw refuses 0 B)."""
    return K_MIN_ALLOCATION_SIZE * ((nbytes + K_MIN_ALLOCATION_SIZE - 1) // K_MIN_ALLOCATION_SIZE)


def bin_num_for_size(nbytes: int) -> int:
    """BFCAllocator::BinNumForSize: min(kNumBins - 1, Log2Floor(max(bytes, 256) >> 8))."""
    return min(K_NUM_BINS - 1, (max(nbytes, K_MIN_ALLOCATION_SIZE) >> K_MIN_ALLOCATION_BITS).bit_length() - 1)


def bin_size(index: int) -> int:
    """BinNumToSize: the smallest chunk bin `index` holds."""
    return K_MIN_ALLOCATION_SIZE << index


@dataclasses.dataclass(frozen=True)
class BfcConfig:
    """What GPUBFCAllocator is built with (gpu_process_state.cc GetGPUAllocator).

    memory_limit: the device's memory limit (total_memory of the BFCAllocator ctor);
    allow_growth: GPUOptions.allow_growth / set_memory_growth (config.proto default false);
    garbage_collection: on unless TF_ENABLE_GPU_GARBAGE_COLLECTION=false;
    fragmentation_fraction: GPUOptions.Experimental.internal_fragmentation_fraction (default 0);
    device_free: what cuMemAlloc can still hand out (None: at least the limit) — past it Extend backpedals."""

    memory_limit: int
    allow_growth: bool = False
    garbage_collection: bool = True
    fragmentation_fraction: float = 0.0
    device_free: int | None = None

    @property
    def max_internal_fragmentation(self) -> int:
        if self.fragmentation_fraction > 0.0:
            return int(self.fragmentation_fraction * self.memory_limit)
        return DEFAULT_MAX_INTERNAL_FRAGMENTATION


@dataclasses.dataclass(eq=False)
class _Chunk:
    ptr: int
    size: int
    region: int  # base address of its region
    requested: int = 0
    in_use: bool = False
    prev: _Chunk | None = None
    next: _Chunk | None = None


@dataclasses.dataclass
class BfcStats:
    """AllocatorStats as BFCAllocator::GetStats fills it."""

    num_allocs: int = 0
    bytes_in_use: int = 0
    peak_bytes_in_use: int = 0
    largest_alloc_size: int = 0
    pool_bytes: int = 0
    peak_pool_bytes: int = 0
    bytes_limit: int = 0
    bytes_reserved: int = 0  # not used by the BFC allocator


class BfcOutOfMemory(Exception):
    """AllocateRaw returned nullptr: TensorFlow raises ResourceExhaustedError ("OOM when allocating …")."""


class BfcAllocator:
    """One BFCAllocator. `allocate(nbytes) -> handle` (the chunk's address), `free(handle)`, `stats`."""

    def __init__(self, config: BfcConfig) -> None:
        self.config = config
        first = min(config.memory_limit, GROWTH_INITIAL_REGION) if config.allow_growth else config.memory_limit
        self.curr_region_allocation_bytes = rounded_bytes(first)
        self.stats = BfcStats(bytes_limit=config.memory_limit)
        self._bins: list[list[tuple[int, int]]] = [[] for _ in range(K_NUM_BINS)]  # (size, ptr) sorted
        self._free: dict[int, _Chunk] = {}  # ptr -> free chunk
        self._used: dict[int, _Chunk] = {}  # ptr -> chunk in use
        self.regions: dict[int, int] = {}  # base -> size, regions held now
        self.region_history: list[int] = []  # size of every region obtained, in order (each a cuMemAlloc)
        self.garbage_collections = 0  # DeallocateFreeRegions calls that released something
        self._next_base = _REGION_GAP

    # ---- public

    def allocate(self, nbytes: int) -> int:
        """AllocateRawInternal; raises BfcOutOfMemory where TensorFlow gets nullptr."""
        if nbytes <= 0:
            raise ValueError(f"expected a request of at least 1 byte, got {nbytes} (AllocateRaw refuses 0)")
        rounded = rounded_bytes(nbytes)
        chunk = self._find_chunk(rounded, nbytes)
        if chunk is None and self._extend(rounded):
            chunk = self._find_chunk(rounded, nbytes)
        if chunk is None and self._deallocate_free_regions(rounded) and self._extend(rounded):
            chunk = self._find_chunk(rounded, nbytes)
        if chunk is None:
            raise BfcOutOfMemory(self._oom_message(nbytes, rounded))
        return chunk.ptr

    def free(self, handle: int) -> None:
        """DeallocateRawInternal: MarkFree, then TryToCoalesce with the neighbours, then back into a bin."""
        chunk = self._used.pop(handle)
        chunk.in_use = False
        self.stats.bytes_in_use -= chunk.size
        if chunk.next is not None and not chunk.next.in_use:  # TryToCoalesce: the next neighbour first,
            self._remove_free(chunk.next)
            chunk = self._merge(chunk, chunk.next)
        if chunk.prev is not None and not chunk.prev.in_use:  # then the previous one
            self._remove_free(chunk.prev)
            chunk = self._merge(chunk.prev, chunk)
        self._insert_free(chunk)

    def chunk_size(self, handle: int) -> int:
        """AllocatedSize: the chunk behind a live handle (>= the rounded request when not split)."""
        return self._used[handle].size

    def largest_free_chunk(self) -> int:
        return max((bin_[-1][0] for bin_ in self._bins if bin_), default=0)

    def chunks(self) -> list[list[tuple[int, bool]]]:
        """(size, in use) of every chunk, region by region in address order (for tests and dumps)."""
        out = []
        for base in sorted(self.regions):
            row, chunk = [], self._chunk_at(base)
            while chunk is not None:
                row.append((chunk.size, chunk.in_use))
                chunk = chunk.next
            out.append(row)
        return out

    # ---- FindChunkPtr / split

    def _find_chunk(self, rounded: int, nbytes: int) -> _Chunk | None:
        for index in range(bin_num_for_size(rounded), K_NUM_BINS):
            bin_ = self._bins[index]
            at = bisect.bisect_left(bin_, (rounded, -1))
            if at < len(bin_):
                chunk = self._free[bin_[at][1]]
                self._remove_free(chunk)
                if chunk.size >= 2 * rounded or chunk.size - rounded >= self.config.max_internal_fragmentation:
                    self._split(chunk, rounded)
                chunk.in_use, chunk.requested = True, nbytes
                self._used[chunk.ptr] = chunk
                self._note_alloc(chunk.size)
                return chunk
        return None

    def _split(self, chunk: _Chunk, nbytes: int) -> None:
        """SplitChunk: a new free chunk for the tail; it is inserted without coalescing (its next
        neighbour was the free chunk's neighbour, so it is in use or absent)."""
        tail = _Chunk(chunk.ptr + nbytes, chunk.size - nbytes, chunk.region, prev=chunk, next=chunk.next)
        if chunk.next is not None:
            chunk.next.prev = tail
        chunk.next, chunk.size = tail, nbytes
        self._insert_free(tail)

    def _note_alloc(self, size: int) -> None:
        s = self.stats
        s.num_allocs += 1
        s.bytes_in_use += size
        s.peak_bytes_in_use = max(s.peak_bytes_in_use, s.bytes_in_use)
        s.largest_alloc_size = max(s.largest_alloc_size, size)

    # ---- regions

    def _extend(self, rounded: int) -> bool:
        """BFCAllocator::Extend."""
        available = (self.config.memory_limit - self.stats.pool_bytes) // K_MIN_ALLOCATION_SIZE * K_MIN_ALLOCATION_SIZE
        if rounded > available:
            return False
        increased = False
        while rounded > self.curr_region_allocation_bytes:
            self.curr_region_allocation_bytes *= 2
            increased = True
        size = self._sub_allocate(min(self.curr_region_allocation_bytes, available), rounded)
        if size is None:
            return False
        if not increased:
            self.curr_region_allocation_bytes *= 2
        base, self._next_base = self._next_base, self._next_base + _REGION_GAP
        self.regions[base] = size
        self.region_history.append(size)
        self.stats.pool_bytes += size
        self.stats.peak_pool_bytes = max(self.stats.peak_pool_bytes, self.stats.pool_bytes)
        self._insert_free(_Chunk(base, size, base))
        return True

    def _sub_allocate(self, size: int, rounded: int) -> int | None:
        """DeviceMemAllocator::Alloc (cuMemAlloc), which fails past `device_free`; Extend then backs off
        to RoundedBytes(bytes * 0.9) until the request no longer fits."""
        free = self.config.device_free
        while free is not None and size > free - self.stats.pool_bytes:
            size = rounded_bytes(int(size * BACKPEDAL_FACTOR))
            if size < rounded:
                return None
        return size

    def _deallocate_free_regions(self, rounded: int) -> bool:
        """DeallocateFreeRegions: with garbage collection on, give back every region without a chunk in
        use when the limit then has room for the request."""
        if not self.config.garbage_collection:
            return False
        idle = [base for base, size in self.regions.items() if self._chunk_at(base).size == size
                and not self._chunk_at(base).in_use]
        total = sum(self.regions[base] for base in idle)
        if total == 0 or rounded > self.config.memory_limit - self.stats.pool_bytes + total:
            return False
        for base in idle:
            self._remove_free(self._chunk_at(base))
            self.stats.pool_bytes -= self.regions.pop(base)
        self.garbage_collections += 1
        return True

    # ---- bins

    def _chunk_at(self, ptr: int) -> _Chunk:
        return self._free.get(ptr) or self._used[ptr]

    def _insert_free(self, chunk: _Chunk) -> None:
        bisect.insort(self._bins[bin_num_for_size(chunk.size)], (chunk.size, chunk.ptr))
        self._free[chunk.ptr] = chunk

    def _remove_free(self, chunk: _Chunk) -> None:
        bin_ = self._bins[bin_num_for_size(chunk.size)]
        del bin_[bisect.bisect_left(bin_, (chunk.size, chunk.ptr))]
        del self._free[chunk.ptr]

    @staticmethod
    def _merge(first: _Chunk, second: _Chunk) -> _Chunk:
        """MergeChunks: `second` (first.next) joins `first`."""
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    def _oom_message(self, nbytes: int, rounded: int) -> str:
        s = self.stats
        return (f"allocator ran out of memory trying to allocate {nbytes:,} B (rounded to {rounded:,}); "
                f"{s.bytes_in_use:,} B in use, pool {s.pool_bytes:,} B of limit {s.bytes_limit:,} B, "
                f"largest free chunk {self.largest_free_chunk():,} B")


# ---- replaying a target's stream


@dataclasses.dataclass(frozen=True)
class BfcReplay:
    """One stream through one BFCAllocator: what get_memory_info and the regions show.

    peak_in_use: get_memory_info()["peak"] (chunk bytes); peak_index: the stream event after which it was
    first reached; region_bytes: what the regions hold at the end; peak_region_bytes: their most (what the
    process got from cuMemAlloc); region_history: every region's size in order; live_at_peak: chunk bytes
    in use at the peak by category (they sum to peak_in_use); requested_at_peak: the bytes asked for;
    out_of_memory: the failing request in words (the figures are then those up to it)."""

    peak_in_use: int
    peak_index: int
    region_bytes: int
    peak_region_bytes: int
    region_history: tuple[int, ...]
    live_at_peak: dict[Category, int]
    requested_at_peak: dict[Category, int]
    live_events: dict[int, DeviceEvent]  # key -> alloc event of each chunk in use at the peak
    tensor_peak: int  # peak of the bytes requested (before rounding)
    largest_alloc_size: int
    garbage_collections: int
    zero_byte_requests: int  # TensorFlow allocates no buffer for an empty tensor
    out_of_memory: str | None = None
    optional_failed: int = 0  # optional requests (scratch that may fail) the allocator could not serve


def replay_bfc(events: Iterable[DeviceEvent], config: BfcConfig,
               optional: Callable[[DeviceEvent], bool] | None = None) -> BfcReplay:
    """Replay alloc/free events (by key) through a BFCAllocator built with `config`. A free of a key
    never allocated is ignored, as the CUDA replay does; the replay stops at the first failed request,
    unless `optional(event)` says the request may fail (AllocationAttributes.retry_on_failure false: TF's
    convolution scratch, whose failure only skips an algorithm): it is then counted and skipped.
    The live set at the peak is rebuilt at the end by undoing the changes made since the peak."""
    allocator = BfcAllocator(config)
    handles: dict[int, int] = {}
    live: dict[int, tuple[DeviceEvent, int]] = {}  # key -> (alloc event, chunk size)
    since_peak: list[tuple[int, tuple[DeviceEvent, int] | None]] = []
    requested = tensor_peak = peak_index = zero = skipped = 0
    best, failure = -1, None
    for index, event in enumerate(events):
        if event.action != "alloc":
            if event.key in handles:
                allocator.free(handles.pop(event.key))
                since_peak.append((event.key, live.pop(event.key)))
                requested -= since_peak[-1][1][0].nbytes  # type: ignore[index]
            continue
        if event.nbytes <= 0:
            zero += 1
            continue
        try:
            handle = allocator.allocate(event.nbytes)
        except BfcOutOfMemory as error:
            if optional is not None and optional(event):
                skipped += 1
                continue
            failure = f"OOM when allocating {event.nbytes:,} B for {_where(event)}: {error}"
            break
        handles[event.key] = handle
        since_peak.append((event.key, live.get(event.key)))
        live[event.key] = (event, allocator.chunk_size(handle))
        requested += event.nbytes
        tensor_peak = max(tensor_peak, requested)
        if allocator.stats.bytes_in_use > best:
            best, peak_index = allocator.stats.bytes_in_use, index
            since_peak.clear()
    result = _result(allocator, live_before(live, since_peak), peak_index, tensor_peak, zero, failure)
    return dataclasses.replace(result, optional_failed=skipped)


def _where(event: DeviceEvent) -> str:
    where = f"op {event.op}" + (f" in {event.module}" if event.module else "")
    return f"{where} ({event.phase}, {event.category})"


def _result(allocator: BfcAllocator, at_peak: dict, peak_index: int, tensor_peak: int, zero: int,
            failure: str | None) -> BfcReplay:
    chunks: dict[Category, int] = {}
    asked: dict[Category, int] = {}
    for event, size in at_peak.values():
        chunks[event.category] = chunks.get(event.category, 0) + size
        asked[event.category] = asked.get(event.category, 0) + event.nbytes
    s = allocator.stats
    return BfcReplay(s.peak_bytes_in_use, peak_index, s.pool_bytes, s.peak_pool_bytes,
                     tuple(allocator.region_history), chunks, asked,
                     {key: event for key, (event, _size) in at_peak.items()}, tensor_peak,
                     s.largest_alloc_size, allocator.garbage_collections, zero, failure)
