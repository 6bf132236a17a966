"""Helpers for checking kernel rules against the real ops under the profiler."""


def running_peak(deltas) -> int:
    """The highest running total of signed byte deltas (+alloc / -free), starting from 0."""
    live = peak = 0
    for delta in deltas:
        live += delta
        peak = max(peak, live)
    return peak


def memory_inside(prof, op_name: str) -> list[int]:
    """Signed sizes of the [memory] events inside the first `op_name` event of a profile, in order."""
    events = list(prof.profiler.kineto_results.events())
    op = next(e for e in events if e.name() == op_name)
    inside = [e for e in events if e.name() == "[memory]" and op.start_ns() <= e.start_ns() <= op.end_ns()]
    return [e.nbytes() for e in sorted(inside, key=lambda e: e.start_ns())]
