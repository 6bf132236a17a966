"""TensorFlow's BFC allocator (alloc/tf_bfc.py) behind alloc.replay's Allocator protocol, so that the one assembler
(estimate/assemble.py) and the drawings (report/timeline.py) replay a Keras model's GPU stream as they replay
PyTorch's."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from trainmem.alloc.device_events import DeviceEvent
from trainmem.alloc.replay import ReplayResult, ReplaySeries
from trainmem.alloc.tf_bfc import BfcAllocator, BfcConfig, BfcOutOfMemory, replay_bfc


@dataclasses.dataclass(frozen=True)
class TfBfcAllocator:
    """The BFC allocator behind alloc.replay's Allocator protocol: allocated = peak_bytes_in_use, reserved
    = the regions' peak. The breakdown counts each request as asked (count × item size); the 256-B rounding and
    chunks kept whole (not split) are the rest, in `runtime`. `optional` says which requests may fail without
    failing the step (replay_bfc)."""

    config: BfcConfig
    optional: Callable[[DeviceEvent], bool] | None = None
    label = "TensorFlow's BFC allocator (a Keras model on TensorFlow)"

    def charged(self, nbytes: int) -> int:
        return nbytes

    def replay(self, events: Sequence[DeviceEvent]) -> ReplayResult:
        r = replay_bfc(events, self.config, optional=self.optional)
        return ReplayResult(r.peak_index, r.live_events, r.peak_in_use, r.peak_region_bytes, r.tensor_peak,
                            out_of_memory=r.out_of_memory)

    def series(self, events: Sequence[DeviceEvent]) -> ReplaySeries:
        """Bytes in use (chunks) and the regions' bytes after every event, as replay_bfc serves them; events after
        a request that fails keep the figures where the replay stopped."""
        allocator = BfcAllocator(self.config)
        handles: dict[int, int] = {}
        allocated: list[int] = []
        reserved: list[int] = []
        failed = False
        for event in events:
            if not failed and event.action != "alloc" and event.key in handles:
                allocator.free(handles.pop(event.key))
            elif not failed and event.action == "alloc" and event.nbytes > 0:
                try:
                    handles[event.key] = allocator.allocate(event.nbytes)
                except BfcOutOfMemory:
                    failed = self.optional is None or not self.optional(event)
            allocated.append(allocator.stats.bytes_in_use)
            reserved.append(allocator.stats.pool_bytes)
        return ReplaySeries(tuple(allocated), tuple(reserved))
