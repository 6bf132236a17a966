"""PyTorch's CUDA caching allocator, replayed in pure Python (no torch, no GPU).

Rules followed, from c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator, PyTorch 2.x up to the
2.13/2.14 line) and its settings in c10/core/AllocatorConfig.{h,cpp} and c10/cuda/CUDAAllocatorConfig.h:
- round_size: < 512 B -> 512 B; else a multiple of 512 B, or, when the size's interval (1 MiB .. 64 GiB
  in 16 power-of-two steps; sizes < 2 MiB use the first, >= 32 GiB the last) has d > 1 divisions and
  size > 512 * d, the next 1/d step between powers of two (roundup_power2_next_division).
- get_pool: a rounded size <= 1 MiB (kSmallSize) goes to the small pool, else the large one.
- get_allocation_size: a new segment is 2 MiB (kSmallBuffer) for the small pool, large_segment_size
  (20 MiB, kLargeBuffer, by default) below 10 MiB (kMinLargeAlloc), else the size rounded up to 2 MiB.
- get_free_block: best fit among free blocks ordered (stream, size, address), so only the request's own
  stream is searched; a block >= max_split_size is refused to a request below it, and a request at or
  above it refuses blocks >= request + max_non_split_rounding_size (20 MiB by default).
- should_split: small pool (or expandable segments): the remainder >= 512 B; large pool: request <
  max_split_size and remainder > 1 MiB. Otherwise the whole block is allocated and counted.
- free_block / try_merge_blocks: a freed block merges with free neighbours of its segment.
- malloc: cache -> garbage_collect_cached_blocks (only with a memory fraction and a GC threshold) ->
  alloc_block -> release_available_cached_blocks (oversize blocks of this stream, only with
  max_split_size set) + retry -> release_cached_blocks (every unsplit free segment) + retry -> OOM.
- expandable segments (find_expandable_block, try_allocate_expandable_block, map_block, unmap_block):
  one virtual range per (stream, pool), mapped in 2 MiB pages (small) or large_segment_size pages
  (large); a request is carved at the lowest address with enough free + unmapped room; releasing
  unmaps only whole free pages (empty_cache / OOM retry).
Not modelled: cross-stream record_stream events, CUDA graph / MemPool private pools, cudaMallocAsync.
Addresses are a bump allocator (cudaMalloc may reuse freed ranges; only best-fit ties depend on it).

History (torch.cuda.memory._record_memory_history): given a `history` list, the allocator appends one
(action, addr, size, stream) tuple where DeviceCachingAllocator calls record_trace: "alloc" (the
request's own size, orig_size), "free_requested" and "free_completed" (the block's requested_size; no
record_stream here, so both at once), "segment_alloc" / "segment_free" (cudaMalloc / cudaFree of a
segment), "segment_map" / "segment_unmap" (pages of an expandable segment) and "oom" (addr: the device's
free bytes, size: the rounded request). Recording changes nothing else (report/memviz.py reads it).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import TYPE_CHECKING
from collections.abc import Iterable

from trainmem.alloc.cuda_config import K_MIN_LARGE_ALLOC, SIZE_MAX, MiB, power_of_two
from trainmem.alloc.cuda_config import AllocatorConfig  # noqa: F401 - part of this module's API
from trainmem.alloc.cuda_stats import STAT_NAMES, BlockInfo, Fragmentation, SegmentInfo, SegmentSummary, Stat
from trainmem.errors import TrainmemError

if TYPE_CHECKING:
    from trainmem.alloc.device_events import DeviceEvent

DEFAULTS = AllocatorConfig()  # PyTorch's defaults (no PYTORCH_CUDA_ALLOC_CONF); frozen, so one instance serves all

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize
K_SMALL_SIZE = MiB  # kSmallSize: largest small-pool request
K_SMALL_BUFFER = 2 * MiB  # kSmallBuffer: small segment and small expandable page
K_ROUND_LARGE = 2 * MiB  # kRoundLarge
UNBOUNDED_VA = 1 << 40  # virtual range of an expandable segment when no capacity is given


class CudaOutOfMemoryError(TrainmemError):
    """torch.OutOfMemoryError: no cached block fits and the device cannot back a new one."""


# ------------------------------------------------------------------------------------ size rules


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """The next of the d equal steps between the powers of two around size (1200, d=4 -> 1280)."""
    if power_of_two(size):
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    return size if size % step == 0 else size - size % step + step


def round_size(size: int, config: AllocatorConfig = DEFAULTS) -> int:
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = config.divisions(size)
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(size, divisions)
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def get_allocation_size(size: int, config: AllocatorConfig = DEFAULTS) -> int:
    """The cudaMalloc size for a rounded request that no cached block serves."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return config.large_segment_size
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


