"""Memory over the training step, point by point: what the plot, the HTML report and notebooks draw.

The estimate keeps the target's event stream and the allocator it was replayed through (`ReplayInput`,
estimate/result.py). Here that stream is replayed once more, recording after every event the live bytes of
each category (each request as the breakdown charges it), the allocator's allocated bytes and, on a GPU,
its reserved bytes. Whatever the allocator holds beyond the charged requests (512-byte rounding, 64-byte
CPU alignment) is drawn as `runtime`, as the breakdown counts it, so the stacked categories add up to the
allocated line at every point and to the estimate's allocated peak at the peak.

A step of a large model has hundreds of thousands of events; a drawing needs a few thousand points. The
events are cut into equal buckets and each bucket is drawn by its highest event, so no peak is smoothed away
and the estimate's peak is always one of the points. No torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from trainmem.alloc.device_events import live_after
from trainmem.alloc.replay import ReplaySeries
from trainmem.errors import TrainmemError
from trainmem.trace.events import Category

DEFAULT_MAX_POINTS = 4000


@dataclasses.dataclass(frozen=True)
class Band:
    """A run of consecutive points in one phase of one step, [start, stop) in point positions."""

    phase: str
    step: int
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class Timeline:
    gpu: bool  # allocated / reserved are the caching allocator's
    capacity_bytes: int
    events: int  # stream events in the whole run, before downsampling
    categories: tuple[str, ...]  # stacking order: Category order, those that ever hold bytes
    index: tuple[int, ...]  # the stream event index of each point
    by_category: dict[str, tuple[int, ...]]  # live bytes per category at each point
    allocated: tuple[int, ...]  # the allocator's allocated bytes (CPU: live tensor bytes, 64-B aligned)
    reserved: tuple[int, ...] | None  # the caching allocator's reserved bytes; None on the CPU
    phase: tuple[str, ...]
    module: tuple[str, ...]
    op: tuple[str, ...]
    step: tuple[int, ...]
    bands: tuple[Band, ...]
    peak: int  # point position of the allocated peak (its first occurrence)
    peak_bytes: int
    peak_phase: str
    peak_module: str
    peak_op: str
    modules_at_peak: dict[str, int]  # full qualified module name ("" = the model) -> bytes it owns at the peak

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "bands": [dataclasses.asdict(band) for band in self.bands]}


def timeline(estimate: Any, max_points: int = DEFAULT_MAX_POINTS) -> Timeline:
    """The estimate's step as at most `max_points` points (each bucket's highest event)."""
    source = getattr(estimate, "replay_input", None)
    if source is None:
        raise TrainmemError("expected an estimate with its allocator replay (it draws the timeline), got one "
                            "that keeps none", where="--plot/--html")
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, got {max_points}")
    events = list(source.events)
    series = source.allocator.series(events)
    gpu = series.reserved is not None
    columns = _columns(events, source.allocator.charged, series)
    chosen = _downsample(columns["allocated"], max_points)
    peak_event = max(range(len(events)), key=lambda i: (columns["allocated"][i], -i)) if events else 0
    pick = lambda values: tuple(values[i] for i in chosen)  # noqa: E731
    categories = tuple(c for c in (str(c) for c in Category) if any(columns["categories"][c]))
    first = events[peak_event] if events else None
    return Timeline(
        gpu=gpu, capacity_bytes=source.capacity_bytes, events=len(events), categories=categories,
        index=tuple(chosen), by_category={c: pick(columns["categories"][c]) for c in categories},
        allocated=pick(columns["allocated"]), reserved=pick(columns["reserved"]) if gpu else None,
        phase=tuple(str(events[i].phase) for i in chosen), module=tuple(events[i].module for i in chosen),
        op=tuple(events[i].op for i in chosen), step=tuple(events[i].step for i in chosen),
        bands=_bands([str(events[i].phase) for i in chosen], [events[i].step for i in chosen]),
        peak=chosen.index(peak_event) if events else 0, peak_bytes=columns["allocated"][peak_event] if events else 0,
        peak_phase=str(first.phase) if first else "", peak_module=first.module if first else "",
        peak_op=first.op if first else "",
        modules_at_peak=_modules_at_peak(events, peak_event, source.allocator.charged))


def _columns(events: Sequence[Any], charged: Any, series: ReplaySeries) -> dict[str, Any]:
    """After every event: live charged bytes per category (the allocator's slack added to runtime), and the
    allocator's allocated (and on a GPU reserved) bytes from its own per-event series."""
    live: dict[int, Any] = {}
    sums = dict.fromkeys((str(c) for c in Category), 0)
    columns: dict[str, Any] = {"categories": {c: [] for c in sums}, "allocated": list(series.allocated),
                               "reserved": list(series.reserved or [0] * len(events))}
    for index, event in enumerate(events):
        if event.action == "alloc":
            live[event.key] = event
            sums[str(event.category)] += charged(event.nbytes)
        elif event.key in live:
            held = live.pop(event.key)
            sums[str(held.category)] -= charged(held.nbytes)
        slack = series.allocated[index] - sum(sums.values())
        for name, value in sums.items():
            columns["categories"][name].append(value + (slack if name == str(Category.RUNTIME) else 0))
    return columns


def _downsample(allocated: Sequence[int], max_points: int) -> list[int]:
    """Event indices to draw: all of them when few, else each of `max_points` equal buckets' highest event
    (its first occurrence), in order."""
    count = len(allocated)
    if count <= max_points:
        return list(range(count))
    chosen = []
    for bucket in range(max_points):
        start, stop = bucket * count // max_points, (bucket + 1) * count // max_points
        if stop > start:
            chosen.append(max(range(start, stop), key=lambda i: (allocated[i], -i)))
    return chosen


def _bands(phases: Sequence[str], steps: Sequence[int]) -> tuple[Band, ...]:
    bands: list[Band] = []
    for position, (phase, step) in enumerate(zip(phases, steps)):
        if bands and bands[-1].phase == phase and bands[-1].step == step:
            bands[-1] = dataclasses.replace(bands[-1], stop=position + 1)
        else:
            bands.append(Band(phase, step, position, position + 1))
    return tuple(bands)


def _modules_at_peak(events: Sequence[Any], peak_event: int, charged) -> dict[str, int]:
    """Bytes each module owns at the peak: every block alive there, charged to the module that allocated it."""
    owners: dict[str, int] = {}
    for event in live_after(events, peak_event).values():
        owners[event.module] = owners.get(event.module, 0) + charged(event.nbytes)
    return dict(sorted(owners.items(), key=lambda item: -item[1]))
