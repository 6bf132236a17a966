"""Autocast's cast cache, freed in one canonical order.

Under autocast, the first use of each fp32 weight in a region casts it to the lower precision and keeps the
copy in autocast's cache (aten/src/ATen/autocast_mode.cpp get_cached_casts), keyed by the weight's TensorImpl in
a hash map; leaving the outermost autocast region clears it (torch.clear_autocast_cache in
torch/amp/autocast_mode.py __exit__), and the copies die in the map's iteration order, which follows the
weights' addresses: it changes from process to process. The glibc replay depends on the order of frees (which
freed chunks merge), so the estimate would too. Within the trace the copies die in the order they were made
(their storages' order), every time: same command, same bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def cast_cache_freed_in_order(recorder) -> Iterator[None]:
    """While the trace runs, torch.clear_autocast_cache lays the frees it causes in storage order."""
    real = torch.clear_autocast_cache

    def clear_in_order() -> None:
        events = recorder.trace.events
        start = len(events)
        real()
        freed = events[start:]
        if len(freed) > 1 and all(event.action == "free" for event in freed):
            ordered = sorted(freed, key=lambda event: event.sid)
            events[start:] = [dataclasses.replace(event, seq=start + index) for index, event in enumerate(ordered)]

    torch.clear_autocast_cache = clear_in_order
    try:
        yield
    finally:
        torch.clear_autocast_cache = real
