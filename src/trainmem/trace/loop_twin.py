"""The inline loop's trace from the lean loop's: one trace gives the estimate and its lean-loop line.

Why it is exact. The two loops (trace/loops.py) run the same ops in the same order: they differ only in when the
loop's own names let go of what they hold. The lean loop drops each name as early as it can (`del outputs` before
backward, `del loss, inputs` after it, zero_grad right after the step); the inline loop keeps each until the next
iteration rebinds it (or the loop ends), and zeroes the gradients at the start of the next step. A storage the
lean loop's name held dies, in the lean trace, at the drop or later (when autograd let go of it); in the inline
loop it dies at the later of that moment and the inline drop. So the inline trace is the lean one with those frees
moved later, and nothing else: the same allocations in the same order, the same storages.

The lean loop marks where each name is bound and dropped and which storages a dropped name held (Trace.loop_marks;
trace/run.py RecordingObserver.loop_mark). The inline loop drops, for micro-step i:
- the batch when micro-step i+1's batch is made (INPUTS), then, at the first micro-step of a step, the last
  step's gradients (ZERO_GRAD; the inline loop never frees the last step's: they outlive the loop);
- the output when micro-step i+1's output is made (end of FORWARD), the loss when its loss is made (LOSS, inside
  the autocast region, before the cast cache is cleared);
- what the last micro-step holds when the loop returns (after the last optimizer step): the batch, the output and
  the loss, in that order (the order Python frees a dict's values).
What the autograd graph itself holds past backward dies with the graph. Backward releases the tensors saved with
save_for_backward, not what a custom Function keeps on its context as an attribute (bitsandbytes' MatMul4Bit before
0.43.2 kept each 4-bit layer's input as `ctx.tensors`): the graph frees those when the last name holding it goes.
In the lean loop that is `del loss` (the output was dropped before backward), so the frees that `del loss, inputs`
makes are the batch's and the loss's own tensors, and the graph's; the inline loop holds the graph through its
`loss` name, so the graph's go when the loss is rebound, with the loss (an output tensor freed there was the
graph's too: the output's name was already gone).
Frees at one place keep the lean trace's relative order (the same objects freed the same way). A forward output
the lean loop's `del` made a temporary (dead when backward starts) stays an activation where the inline loop
still holds it then (recorder.settle_forward's rule).

Only the default `zero_grad` (set_to_none=True) is derived: with zero_grad zeroing in place, the two loops run
their zero_ ops at different places. tests/test_loop_twin.py holds the derived trace equal, event for event and
storage for storage, to a trace of the inline loop on the zoo.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

from trainmem.setup import Loop, TrainingSetup, ZeroGrad
from trainmem.trace.events import Category, Event, Phase, Trace
from trainmem.trace.traced import TraceResult


def derivable(setup: TrainingSetup) -> bool:
    """Whether the inline loop of `setup` can be derived from the lean loop's trace (module docstring)."""
    return (setup.loop == Loop.INLINE and setup.zero_grad == ZeroGrad.NONE and not setup.compile
            and not setup.parallel.distributed)


@dataclasses.dataclass(frozen=True)
class _Move:
    """A free the inline loop makes later: before the lean event at `position`, with these labels."""

    position: int
    rank: int  # the order among frees inserted at one position (then the lean trace's own order)
    phase: Phase
    module: str
    step: int


def inline_from_lean(lean: TraceResult) -> TraceResult | None:
    """The inline loop's TraceResult derived from the lean loop's, or None when the lean trace carries no marks
    (a loop the frontend runs itself, as a Keras model's model.fit)."""
    marks = lean.trace.loop_marks
    if not marks or marks[0][0] != "lean" or any(mark[0] == "incomplete" for mark in marks):
        return None
    trace = lean.trace
    moves, kept, promoted = _moves(marks, trace.events)
    inserted: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # position -> [(rank, lean index, sid)]
    moved_away = set()  # the lean frees that come before the inline loop's drop (they move there), or never happen
    for index, event in enumerate(trace.events):
        if event.action != "free":
            continue
        move = moves.get(event.sid)
        if move is not None and index < move.position:
            moved_away.add(index)
            inserted[move.position].append((move.rank, index, event.sid))
        elif event.sid in kept:
            moved_away.add(index)
    events: list[Event] = []
    new_index: dict[int, int] = {}
    for index in range(len(trace.events) + 1):
        for _, _, sid in sorted(inserted.get(index, ())):
            move, record = moves[sid], trace.storages[sid]
            events.append(Event(len(events), "free", record.nbytes, sid, move.phase, move.module, record.op,
                                move.step))
        if index == len(trace.events):
            break
        if index not in moved_away:
            new_index[index] = len(events)
            events.append(dataclasses.replace(trace.events[index], seq=len(events)))
    storages = {sid: dataclasses.replace(record, category=Category.ACTIVATIONS) if sid in promoted
                else dataclasses.replace(record) for sid, record in trace.storages.items()}
    calls = [dataclasses.replace(call, at_seq=new_index[call.at_seq]) if call.at_seq in new_index else call
             for call in trace.kernel_calls]
    derived = Trace(events, storages, calls, set(trace.host_storages), set(trace.managed_storages),
                    set(trace.offloaded_storages))
    return dataclasses.replace(lean, trace=derived, op_counts=_inline_op_counts(lean.op_counts, marks))


