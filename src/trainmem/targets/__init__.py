"""What the target's kernels and runtime allocate beyond the trace.

A target turns a Trace (what the dispatcher saw) into the device's event stream: the same storages,
plus buffers that kernels allocate below the dispatcher (scratch, layout reorders, workspaces), plus
size corrections where the fake kernel's output differs from the real one (oneDNN's LSTM workspace).
"""

from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass(frozen=True)
class KernelEffect:
    """What one kernel call does below the dispatcher: transient buffers before and after its outputs
    are allocated (signed bytes, + alloc / - free, in order) and true sizes of some outputs."""

    before: tuple[int, ...] = ()
    after: tuple[int, ...] = ()
    output_nbytes: tuple[tuple[int, int], ...] = ()  # (output index, real nbytes)
    rule: str = ""
