"""What PyTorch's caching allocator reports (c10 Stat, torch.cuda.memory_snapshot()'s segments and blocks), as the
replay in alloc/cuda_caching.py keeps it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(slots=True)
class Stat:
    """c10 Stat: current, peak, and the running totals added and removed."""

    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0

    def add(self, amount: int) -> None:
        self.current += amount
        if amount >= 0:
            if self.current > self.peak:
                self.peak = self.current
            self.allocated += amount
        else:
            self.freed -= amount


@dataclasses.dataclass(frozen=True)
class BlockInfo:
    address: int
    size: int
    requested_size: int
    state: str  # "active_allocated" or "inactive", as in torch.cuda.memory_snapshot()
    stream: int
    key: object  # the malloc key of an allocated block


@dataclasses.dataclass(frozen=True)
class SegmentInfo:
    address: int
    total_size: int
    allocated_size: int
    requested_size: int
    stream: int
    segment_type: str  # "small" or "large"
    is_expandable: bool
    blocks: tuple[BlockInfo, ...]


@dataclasses.dataclass(frozen=True)
class SegmentSummary:
    """What torch.cuda.memory_snapshot() lists, summed: its segments and their bytes by pool."""

    segments: int
    large_bytes: int
    small_bytes: int

    @classmethod
    def of(cls, snapshot: list[SegmentInfo]) -> SegmentSummary:
        return cls(len(snapshot), sum(s.total_size for s in snapshot if s.segment_type == "large"),
                   sum(s.total_size for s in snapshot if s.segment_type == "small"))


@dataclasses.dataclass(frozen=True)
class Fragmentation:
    """Reserved minus allocated at the allocated peak and at the reserved peak (end of a malloc)."""

    at_allocated_peak: int
    at_reserved_peak: int


STAT_NAMES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
              "active_bytes", "inactive_split_bytes", "requested_bytes")