# ----------------------------------------------------------------------------------- state types


@dataclasses.dataclass(eq=False, slots=True)
class _Segment:
    base: int
    page: int = 0  # mapping page of an expandable segment; 0 for a cudaMalloc'd one

    @property
    def expandable(self) -> bool:
        return self.page > 0


@dataclasses.dataclass(eq=False, slots=True)
class _Block:
    addr: int
    size: int
    stream: int
    small: bool
    segment: _Segment = dataclasses.field(repr=False)
    mapped: bool = True
    allocated: bool = False
    prev: _Block | None = dataclasses.field(default=None, repr=False)
    next: _Block | None = dataclasses.field(default=None, repr=False)
    requested: int = 0
    key: object = None
    gc_base: int = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before: _Block | None, after: _Block | None) -> None:
        """Insert self between two neighbours (Block::splice)."""
        if before:
            before.next = self
        if after:
            after.prev = self
        self.prev, self.next = before, after


@dataclasses.dataclass
class _Pool:
    """A BlockPool: free mapped blocks per stream as sorted (size, addr), unmapped ones by addr."""

    small: bool
    free: dict[int, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    unmapped: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    gc_calls: int = 0  # get_free_blocks_call_count


# ------------------------------------------------------------------------------------- allocator


class CudaCachingAllocator:
    """One device's DeviceCachingAllocator. `capacity_bytes` is the memory cudaMalloc / cuMemCreate
    may hand out (the card minus the CUDA context and other processes); None means unlimited."""

    def __init__(self, config: AllocatorConfig = DEFAULTS, capacity_bytes: int | None = None,
                 *, snapshot_at_peak: bool = False, history: list | None = None) -> None:
        if config.backend != "native":
            raise ValueError(f"allocator backend {config.backend!r} is not modelled (only native)")
        self.config = config
        self.capacity = capacity_bytes
        # setMemoryFraction: a limit exists only for a fraction below 1 (allowed_memory_maximum).
        self.allowed: int | None = None
        if config.per_process_memory_fraction < 1.0:
            if capacity_bytes is None:
                raise ValueError("per_process_memory_fraction needs capacity_bytes")
            self.allowed = int(config.per_process_memory_fraction * capacity_bytes)
        self.pools = {True: _Pool(small=True), False: _Pool(small=False)}
        self.stats = {name: {t: Stat() for t in ("all", "small_pool", "large_pool")} for name in STAT_NAMES}
        # each stat's ("all", its pool's) pair by pool, and the two read after every malloc: one lookup each (_count)
        self._stat_pairs = {small: {name: (per["all"], per["small_pool" if small else "large_pool"])
                                    for name, per in self.stats.items()} for small in (True, False)}
        self._allocated_all = self.stats["allocated_bytes"]["all"]
        self._reserved_all = self.stats["reserved_bytes"]["all"]
        self.counters = dict.fromkeys(("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free"), 0)
        self.oversize_allocations, self.oversize_segments = Stat(), Stat()
        self.active: dict[object, _Block] = {}
        self._empty: set[object] = set()  # keys of zero-byte requests, which hold no block
        self._free_at: dict[int, _Block] = {}  # address -> free mapped block
        self._unmapped_at: dict[int, _Block] = {}  # address -> unmapped block of an expandable segment
        self._segments: list[_Segment] = []  # live expandable segments
        self._next_va = 1 << 32
        self.snapshot_at_peak = snapshot_at_peak
        self.peak_snapshot: list[SegmentInfo] = []
        self._at_alloc_peak = (0, 0)  # (allocated, reserved) when allocated peaked
        self._at_reserved_peak = (0, 0)
        self.history = history  # record_trace's entries as (action, addr, size, stream), or None

    # ---- public API

    def malloc(self, key: object, nbytes: int, stream: int = 0) -> None:
        """DeviceCachingAllocator::malloc for a request of nbytes on `stream`, remembered as `key`."""
        if self.holds(key):
            raise ValueError(f"malloc: key {key!r} is already allocated")
        if nbytes == 0:  # CUDACachingAllocator::allocate returns a null pointer without malloc
            self._empty.add(key)
            return
        size = round_size(nbytes, self.config)
        pool = self.pools[size <= K_SMALL_SIZE]
        alloc_size = get_allocation_size(size, self.config)
        block = self._get_free_block(pool, size, stream)
        if block is None:
            if self.allowed is not None and self.config.garbage_collection_threshold > 0.0:
                self._garbage_collect_cached_blocks()
            block = (self._alloc_block(pool, size, alloc_size, stream)
                     or (self._release_available_cached_blocks(pool, size, stream)
                         and self._alloc_block(pool, size, alloc_size, stream))
                     or (self._release_cached_blocks()
                         and self._alloc_block(pool, size, alloc_size, stream, retry=True)))
        if not block:
            self.counters["num_ooms"] += 1
            if self.history is not None:
                free = max((self.capacity or 0) - self.reserved_bytes, 0)  # cudaMemGetInfo's free bytes
                self.history.append(("oom", free, size, stream))
            raise CudaOutOfMemoryError(self._oom_message(alloc_size), where="cuda caching allocator")
        self._alloc_found_block(block, size, nbytes, key, self._should_split(block, size))
        if self.history is not None:
            self.history.append(("alloc", self.active[key].addr, nbytes, stream))
        self._note_peaks()

    def holds(self, key: object) -> bool:  # allocated and not freed (a zero-byte request too: it holds no block)
        return key in self.active or key in self._empty

    def free(self, key: object) -> None:
        """DeviceCachingAllocator::free: allocated drops now; the block returns to its pool."""
        if key in self._empty:
            self._empty.discard(key)
            return
        block = self.active.pop(key)
        block.allocated = False
        if self.history is not None:  # the block's address before _free_block merges it with its neighbours
            entry = (block.addr, block.requested, block.stream)
            self.history += [("free_requested", *entry), ("free_completed", *entry)]
        self._count(block.small, allocation=-1, allocated_bytes=-block.size)
        if block.size >= self.config.max_split_size:
            self.oversize_allocations.add(-1)
        self._free_block(block)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): release_cached_blocks."""
        self._release_cached_blocks()

    def reset_peak_stats(self) -> None:
        for per_type in self.stats.values():
            for stat in per_type.values():
                stat.peak = stat.current
        self._at_alloc_peak = self._at_reserved_peak = (self.allocated_bytes, self.reserved_bytes)

    @property
    def allocated_bytes(self) -> int:
        return self._allocated_all.current

    @property
    def reserved_bytes(self) -> int:
        return self._reserved_all.current

    @property
    def peak_allocated_bytes(self) -> int:
        """torch.cuda.max_memory_allocated()."""
        return self.stats["allocated_bytes"]["all"].peak

    @property
    def peak_reserved_bytes(self) -> int:
        """torch.cuda.max_memory_reserved()."""
        return self.stats["reserved_bytes"]["all"].peak

    @property
    def num_segments(self) -> int:
        """segment.all.current: cudaMalloc'd segments (expandable mappings are not counted there)."""
        return self.stats["segment"]["all"].current

    @property
    def fragmentation(self) -> Fragmentation:
        (a1, r1), (a2, r2) = self._at_alloc_peak, self._at_reserved_peak
        return Fragmentation(at_allocated_peak=r1 - a1, at_reserved_peak=r2 - a2)

    def memory_stats(self) -> dict[str, int]:
        """The keys of torch.cuda.memory_stats() that this model produces."""
        out: dict[str, int] = dict(self.counters)
        for name, per_type in self.stats.items():
            for kind, stat in per_type.items():
                for field in ("current", "peak", "allocated", "freed"):
                    out[f"{name}.{kind}.{field}"] = getattr(stat, field)
        for name, stat in (("oversize_allocations", self.oversize_allocations),
                           ("oversize_segments", self.oversize_segments)):
            for field in ("current", "peak", "allocated", "freed"):
                out[f"{name}.{field}"] = getattr(stat, field)
        out["max_split_size"] = -1 if self.config.max_split_size == SIZE_MAX else self.config.max_split_size
        return out

    def snapshot(self) -> list[SegmentInfo]:
        """torch.cuda.memory_snapshot(): each cudaMalloc'd segment, and each contiguous mapped range
        of an expandable segment, with its blocks in address order."""
        heads = [b for b in (*self._free_at.values(), *self.active.values()) if not (b.prev and b.prev.mapped)]
        return sorted((self._segment_info(head) for head in heads), key=lambda s: s.address)

    def segment_summary(self) -> SegmentSummary:
        """SegmentSummary.of(self.snapshot()) without walking the blocks: each cudaMalloc'd segment is one
        snapshot segment of its whole size, so the stats give it. Expandable segments list each
        contiguous mapped range apart, so with them the snapshot is walked."""
        if self._segments:
            return SegmentSummary.of(self.snapshot())
        reserved = self.stats["reserved_bytes"]
        return SegmentSummary(self.num_segments, reserved["large_pool"].current, reserved["small_pool"].current)

    # ---- malloc steps

    def _get_free_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        cfg = self.config
        if self.allowed is not None and cfg.garbage_collection_threshold > 0.0:
            pool.gc_calls += 1
        keys = pool.free.get(stream, [])
        i = bisect.bisect_left(keys, (size, -1))
        if i == len(keys):
            return None
        block = self._free_at[keys[i][1]]
        if block.segment.expandable:
            if not cfg.expandable_segments:  # expandable memory is only reused while the setting is on
                plain = (j for j in range(i, len(keys)) if not self._free_at[keys[j][1]].segment.expandable)
                i = next(plain, len(keys))
                if i == len(keys):
                    return None
                block = self._free_at[keys[i][1]]
            else:  # best fit counts what the block can still grow into (its unmapped neighbour)
                while block.segment.expandable and i + 1 < len(keys):
                    nxt = self._free_at[keys[i + 1][1]]
                    if _expandable_size(nxt) >= _expandable_size(block):
                        break
                    i, block = i + 1, nxt
        if size < cfg.max_split_size <= block.size:
            return None  # an oversize block is not cut up for a smaller request
        if size >= cfg.max_split_size and block.size >= size + cfg.max_non_split_rounding_size:
            return None
        self._remove_free(block)
        return block

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self.config.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.config.max_split_size and remaining > K_SMALL_SIZE

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int, stream: int, retry: bool = False) -> _Block | None:
        """cudaMalloc a new segment (or grow an expandable one); None when the device is full."""
        if retry:
            self.counters["num_alloc_retries"] += 1
        if self.allowed is not None and self.reserved_bytes + alloc_size > self.allowed:
            return None
        if self.config.expandable_segments:
            return self._try_allocate_expandable_block(pool, size, stream)
        if self.capacity is not None and self.reserved_bytes + alloc_size > self.capacity:
            return None
        addr = self._reserve_va(alloc_size)
        block = _Block(addr, alloc_size, stream, pool.small, _Segment(addr))
        self._count(pool.small, segment=1, reserved_bytes=alloc_size)
        self.counters["num_device_alloc"] += 1
        if self.history is not None:
            self.history.append(("segment_alloc", addr, alloc_size, stream))
        if alloc_size >= self.config.max_split_size:
            self.oversize_segments.add(1)
        return block

    def _alloc_found_block(self, block: _Block, size: int, orig: int, key: object, split: bool) -> None:
        """Hand out the front `size` bytes of block; a split leaves the rest free after it."""
        already_split = block.is_split()
        plain = not block.segment.expandable  # inactive_split excludes expandable segments
        if split:
            rest = block
            block = _Block(rest.addr, size, rest.stream, rest.small, rest.segment)
            block.splice(rest.prev, rest)
            rest.addr, rest.size = rest.addr + size, rest.size - size
            self._insert_free(rest)
            if already_split and plain:
                self._count(block.small, inactive_split_bytes=-size)
            elif plain:
                self._count(block.small, inactive_split_bytes=rest.size, inactive_split=1)
        elif already_split and plain:
            self._count(block.small, inactive_split_bytes=-block.size, inactive_split=-1)
        block.allocated, block.requested, block.key = True, orig, key
        self.active[key] = block
        self._count(block.small, allocation=1, allocated_bytes=block.size, active=1,
                    active_bytes=block.size, requested_bytes=orig)
        if block.size >= self.config.max_split_size:
            self.oversize_allocations.add(1)

    # ---- freeing and releasing

    def _free_block(self, block: _Block) -> None:
        orig_size, requested = block.size, block.requested
        net_blocks = net_bytes = 0
        for neighbour in (block.prev, block.next):
            subsumed = self._try_merge(block, neighbour)
            if subsumed:
                net_blocks, net_bytes = net_blocks - 1, net_bytes - subsumed
        self._insert_free(block)
        if block.is_split():
            net_blocks, net_bytes = net_blocks + 1, net_bytes + block.size
        if not block.segment.expandable:
            self._count(block.small, inactive_split=net_blocks, inactive_split_bytes=net_bytes)
        self._count(block.small, active=-1, active_bytes=-orig_size, requested_bytes=-requested)
        block.requested, block.key = 0, None

    def _try_merge(self, dst: _Block, src: _Block | None) -> int:
        """try_merge_blocks: absorb a free neighbour with the same mapping state; its size or 0."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            self._remove_free(src)
        else:
            self._remove_unmapped(src)
        if dst.prev is src:
            dst.addr, dst.prev = src.addr, src.prev
            if dst.prev:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _release_block(self, block: _Block) -> None:
        """cudaFree an unsplit free segment."""
        self._remove_free(block)
        if self.history is not None:
            self.history.append(("segment_free", block.addr, block.size, block.stream))
        self._count(block.small, segment=-1, reserved_bytes=-block.size)
        self.counters["num_device_free"] += 1
        if block.size >= self.config.max_split_size:
            self.oversize_segments.add(-1)

    def _release_available_cached_blocks(self, pool: _Pool, size: int, stream: int) -> bool:
        """Free oversize cached blocks of this stream: the smallest one >= max(size, max_split_size),
        else the largest ones down from there until that much is freed."""
        if self.config.max_split_size == SIZE_MAX:
            return False
        target = max(size, self.config.max_split_size)
        keys = pool.free.get(stream, [])
        i = bisect.bisect_left(keys, (target, -1))
        if i < len(keys) and not self._free_at[keys[i][1]].segment.expandable:
            self._release_block(self._free_at[keys[i][1]])
            return True
        released = 0
        for j in range(i - 1, -1, -1):
            if released >= target or keys[j][0] < self.config.max_split_size:
                break
            block = self._free_at[keys[j][1]]
            if not block.segment.expandable and not block.is_split():
                released += block.size
                self._release_block(block)
        return released >= target

    def _release_cached_blocks(self) -> bool:
        self._release_blocks(self.pools[False])
        self._release_blocks(self.pools[True])
        return True

    def _release_blocks(self, pool: _Pool) -> None:
        """Free every unsplit cached segment; unmap the whole free pages of expandable segments."""
        blocks = self._pool_blocks(pool)
        to_unmap = [b for b in blocks if b.segment.expandable]
        for block in blocks:
            if not block.segment.expandable and not block.is_split():
                self._release_block(block)
        for block in to_unmap:
            self._unmap_block(block)
            if not block.is_split() and not block.mapped:  # the whole range is unmapped again
                self._remove_unmapped(block)
                self._segments.remove(block.segment)

    def _garbage_collect_cached_blocks(self) -> None:
        """Free unsplit large cached segments older than the average age (counted in get_free_block
        calls) until reserved is back under garbage_collection_threshold * the allowed memory."""
        threshold = int(self.config.garbage_collection_threshold * self.allowed)  # type: ignore[operator]
        if self.reserved_bytes <= threshold:
            return
        target, reclaimed, pool = self.reserved_bytes - threshold, 0, self.pools[False]
        ages = {id(b): pool.gc_calls - b.gc_base for b in self._pool_blocks(pool) if not b.is_split()}
        total_age, count, freed = sum(ages.values()), len(ages), True
        while reclaimed < target and freed and count > 0:
            threshold_age, freed = total_age / count, False
            for block in self._pool_blocks(pool):
                age = pool.gc_calls - block.gc_base
                if not block.is_split() and not block.segment.expandable and age >= threshold_age:
                    freed, reclaimed, total_age, count = True, reclaimed + block.size, total_age - age, count - 1
                    self._release_block(block)

    # ---- expandable segments

    def _find_expandable_block(self, pool: _Pool, size: int, stream: int) -> _Block:
        """The lowest-address unmapped block of this stream (with a free block just before it) that
        has `size` bytes of free + unmapped room; else a new segment's whole virtual range."""
        def allocatable(b: _Block | None) -> bool:
            return b is not None and not b.allocated

        for addr in pool.unmapped.get(stream, []):
            c = self._unmapped_at[addr]
            c = c.prev if allocatable(c.prev) else c
            room, b = 0, c
            while room < size and allocatable(b):
                room, b = room + b.size, b.next  # type: ignore[union-attr]
            if room >= size:
                return c
        page = K_SMALL_BUFFER if pool.small else self.config.large_segment_size
        total = self.capacity if self.capacity is not None else UNBOUNDED_VA
        span = -(-(total + total // 8) // page) * page  # address space for 1 1/8 of the device
        segment = _Segment(self._reserve_va(span), page)
        self._segments.append(segment)
        block = _Block(segment.base, span, stream, pool.small, segment, mapped=False)
        self._insert_unmapped(block)
        return block

    def _try_allocate_expandable_block(self, pool: _Pool, size: int, stream: int) -> _Block | None:
        candidate = self._find_expandable_block(pool, size, stream)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:  # free -> unmapped -> ...: map more pages, merging them in
            following = candidate.next
            assert following is not None
            if not self._map_block(following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        self._remove_free(candidate)
        return candidate

    def _map_block(self, block: _Block, size: int) -> bool:
        """Back the first `size` bytes (rounded up to pages) of an unmapped block; False on OOM."""
        page = block.segment.page
        mapped = -(-size // page) * page
        if self.capacity is not None and self.reserved_bytes + mapped > self.capacity:
            return False  # cuMemCreate fails; the pages created in this call are released
        self._remove_unmapped(block)
        if self.history is not None:
            self.history.append(("segment_map", block.addr, mapped, block.stream))
        block.mapped = True
        if mapped < block.size:
            rest = _Block(block.addr + mapped, block.size - mapped, block.stream, block.small, block.segment,
                          mapped=False)
            rest.splice(block, block.next)
            self._insert_unmapped(rest)
            block.size = mapped
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._insert_free(block)
        self._count(block.small, reserved_bytes=mapped)
        self.counters["num_device_alloc"] += 1
        return True

    def _unmap_block(self, block: _Block) -> None:
        """Unmap the whole pages inside a free block; partial pages at its ends stay mapped and free."""
        seg, page = block.segment, block.segment.page
        begin = -(-(block.addr - seg.base) // page)
        end = (block.addr + block.size - seg.base) // page
        if begin >= end:
            return
        self._remove_free(block)
        start, length = seg.base + begin * page, (end - begin) * page
        if start > block.addr:
            before = _Block(block.addr, start - block.addr, block.stream, block.small, seg)
            before.splice(block.prev, block)
            self._insert_free(before)
        if block.addr + block.size > start + length:
            after = _Block(start + length, block.addr + block.size - start - length, block.stream, block.small, seg)
            after.splice(block, block.next)
            self._insert_free(after)
        if self.history is not None:
            self.history.append(("segment_unmap", start, length, block.stream))
        block.addr, block.size, block.mapped = start, length, False
        self._try_merge(block, block.prev)
        self._try_merge(block, block.next)
        self._insert_unmapped(block)
        self._count(block.small, reserved_bytes=-length)
        self.counters["num_device_free"] += 1

    # ---- bookkeeping

    def _insert_free(self, block: _Block) -> None:
        pool = self.pools[block.small]
        block.gc_base = pool.gc_calls  # insert_into_blocks
        bisect.insort(pool.free.setdefault(block.stream, []), (block.size, block.addr))
        self._free_at[block.addr] = block

    def _remove_free(self, block: _Block) -> None:
        keys = self.pools[block.small].free[block.stream]
        del keys[bisect.bisect_left(keys, (block.size, block.addr))]
        del self._free_at[block.addr]

    def _insert_unmapped(self, block: _Block) -> None:
        bisect.insort(self.pools[block.small].unmapped.setdefault(block.stream, []), block.addr)
        self._unmapped_at[block.addr] = block

    def _remove_unmapped(self, block: _Block) -> None:
        addrs = self.pools[block.small].unmapped[block.stream]
        del addrs[bisect.bisect_left(addrs, block.addr)]
        del self._unmapped_at[block.addr]

    def _pool_blocks(self, pool: _Pool) -> list[_Block]:
        """The pool's free blocks in std::set order: stream, size, address."""
        return [self._free_at[a] for s in sorted(pool.free) for _, a in list(pool.free[s])]

    def _reserve_va(self, nbytes: int) -> int:
        addr = self._next_va
        self._next_va += -(-nbytes // K_ROUND_LARGE) * K_ROUND_LARGE
        return addr

    def _count(self, small: bool, **changes: int) -> None:
        """Stat.add on the "all" stat and the pool's of each change (inlined: the replay's most frequent call)."""
        pairs = self._stat_pairs[small]
        for name, amount in changes.items():
            if not amount:
                continue
            for stat in pairs[name]:
                stat.current += amount
                if amount > 0:
                    if stat.current > stat.peak:
                        stat.peak = stat.current
                    stat.allocated += amount
                else:
                    stat.freed -= amount

    def _note_peaks(self) -> None:
        allocated, reserved = self._allocated_all.current, self._reserved_all.current
        if allocated > self._at_alloc_peak[0]:
            self._at_alloc_peak = (allocated, reserved)
            if self.snapshot_at_peak:
                self.peak_snapshot = self.snapshot()
        if reserved > self._at_reserved_peak[1]:
            self._at_reserved_peak = (allocated, reserved)

    def _segment_info(self, head: _Block) -> SegmentInfo:
        blocks, b = [], head
        while b is not None and b.mapped:
            state = "active_allocated" if b.allocated else "inactive"
            blocks.append(BlockInfo(b.addr, b.size, b.requested, state, b.stream, b.key))
            b = b.next
        return SegmentInfo(
            address=head.addr, total_size=sum(x.size for x in blocks),
            allocated_size=sum(x.size for x in blocks if x.state != "inactive"),
            requested_size=sum(x.requested_size for x in blocks), stream=head.stream,
            segment_type="small" if head.small else "large", is_expandable=head.segment.expandable,
            blocks=tuple(blocks))

    def _oom_message(self, alloc_size: int) -> str:
        total = self.capacity if self.capacity is not None else 0
        free = max(total - self.reserved_bytes, 0)
        unallocated = self.reserved_bytes - self.allocated_bytes
        return (f"out of memory: tried to allocate {alloc_size} B; capacity {total} B, {free} B free; "
                f"{self.allocated_bytes} B allocated, {unallocated} B reserved but unallocated")


def _expandable_size(block: _Block) -> int:
    """A free block's size plus the unmapped room right after it (get_free_block's expandable_size)."""
    return block.size + (block.next.size if block.next is not None and not block.next.mapped else 0)


def replay(events: Iterable[DeviceEvent], config: AllocatorConfig = DEFAULTS,
           capacity_bytes: int | None = None, *, snapshot_at_peak: bool = False,
           history: list | None = None) -> CudaCachingAllocator:
    """Replay alloc/free events (an optional `stream` attribute picks the stream) and return the
    allocator, whose peaks, fragmentation and snapshot describe the run."""
    allocator = CudaCachingAllocator(config, capacity_bytes, snapshot_at_peak=snapshot_at_peak, history=history)
    for event in events:
        if event.action == "alloc":
            allocator.malloc(event.key, event.nbytes, getattr(event, "stream", 0))
        elif allocator.holds(event.key):
            allocator.free(event.key)
    return allocator
