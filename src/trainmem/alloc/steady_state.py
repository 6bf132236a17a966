"""The run the user will run, not the two steps traced: the last traced step repeated, for the glibc heap.

Why. A CPU training process's RSS keeps growing after its first steps: glibc's dynamic mmap threshold
(malloc.c: a freed mmapped chunk larger than `mmap_threshold` raises it to that chunk's size, and the
trim threshold to twice that) moves more tensors into the heap step after step, and the runtime's small
objects left between freed tensor chunks keep the heap from shrinking. Measured on an Intel Xeon (AMX),
torch 2.13.0, tests/models.py:tiny_gpt batch 16, Adam, the tutorial loop (benchmarks/truth_loops.py
--mode rss --steps N): peak RSS 529, 584, 611, 647, 655 MiB after 1, 2, 4, 8, 16 steps; with the dynamic
threshold turned off (MALLOC_TOP_PAD_=0, malloc.c's `no_dyn_threshold`) 560 MiB after 2 and after 16.

What. Every step after the first does the same allocations in the same order (same shapes, same ops),
so the trace's last step is a template: step k+1 repeats it with fresh storage keys. A free in the
template of a storage born in the step before it (the previous step's gradients freed by zero_grad, the
loop's names rebound) frees, in each copy, the previous copy's storage of the same signature (phase, op,
bytes, category, and its rank among those): the storage that plays the same part one step later. Storages
born earlier still (parameters, optimizer state) are untouched by the copies. The copies go through the
same small-object interleave (alloc/small_objects.py: 'later'-step rows; shape-keyed cache entries only at
a signature's first allocation, so none are added) and glibc model as the traced steps.

How long. `steady_heap` replays the run's length when one is given, else MAX_STEPS ("a long run"), within a
bound on the events replayed, and reads the peak after each doubling of the traced steps off that one replay
(a shorter run is a prefix of the longer one); where the heap was still growing at the end, the result says so.
The heap creeps and then jumps, in the model as in real runs, so no run of unchanged doublings is taken as the
end: tests/models.py:tied_lm batch 16 (Adam, the tutorial loop) holds 467 MiB of modelled heap after 2, 4 and 8
steps and 521 MiB after 32, and its real peak RSS is 818, 872, 904, 916, 921, 923 MiB after 2, 4, 8, 16, 32, 64
steps (Intel Xeon, AMX, torch 2.13.0, benchmarks/truth_loops.py --mode rss, 2026-12-05).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

from trainmem.alloc.device_events import DeviceEvent
from trainmem.alloc.gc_paused import gc_paused

TRACED_STEPS_USED = 2  # the template is the last traced step; the step before it gives the analogues
MAX_STEPS = 32  # bound on the steps replayed when the heap keeps moving (the default run: "a long run")
# bound on the events one replay may hold (each doubling replays the whole run): a bound on time and memory that,
# unlike a clock, gives the same answer on every run of the same command
MAX_EVENTS = 300_000


@dataclasses.dataclass(frozen=True)
class SteadyHeap:
    resident: int  # peak resident heap over `steps` steps
    pinned: int  # the same with every freed chunk pinned
    steps: int  # the steps replayed
    converged: bool  # the peak stopped moving before `steps` (a longer run adds nothing)
    growth: dict[int, int]  # steps → peak resident heap, each doubling replayed
    objects: int
    defaulted_ops: dict[str, int]
    table: dict

    def to_plain(self) -> dict:
        """As JSON keeps it (trace/cache_store.py remembered): the growth's step counts as pairs."""
        return {**dataclasses.asdict(self), "growth": [[steps, nbytes] for steps, nbytes in self.growth.items()]}

    @classmethod
    def from_plain(cls, data: dict) -> SteadyHeap:
        heap = cls(**{**data, "growth": {int(steps): int(nbytes) for steps, nbytes in data["growth"]}})
        counts = (heap.resident, heap.pinned, heap.steps, heap.objects, *heap.defaulted_ops.values())
        if not all(type(n) is int for n in counts) or type(heap.converged) is not bool or type(heap.table) is not dict:
            raise ValueError("expected the heap's figures as integers")
        return heap


def _signatures(events: Sequence[DeviceEvent]) -> dict[int, tuple]:
    """key → (phase, op, bytes, category, rank among allocations of that signature) for a step's births."""
    seen: Counter = Counter()
    out = {}
    for event in events:
        if event.action == "alloc":
            signature = (str(event.phase), event.op, event.nbytes, str(event.category))
            out[event.key] = (signature, seen[signature])
            seen[signature] += 1
    return out


def _moved(event: DeviceEvent, key: int, step: int) -> DeviceEvent:
    """`dataclasses.replace(event, key=key, step=step)` without re-running the dataclass's __init__: a long run's
    copies make hundreds of thousands of these, and replace() took most of compose()'s time (six times slower)."""
    fields = event.__dict__.copy()
    fields["key"], fields["step"] = key, step
    moved = object.__new__(type(event))
    object.__setattr__(moved, "__dict__", fields)  # a frozen dataclass refuses plain attribute assignment
    return moved


