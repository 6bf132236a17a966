"""A kernel's real-time allocations, split around the outputs the trace already counts.

A convolution kernel's allocations are written as one sequence in real-time order: ints (+alloc /
-free of a transient buffer) and `Output` markers where the kernel allocates one of its outputs.
The trace counts the op's outputs at one point, so the sequence is split into `before` and `after`
there: at the last run of adjacent markers. An output the kernel allocates earlier (grad_input,
before the whole backward-weights pass) becomes a placeholder: allocated in `before` where the
kernel allocates it and freed as the last entry of `before`, just ahead of the traced outputs.
Every entry is then a real alloc or a free of an earlier alloc of the same size, and the running
sum is the real live-bytes curve except for that momentary dip.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Output:
    """Where the kernel allocates its output `name` ("y", "grad_input", ...) of `nbytes`."""

    name: str
    nbytes: int


def split_at_outputs(sequence: list) -> tuple[list[int], list[int]]:
    """(before, after) of a real-time sequence, as the module docstring describes. Zero entries
    (a buffer a path does not allocate) are dropped."""
    sequence = [entry for entry in sequence if entry]
    marks = [position for position, entry in enumerate(sequence) if isinstance(entry, Output)]
    if not marks:
        return sequence, []
    last = marks[-1]
    first_of_run = last
    while first_of_run - 1 in marks:
        first_of_run -= 1
    before, placeholders = [], []
    for entry in sequence[:first_of_run]:
        if isinstance(entry, Output):  # allocated earlier than the traced point
            before.append(entry.nbytes)
            placeholders.append(entry.nbytes)
        else:
            before.append(entry)
    before += [-nbytes for nbytes in reversed(placeholders)]
    return before, list(sequence[last + 1:])
