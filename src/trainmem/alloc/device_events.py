"""The event an allocator model replays: one allocation or free of the target's device stream.

Targets (targets/) make these from a trace; allocator models (alloc/) consume them. It lives here, below both,
so that alloc/ never imports targets/.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from trainmem.trace.events import Category, Phase


@dataclasses.dataclass(frozen=True)
class DeviceEvent:
    action: str  # "alloc" or "free"
    nbytes: int
    key: int  # storage id; kernel-internal buffers get negative keys
    category: Category
    phase: Phase
    module: str
    op: str
    step: int
    trace_seq: int  # the trace event this came from, or the kernel call's position


def live_after(events: Sequence[DeviceEvent], index: int) -> dict[int, DeviceEvent]:
    """key -> the alloc event of every block alive once events[0..index] have run."""
    live: dict[int, DeviceEvent] = {}
    for event in events[: index + 1]:
        if event.action == "alloc":
            live[event.key] = event
        else:
            live.pop(event.key, None)
    return live
