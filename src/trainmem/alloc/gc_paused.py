"""Python's cyclic garbage collector paused around a replay.

A replay makes hundreds of thousands of small tuples and keeps them (the interleaved actions, the free
lists); each few hundred allocations start a collection that walks the young objects, and a full one
walks everything the trace left in memory: on a long trace that was half the replay's time. Nothing a
replay makes is cyclic garbage, and it runs no tensors or weakref callbacks, so the answer is the same
with the collector paused; it is resumed (if it was on) when the replay ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
