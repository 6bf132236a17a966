"""How a trace composed from a few blocks (block_compose.py) is held to the traced one, and what it counts beyond the
traced blocks: block_reuse.py checks every use with `first_difference` and extrapolates op counts and the lean loop's
counting marks."""

from __future__ import annotations

import dataclasses
from collections import Counter

from trainmem.trace.block_compose import COUNT_MARKS
from trainmem.trace.events import KernelCall, Trace


def extrapolated_counts(fewer: Counter, more: Counter, steps: int) -> Counter:
    """Op counts `steps` blocks beyond `more` (one block beyond `fewer`): each op's count per block repeated."""
    return Counter({op: more[op] + steps * (more[op] - fewer[op]) for op in set(fewer) | set(more)})


def first_difference(composed: Trace, traced: Trace) -> str | None:
    """Where a composed trace differs from the traced one (None: identical, event for event)."""
    if len(composed.events) != len(traced.events):
        return f"{len(composed.events):,} events composed, {len(traced.events):,} traced"
    for mine, theirs in zip(composed.events, traced.events):
        if mine != theirs:
            return f"event {theirs.seq}: composed {mine}, traced {theirs}"
    if composed.storages != traced.storages:
        sid = next(s for s in traced.storages if composed.storages.get(s) != traced.storages[s])
        return f"storage {sid}: composed {composed.storages.get(sid)}, traced {traced.storages[sid]}"
    if [_call_key(c) for c in composed.kernel_calls] != [_call_key(c) for c in traced.kernel_calls]:
        return "kernel calls differ"
    for name in ("host_storages", "managed_storages", "offloaded_storages"):
        if getattr(composed, name) != getattr(traced, name):
            return f"{name} differ"
    plain = lambda marks: [m if m[0] not in COUNT_MARKS else m[:5] for m in marks]  # noqa: E731
    if plain(composed.loop_marks) != plain(traced.loop_marks):
        return "loop marks differ"
    return None


def extrapolated_marks(composed: list[list], fewer: list[list], more: list[list], steps: int) -> list[list]:
    """The composed marks with the op counts of COUNT_MARKS extrapolated like the op counts (`steps` beyond `more`)."""
    out = []
    for mark, few, many in zip(composed, fewer, more, strict=True):
        if mark[0] in COUNT_MARKS:
            counts = extrapolated_counts(Counter(dict(few[5])), Counter(dict(many[5])), steps)
            mark = mark[:5] + [sorted([op, n] for op, n in counts.items() if n)]
        out.append(mark)
    return out


def _call_key(call: KernelCall) -> tuple:
    """A kernel call with its storage keys (ids of the storages during the call) numbered within the call."""
    numbers: dict[int, int] = {}

    def plain(value):
        if dataclasses.is_dataclass(value) and hasattr(value, "storage_key"):
            return dataclasses.replace(value, storage_key=numbers.setdefault(value.storage_key, len(numbers)))
        if isinstance(value, (tuple, list)):
            return tuple(plain(v) for v in value)
        return value

    return call.op, call.at_seq, call.outputs_allocated, plain(call.args), plain(call.outputs), call.output_sids
