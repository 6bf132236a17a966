"""One replay of a target's event stream through an allocator model, one result.

An allocator is an object with `replay(events) -> ReplayResult`; the estimate reads everything it
reports about the allocator from that result: where the allocated peak is, what is alive there, the
peaks, the memory_snapshot() at the peak (summed), and whether the run ran out of memory. No torch.

- `CpuTensorAllocator`: c10's CPU allocator (64-byte posix_memalign, caches nothing; alloc/cpu_heap.py).
- `CudaAllocator`: PyTorch's caching allocator (alloc/cuda_caching.py) on a card with `capacity` bytes.

Beside the one result, an allocator gives what the drawings need, so that nothing outside alloc/ drives an
allocator model: `series(events)`, its allocated (and reserved) bytes after every event (report/timeline.py),
and on a GPU `record(events, count)`, a replay with the allocator's history on (report/memviz.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from trainmem.alloc import cpu_heap as cpu_alloc
from trainmem.alloc import small_objects
from trainmem.alloc.cuda_caching import (CudaCachingAllocator, CudaOutOfMemoryError, Fragmentation, SegmentSummary,
                                         replay as cuda_replay, round_size)
from trainmem.alloc.cuda_config import AllocatorConfig
from trainmem.alloc.side_process import beside
from trainmem.alloc.device_events import DeviceEvent
from trainmem.trace.events import Category


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    peak_index: int  # the stream event after which the allocated peak was first reached
    live: Mapping[int, DeviceEvent]  # key -> alloc event of each block alive there
    allocated: int  # the allocated peak (CUDA: max_memory_allocated; CPU: live bytes, 64-B aligned)
    reserved: int | None  # max_memory_reserved; None for an allocator that caches nothing
    tensor_peak: int  # live tensor bytes at their own peak, as the allocator's user sees them
    segments: SegmentSummary | None = None  # torch.cuda.memory_snapshot() at the allocated peak, summed
    fragmentation: Fragmentation | None = None  # reserved - allocated at the allocated and reserved peaks
    out_of_memory: str | None = None  # the simulated OOM; the figures are then the whole run's on a card
                                      # large enough for it


@dataclasses.dataclass(frozen=True)
class ReplaySeries:
    """The allocator's figures after every event of a stream, as replayed for the estimate."""

    allocated: tuple[int, ...]  # allocated bytes (CPU: live tensor bytes, each rounded to 64 B)
    reserved: tuple[int, ...] | None  # a caching allocator's reserved bytes; None for one that caches nothing


@dataclasses.dataclass
class Recording:
    """A replay with the caching allocator's history on: its entries, which stream event made each, where the
    allocated peak is, and the allocator's state after the last event replayed."""

    entries: list[tuple[str, int, int, int]]  # (action, addr, size, stream) as cuda_caching records them
    owner: list[int]  # the stream event index behind each entry
    peak_entry: int  # the alloc entry after which allocated_bytes first reached its maximum
    allocator: CudaCachingAllocator  # its state after the last event replayed (read it; replay nothing more)
    alloc_event: dict  # malloc key -> the event index that allocated the live block
    oom: str | None = None  # the simulated out-of-memory message, when the replay stopped there


class Allocator(Protocol):
    def replay(self, events: Sequence[DeviceEvent]) -> ReplayResult: ...

    def series(self, events: Sequence[DeviceEvent]) -> ReplaySeries: ...

    def charged(self, nbytes: int) -> int:
        """The bytes a request of `nbytes` is counted as in its category of the breakdown; what the
        allocator holds beyond that (alignment, blocks kept whole) is the breakdown's `runtime`."""
        ...


@dataclasses.dataclass(frozen=True)
class CpuTensorAllocator:
    """c10's CPU allocator: each request rounded to 64 B, nothing cached. The breakdown counts each
    request as asked; the alignment slack goes to `runtime`."""

    def replay(self, events: Sequence[DeviceEvent]) -> ReplayResult:
        tensors = cpu_alloc.replay_tensors(list(events))
        return ReplayResult(tensors.peak_index, tensors.live_at_peak, tensors.peak_bytes, None, tensors.peak_bytes)

    def series(self, events: Sequence[DeviceEvent]) -> ReplaySeries:
        live: dict[int, int] = {}
        allocated, out = 0, []
        for event in events:
            if event.action == "alloc":
                live[event.key] = cpu_alloc.aligned(event.nbytes)
                allocated += live[event.key]
            elif event.key in live:
                allocated -= live.pop(event.key)
            out.append(allocated)
        return ReplaySeries(tuple(out), None)

    def charged(self, nbytes: int) -> int:
        return nbytes