def _freed_at(position: int, marks: list[list], events: list[Event]) -> list[int]:
    """The storages the lean loop's `del` at `position` freed: the frees that follow it, up to the next event that
    is not a free or the next mark past it."""
    stop = min((mark[1] for mark in marks if mark[1] > position), default=len(events))
    freed = []
    for event in events[position:stop]:
        if event.action != "free":
            break
        freed.append(event.sid)
    return freed


def _inline_op_counts(counts: Counter, marks: list[list]) -> Counter:
    """The lean loop's op counts less its last zero_grad (the inline loop never zeroes the last step's gradients)
    plus one zero_grad without gradients (the inline loop's first), both measured in the lean trace."""
    deltas = {mark[0]: Counter({op: n for op, n in mark[5]}) for mark in marks
              if mark[0] in ("zero_grad probed", "end")}
    out = Counter(counts)
    out.subtract(deltas.get("end", Counter()))
    out.update(deltas.get("zero_grad probed", Counter()))
    return Counter({op: n for op, n in out.items() if n})


def _moves(marks: list[list], events: list[Event]) -> tuple[dict[int, _Move], set[int], set[int]]:
    """Where the inline loop frees what the lean loop's names held (module docstring), what it never frees (the
    last step's gradients), and the forward temporaries of the lean trace that the inline loop keeps alive into
    backward (activations there)."""
    made: dict[str, list[list]] = defaultdict(list)  # batch|output|loss -> where each micro-step bound it
    dropped: dict[str, list[list]] = defaultdict(list)  # batch|output|loss|grads -> what each drop let go of
    settled: list[list] = []
    stepped: list[list] = []
    for mark in marks[1:]:
        kind = mark[0]
        if kind in ("batch", "output", "loss"):
            made[kind].append(mark)
        elif kind.startswith("dropped "):
            dropped[kind.removeprefix("dropped ")].append(mark)
        elif kind == "settled":
            settled.append(mark)
        elif kind == "stepped":
            stepped.append(mark)
    end = stepped[-1]  # the loop returns after the last optimizer step
    moves: dict[int, _Move] = {}
    for order, name in enumerate(("batch", "output", "loss")):
        for micro, drop in enumerate(dropped[name]):
            later = made[name][micro + 1] if micro + 1 < len(made[name]) else None
            where = later if later is not None else end
            move = _Move(where[1], 0 if later is not None else order, Phase(where[2]), where[3], where[4])
            for sid in drop[5]:  # at the loop's end: the batch, then the output, then the loss
                moves[sid] = move
            if name == "loss":  # the graph's tensors go with the loss (module docstring)
                batch = set(dropped["batch"][micro][5])
                moves.update((sid, move) for sid in _freed_at(drop[1], marks, events) if sid not in batch)
    micro_steps = len(made["batch"]) // max(1, len(stepped))
    for step, drop in enumerate(dropped["grads"][:-1]):
        batch = made["batch"][(step + 1) * micro_steps]
        for sid in drop[5]:  # after the old batch is dropped: zero_grad comes after the new batch is made
            moves[sid] = _Move(batch[1], 1, Phase.ZERO_GRAD, batch[3], step + 1)
    kept = set(dropped["grads"][-1][5]) if dropped["grads"] else set()  # the last step's: they outlive the loop
    promoted = {sid for mark in settled for sid in mark[5] if sid in moves and moves[sid].position > mark[1]}
    return moves, kept, promoted