def _made_once(events: Sequence[DeviceEvent], own: dict[int, tuple], analogue: dict[int, int | None]) -> set[int]:
    """The template's births that outlive the trace with no counterpart born the step before: made once, not every
    step. DDP rebuilds its gradient buckets at the second step's forward (Reducer::rebuild_buckets); copies that
    made them again held one more set of buckets per step (a 4-step trace holds one)."""
    freed = {event.key for event in events if event.action == "free"}
    return set(own) - freed - {key for key in analogue.values() if key is not None}


def compose(events: Sequence[DeviceEvent], steps: int) -> list[DeviceEvent]:
    """The traced stream followed by copies of its last step up to `steps` steps in all (module docstring).
    A stream of fewer than two traced steps, or `steps` not above the traced count, comes back as it is.

    The trace ends where the traced run ends: the last step's inputs, outputs and loss die there as the
    loop's names go out of scope ("teardown"). In a longer run they die in the next step instead, when the
    loop rebinds those names, as the step before the last shows (its storages of the same signature are
    freed in the last step). So those frees move from the last traced step to the end of the last copy."""
    events = list(events)
    traced = sorted({event.step for event in events if str(event.phase) != "init"})
    if len(traced) < TRACED_STEPS_USED or steps <= len(traced):
        return events
    last, before = traced[-1], traced[-2]
    born: dict[int, int] = {}
    for event in events:
        if event.action == "alloc":
            born[event.key] = event.step
    template = [event for event in events if event.step == last and str(event.phase) != "init"]
    previous = _signatures([event for event in events if event.step == before])
    own = _signatures(template)
    by_signature = {value: key for key, value in own.items()}
    analogue = {key: by_signature.get(value) for key, value in previous.items()}
    freed_in_last = {event.key for event in template if event.action == "free"}
    # the template's storages whose counterpart one step earlier lived into the last step: theirs die at teardown
    outliving = {analogue[key] for key in previous if key in freed_in_last and analogue.get(key) is not None}
    teardown = [event for event in template if event.action == "free" and event.key in outliving]
    teardown_ids = {id(event) for event in teardown}
    once = _made_once(events, own, analogue)
    repeated = [event for event in template if id(event) not in teardown_ids and event.key not in once]
    next_key = max((abs(event.key) for event in events), default=0) + 1
    copies = [event for event in events if id(event) not in teardown_ids]
    renamed = {key: key for key, step in born.items() if step == last}  # the template's own births, as of now
    for step in range(last + 1, last + 1 + steps - len(traced)):
        current: dict[int, int] = {}
        for event in repeated:
            origin = born.get(event.key)
            if event.action == "alloc":
                if origin == last:
                    current[event.key] = next_key
                    next_key += 1
                copies.append(_moved(event, current.get(event.key, event.key), step))
            elif origin == last:
                copies.append(_moved(event, current.get(event.key, renamed.get(event.key, event.key)), step))
            elif origin == before and analogue.get(event.key) is not None:
                copies.append(_moved(event, renamed[analogue[event.key]], step))
            # a storage born before that: freed once in the real run, already freed by the traced step
        renamed = {key: current.get(key, renamed.get(key, key)) for key in renamed}
    final = last + steps - len(traced)
    copies += [_moved(event, renamed.get(event.key, event.key), final) for event in teardown]
    return copies


def steady_heap(events: Sequence[DeviceEvent], heap: Callable, run_steps: int | None = None) -> SteadyHeap:
    """The glibc heap (`heap`, alloc/replay.py glibc_heap) after the run: `run_steps` steps, or, when None,
    MAX_STEPS (within MAX_EVENTS), with the peak after each doubling of the traced steps read off the same replay."""
    traced = len({event.step for event in events if str(event.phase) != "init"})
    limit = MAX_STEPS if run_steps is None else run_steps
    per_step = max(1, len(events) // max(1, traced))
    lengths = []  # the doublings of the traced steps up to the run's length, and that length
    length = traced
    while traced >= TRACED_STEPS_USED and length < limit:
        length = min(limit, length * 2)
        if length * per_step > MAX_EVENTS:
            break
        lengths.append(length)
    steps = lengths[-1] if lengths else traced
    # the collector paused over the copies, the interleave and the replays, whose millions of tuples are all freed
    # before it resumes: resumed while they lived, its first pass walked them all (0.7 s of a 1.3B model's heap)
    with gc_paused():
        result = heap(compose(events, steps), [traced, *lengths[:-1]])
    growth = {**result.growth, steps: result.resident}
    converged = run_steps is not None and steps >= run_steps
    return SteadyHeap(result.resident, result.pinned, steps, converged, growth, result.objects,
                      result.defaulted_ops, result.table)