@dataclasses.dataclass(frozen=True)
class CudaAllocator:
    """PyTorch's caching allocator with `config`, on a card where cudaMalloc may hand out `capacity`
    bytes (None: unlimited). The breakdown counts each request at its 512-byte rounding."""

    config: AllocatorConfig
    capacity: int | None = None

    def charged(self, nbytes: int) -> int:
        return round_size(nbytes, self.config)

    def replay(self, events: Sequence[DeviceEvent]) -> ReplayResult:
        result = self._replay(events, self.capacity)
        if result.out_of_memory is None:
            return result
        # a run that fails still reports the whole run's figures, as if the card were large enough: those
        # come from a replay without the capacity (the failed replay stopped at the failing request)
        whole = dataclasses.replace(self, config=without_limit(self.config))._replay(events, None)
        return dataclasses.replace(whole, out_of_memory=result.out_of_memory)

    def series(self, events: Sequence[DeviceEvent]) -> ReplaySeries:
        """On the card's capacity, or, where that replay runs out of memory, on a card large enough (the
        figures the estimate reports then)."""
        try:
            return _series(events, CudaCachingAllocator(self.config, self.capacity))
        except CudaOutOfMemoryError:
            return _series(events, CudaCachingAllocator(without_limit(self.config), None))

    def record(self, events: Sequence[DeviceEvent], count: int) -> Recording:
        """Replay the first `count` events with history on (same config and capacity as `replay`); an
        out-of-memory stops the recording there and is named in it."""
        history: list = []
        allocator = CudaCachingAllocator(self.config, self.capacity, history=history)
        owner: list[int] = []
        alloc_event: dict = {}
        best, peak_entry, oom = -1, 0, None
        for index, event in enumerate(events[:count]):
            try:
                if event.action == "alloc":
                    allocator.malloc(event.key, event.nbytes, getattr(event, "stream", 0))
                    alloc_event[event.key] = index
                elif allocator.holds(event.key):
                    allocator.free(event.key)
            except CudaOutOfMemoryError as error:
                oom = f"{error} (at {event.phase}, op {event.op})"
            owner.extend([index] * (len(history) - len(owner)))
            if oom:
                break
            if event.action == "alloc" and allocator.allocated_bytes > best:
                best, peak_entry = allocator.allocated_bytes, len(history) - 1
        return Recording(history, owner, max(peak_entry, 0), allocator, alloc_event, oom)

    def _replay(self, events: Sequence[DeviceEvent], capacity: int | None) -> ReplayResult:
        """One pass. The live set at the allocated peak is rebuilt at the end from the live set then, by
        undoing the changes made since the peak; the segments at the peak are summed when the state
        first leaves the peak (a non-empty malloc always raises `allocated`, every block being at least
        512 B, so the peak state lasts until the next free or empty request, or the end)."""
        allocator = CudaCachingAllocator(self.config, capacity)
        live: dict[int, DeviceEvent] = {}
        since_peak: list[tuple[int, DeviceEvent | None]] = []  # (key, what it held before) since the peak
        sizes: dict[int, int] = {}
        best, peak_index, requested, tensor_peak = -1, 0, 0, 0
        segments, retries, pending = SegmentSummary(0, 0, 0), 0, False
        for index, event in enumerate(events):
            if pending and not (event.action == "alloc" and event.nbytes > 0):
                segments, retries, pending = allocator.segment_summary(), allocator.counters["num_alloc_retries"], False
            if event.action == "alloc":
                try:
                    # a block goes to its allocation stream's pool (cuda_caching.py); DeviceEvent has no stream:
                    # the default one, unless the target sent an event that names one (cuda_target.StreamEvent)
                    allocator.malloc(event.key, event.nbytes, getattr(event, "stream", 0))
                except CudaOutOfMemoryError as error:
                    return ReplayResult(peak_index, {}, allocator.peak_allocated_bytes, allocator.peak_reserved_bytes,
                                        tensor_peak, out_of_memory=f"{error} (at {event.phase}, op {event.op})")
                since_peak.append((event.key, live.get(event.key)))
                live[event.key] = event
                sizes[event.key] = event.nbytes
                requested += event.nbytes
                tensor_peak = max(tensor_peak, requested)
                if allocator.allocated_bytes > best:
                    best, peak_index, pending = allocator.allocated_bytes, index, True
                    since_peak.clear()
            else:
                if event.key in live:
                    since_peak.append((event.key, live.pop(event.key)))
                if event.key in sizes:
                    allocator.free(event.key)
                    requested -= sizes.pop(event.key)
        if pending:
            segments, retries = allocator.segment_summary(), allocator.counters["num_alloc_retries"]
        if retries or allocator.allowed is not None:
            segments = _segments_without_capacity(events, self.config, peak_index)
        return ReplayResult(peak_index, live_before(live, since_peak), allocator.peak_allocated_bytes,
                            allocator.peak_reserved_bytes, tensor_peak, segments, allocator.fragmentation)


def _series(events: Sequence[DeviceEvent], allocator: CudaCachingAllocator) -> ReplaySeries:
    live: set[int] = set()
    allocated, reserved = [], []
    for event in events:
        if event.action == "alloc":
            live.add(event.key)
            allocator.malloc(event.key, event.nbytes, getattr(event, "stream", 0))
        elif event.key in live:
            live.discard(event.key)
            allocator.free(event.key)
        allocated.append(allocator.allocated_bytes)
        reserved.append(allocator.reserved_bytes)
    return ReplaySeries(tuple(allocated), tuple(reserved))


def live_before(live: dict[int, DeviceEvent], changes: list[tuple[int, DeviceEvent | None]]) -> dict[int, DeviceEvent]:
    """The live set before `changes` (key, what it held before each change) were made to `live`."""
    before = dict(live)
    for key, held in reversed(changes):
        if held is None:
            before.pop(key, None)
        else:
            before[key] = held
    return before


def _segments_without_capacity(events: Sequence[DeviceEvent], config: AllocatorConfig, index: int) -> SegmentSummary:
    """Kept for identity with earlier releases (a follow-up should drop it): where the card's capacity
    made the allocator release its cache before the peak (or a memory fraction limits it), the segments
    reported are the ones a card without that limit would show, replayed up to the peak. Everywhere
    else the two are the same state and the single replay's own figures are used."""
    return SegmentSummary.of(cuda_replay(list(events[: index + 1]), without_limit(config)).snapshot())


def without_limit(config: AllocatorConfig) -> AllocatorConfig:
    """`config` on a card without limit. per_process_memory_fraction caps the allocator at fraction ×
    capacity (setMemoryFraction); without a capacity there is nothing to take a fraction of, so the
    unlimited replays (the whole run's figures after an OOM, the segments above) run at fraction 1."""
    return dataclasses.replace(config, per_process_memory_fraction=1.0)


@dataclasses.dataclass(frozen=True)
class HeapReplay:
    """glibc's resident heap for a CPU run: the tensor stream with the runtime's small objects
    interleaved as malloc logs of real runs show (alloc/small_objects.py), replayed as expected and
    with every freed chunk pinned (the objects' placement changes from run to run)."""

    resident: int
    pinned: int
    objects: int  # small objects interleaved
    defaulted_ops: dict[str, int]  # op kinds without a small-object row (their phase's average is used)
    table: dict  # small_objects.family_facts: the rows' family and source, the run-to-run spread
    growth: dict[int, int] = dataclasses.field(default_factory=dict)  # n -> resident peak of the first n steps


def glibc_heap(events: Sequence[DeviceEvent], after_steps: Sequence[int] = (), family: str = "torch") -> HeapReplay:
    """The heap over the whole stream, and (`after_steps`) the peak of each shorter run it begins with; the small
    objects of the model code's `family` (small_objects.family_of)."""
    interleaved = small_objects.interleave(events, family=family)
    traced = sorted({event.step for event in events if str(event.phase) != "init"})
    marks = {}
    for steps in after_steps:
        start = interleaved.step_starts.get(traced[0] + steps) if traced else None
        if start is not None:
            marks[start] = steps
    # the two replays share only their input: the pinned one runs in a forked child meanwhile (side_process.py)
    with beside(cpu_alloc.replay_actions, interleaved.actions, True) as pinned:
        resident, seen = cpu_alloc.replay_growth(interleaved.actions, marks)
        pinned_peak = pinned.result()
    growth = {steps: seen.get(steps, resident) for steps in after_steps}
    return HeapReplay(resident, pinned_peak, interleaved.objects, interleaved.defaulted_ops,
                      small_objects.family_facts(family), growth)


def breakdown_at_peak(replayed: ReplayResult, charged) -> dict[str, int]:
    """Bytes at the allocated peak by category: each live block as the allocator charges its request
    (`Allocator.charged`); what the allocator holds beyond that (alignment, blocks kept whole) is `runtime`."""
    # "checkpoint" (a loaded checkpoint's copies, --load) is a key only where a run loads one
    breakdown = {str(c): 0 for c in Category if c != Category.CHECKPOINT}
    for event in replayed.live.values():
        breakdown[str(event.category)] = breakdown.get(str(event.category), 0) + charged(event.nbytes)
    breakdown[str(Category.RUNTIME)] += replayed.allocated - sum(breakdown.values())
    return breakdown
