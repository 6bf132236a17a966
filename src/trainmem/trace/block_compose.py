"""The trace of a model with L identical blocks, composed from the trace of the same model cut to k blocks.

A transformer's layers run the same ops on the same shapes in every layer, so the trace of layer 40 is the
trace of layer 1 with other storage ids and module names. Tracing three layers and composing the other 77 costs
a fraction of tracing 80 (trace/block_reuse.py decides when, and checks each use).

How the k-block trace (blocks 0 … k-1 of the list at `path`) becomes the L-block one. The template is block 1:
neither the first block (which takes the embedding's output) nor the last (which feeds the head).

1. Every event belongs to a block or to none. An event inside a module belongs to that module's block (none for
   the embedding, the head, the loss). An event outside every module is the optimizer's or zero_grad's work,
   or a free as Python or autograd drops a reference: an allocation belongs to the block of its storage's
   module, or of the module it was computed from (Trace.owner_hints: an optimizer temporary from its parameter's
   state). A free outside every module, or in the module whose loop runs the blocks, belongs to the block that
   last ran or allocated when its storage is that block's or a neighbour's: in forward and backward (the loop
   drops the previous block's output between two blocks), and in the optimizer when that block goes on after it
   (its loop drops the previous parameter's temporary); else to its storage's block (zero_grad, a foreach
   optimizer dropping its lists at the end). An allocation that ends a block's run and is freed in the next
   block's run of that phase is the next block's.
2. Each run of the template's consecutive events is repeated L - k + 1 times in the direction the blocks around
   it go: ascending where the previous block comes before it (forward, the optimizer, zero_grad), descending
   where the next block does (backward). Blocks after the template move up by L - k.
3. A storage belongs to the block whose event allocated it. An event of block b that refers to a storage of
   block o refers, in the composed trace, to the storage at the same place (the same kind — phase, step, op and
   size — and the same rank among the block's storages of that kind) of the block at the same distance b - o:
   a block frees its own saved tensors, the previous block's output, the next one's gradient, wherever it sits.
4. Storage ids are renumbered in allocation order, as the recorder numbers them, and so is every event's `seq`:
   the composed trace is, event for event, the one the recorder gives the whole model (checked, block_reuse.py).
5. Where the plain rules do not compose: a run of c·k allocations of one kind outside every block, nothing between
   them but each one's own free, is c per block of the k traced (the i-th and its free are block i // c's:
   transformers' DynamicCache makes an 8-byte sliding-window tensor per sliding layer before the first runs,
   cache_utils.py; FSDP1 makes and drops a buffer per unit as its forward starts), and an allocation
   outside every block amid one block's events is that block's (Mixtral's router gradient, summed in backward by no
   module); the check decides (block_reuse.py). Alternating blocks (Gemma-2) compose as runs of `period` blocks.
Kernel calls go with the event their first output allocated (or the event before them, when they allocated
none); the sets of host, managed and offloaded storages, the checkpointed modules and the output sizes per
module are copied the same way.
"""

from __future__ import annotations

import dataclasses

from trainmem.trace.events import Event, KernelCall, Phase, Trace

TEMPLATE = 1  # the block that is repeated: the first middle block
# phases in which an event outside every module runs in the model's own forward (or its backward): the root module's
_MODULE_PHASES = frozenset({Phase.FORWARD, Phase.LOSS, Phase.BACKWARD})
COUNT_MARKS = ("zero_grad probed", "end")  # lean-loop marks that hold op counts, not storages (trace/run.py)


class NotComposable(Exception):
    """The traced blocks do not compose (said why); the model is traced whole."""


@dataclasses.dataclass(frozen=True)
class Stack:
    """A list of blocks at `path`, traced with `traced` units (runs of `period` blocks), composed to `total` units."""

    path: str
    traced: int  # in units of `period` blocks, as `total`
    total: int
    period: int = 1  # blocks per unit: a model whose blocks alternate (Gemma-2's sliding and global layers) repeats pairs

    @property
    def extra(self) -> int:
        return self.total - self.traced

    def index_of(self, module: str) -> int | None:
        """The list index of the block `module` is in (None: outside the list)."""
        prefix = self.path + "."
        if not module.startswith(prefix):
            return None
        head = module[len(prefix):].split(".", 1)[0]
        return int(head) if head.isdigit() else None

    def block_of(self, module: str) -> int | None:
        """The unit `module` is in: its block, or the run of `period` blocks that block is one of."""
        index = self.index_of(module)
        return None if index is None else index // self.period

    def moved(self, block: int, copy: int) -> int:
        """Where old `block` lands: the template's copy `copy`, the ones before it unmoved, the rest moved up."""
        if block == TEMPLATE:
            return TEMPLATE + copy
        return block if block < TEMPLATE else block + self.extra

    def renamed(self, module: str, copy: int) -> str:
        index = self.index_of(module)
        if index is None:
            return module
        unit, offset = divmod(index, self.period)
        old, new = f"{self.path}.{index}", f"{self.path}.{self.moved(unit, copy) * self.period + offset}"
        return new + module[len(old):]


def attribution(trace: Trace, stack: Stack, per_block_runs: bool = False) -> list[int | None]:
    """Each event's block (module docstring, 1.; with `per_block_runs`, 5.)."""
    events = trace.events
    owners = [stack.block_of(trace.storages[e.sid].module or trace.owner_hints.get(e.sid, "")) for e in events]
    out: list[int | None] = [None] * len(events)
    # frees outside every module, or in the module whose loop runs the blocks (and its ancestors): settled below
    loops = {stack.path.rsplit(".", k)[0] for k in range(1, stack.path.count(".") + 1)}
    loose = [e.action == "free" and (not e.module or e.module in loops) for e in events]
    running: list[int | None] = [None] * len(events)  # the block that last ran or allocated, in this phase and step
    last: dict[tuple[Phase, int], int | None] = {}
    for index, event in enumerate(events):
        where = (event.phase, event.step)
        if not loose[index]:
            out[index] = last[where] = stack.block_of(event.module) if event.module else owners[index]
        running[index] = last.get(where)
    following: dict[tuple[Phase, int], int | None] = {}  # the block of the next event that is not a loose free
    for index in range(len(events) - 1, -1, -1):
        where = (events[index].phase, events[index].step)
        if not loose[index]:
            following[where] = out[index]
            continue
        block, owner, event = running[index], owners[index], events[index]
        if block is None or (owner is not None and abs(owner - block) > 1):
            out[index] = owner
        elif event.phase in _MODULE_PHASES:  # the loop over the blocks drops a name between two of them
            out[index] = block
        else:  # the optimizer's loop: a temporary of the parameter before, while the running block goes on after it
            out[index] = block if owner is not None and following.get(where) == block else owner
    _joined_to_next(events, out)
    if per_block_runs:
        _per_block_runs(events, out, stack.traced)
    return out


def _per_block_runs(events: list[Event], blocks: list[int | None], units: int) -> None:
    """Runs of allocations of one kind (phase, step, module, op, size) outside every block, nothing between them but
    each one's own free (FSDP1 makes and drops a buffer per unit as its forward starts), as many as a multiple c of
    the traced units: the i-th is unit i // c's storage, made for it by the module that runs the blocks, and so is its
    free (module docstring, 5.)."""
    def kind(index: int) -> tuple | None:  # None: not an allocation outside every block
        e = events[index]
        return (e.phase, e.step, e.module, e.op, e.nbytes) if e.action == "alloc" and blocks[index] is None else None

    def width(index: int) -> int:  # 2 where the allocation's own free follows it at once
        after = events[index + 1] if index + 1 < len(events) else None
        return 2 if after is not None and after.action == "free" and after.sid == events[index].sid else 1

    mine: dict[int, int] = {}
    start = 0
    while start < len(events):
        found, step = kind(start), width(start)
        stop = start + step
        while found is not None and stop < len(events) and kind(stop) == found and width(stop) == step:
            stop += step
        count = (stop - start) // step
        if found is not None and count % units == 0:
            for n in range(count):
                blocks[start + n * step] = mine[events[start + n * step].sid] = n // (count // units)
        start = stop if found is not None else start + 1
    _frees_follow(events, blocks, mine)
    _sandwiched(events, blocks)


def _sandwiched(events: list[Event], blocks: list[int | None]) -> None:
    """An allocation outside every block between two events of one block in the same phase and step is that block's
    (a router's gradient summed in a mixture of experts' backward, by no module); so is its free."""
    previous: dict[tuple, int | None] = {}
    pending: list[int] = []
    mine: dict[int, int] = {}
    for index, event in enumerate(events):
        where = (event.phase, event.step)
        if blocks[index] is None and event.action == "alloc":
            pending.append(index)
            continue
        if blocks[index] is None:
            continue
        for waiting in pending:
            if (events[waiting].phase, events[waiting].step) == where and previous.get(where) == blocks[index]:
                blocks[waiting] = mine[events[waiting].sid] = blocks[index]
        pending = []
        previous[where] = blocks[index]
    _frees_follow(events, blocks, mine)


def _frees_follow(events: list[Event], blocks: list[int | None], mine: dict[int, int]) -> None:
    """The free of each storage in `mine` (sid -> block) goes to that block."""
    for index, event in enumerate(events):
        if event.action == "free" and event.sid in mine:
            blocks[index] = mine[event.sid]


def _joined_to_next(events: list[Event], blocks: list[int | None]) -> None:
    """Allocations that end one block's run and are freed in the next block's run of the same phase belong to the
    next block: they are made as it starts, while the previous module is still the current one (the RNG state a
    checkpointed block restores before recomputing its forward in backward). Walked backwards, so that several
    join."""
    freed_at = {event.sid: index for index, event in enumerate(events) if event.action == "free"}
    for index in range(len(events) - 2, -1, -1):
        event, mine, following = events[index], blocks[index], blocks[index + 1]
        if event.action != "alloc" or mine is None or following is None or following == mine:
            continue
        end = freed_at.get(event.sid)
        if end is not None and blocks[end] == following and (events[end].phase, events[end].step) == \
                (event.phase, event.step):
            blocks[index] = following


class _Composer:
    def __init__(self, trace: Trace, stack: Stack, per_block_runs: bool) -> None:
        self.trace, self.stack = trace, stack
        self.blocks = attribution(trace, stack, per_block_runs)
        self.owner: dict[int, int | None] = {}
        self.latest = 0  # the template's copy emitted last (compose)
        # (block, kind) -> the block's storages of that kind (phase, step, op, bytes) in allocation order: a storage's
        # counterpart in another block is the one of its kind at its place (the first block may allocate fewer in
        # all: no gradient for the model's input)
        self.allocated: dict[tuple, list[int]] = {}
        self.kind: dict[int, tuple] = {}
        self.position: dict[int, int] = {}
        for event, block in zip(trace.events, self.blocks):
            if event.action == "alloc":
                self.owner[event.sid] = block
                self.kind[event.sid] = (event.phase, event.step, event.op, event.nbytes)
                mine = self.allocated.setdefault((block, self.kind[event.sid]), [])
                self.position[event.sid] = len(mine)
                mine.append(event.sid)
        if set(self.owner) != set(trace.storages):
            raise NotComposable("a storage without an allocation event")
        if TEMPLATE not in self.owner.values():
            raise NotComposable(f"block {TEMPLATE} allocated nothing")

    def storage(self, sid: int, block: int | None, copy: int) -> tuple[int, int]:
        """(old sid, copy) that an event of old `block`, in the template's copy `copy`, refers to by `sid`."""
        owner = self.owner[sid]
        if owner is None:
            return sid, 0
        if block is None:  # outside the blocks: a template storage is the copy that ran last (the encoder's end
            return sid, self.latest if owner == TEMPLATE else 0  # drops the last blocks' outputs)
        at = self.stack.moved(block, copy) - (block - owner)  # the owner's place in the composed stack
        extra = self.stack.extra
        if TEMPLATE <= at <= TEMPLATE + extra:
            old, copy_of = TEMPLATE, at - TEMPLATE
        else:
            old, copy_of = (at if at < TEMPLATE else at - extra), 0
        mine = self.allocated.get((old, self.kind[sid]), [])
        if at < 0 or self.position[sid] >= len(mine):
            raise NotComposable(f"block {block}'s storage {sid} has no counterpart in block {old}")
        return mine[self.position[sid]], copy_of

    def runs(self) -> list[tuple[int, int, range]]:
        """(start, stop, copies in order) for each part of the event list: runs of the template repeated."""
        events, blocks, parts, i = self.trace.events, self.blocks, [], 0
        while i < len(events):
            j = i + 1
            while j < len(events) and (blocks[j] == TEMPLATE) == (blocks[i] == TEMPLATE):
                j += 1
            if blocks[i] != TEMPLATE:
                parts.append((i, j, range(1)))
            else:
                descending = self._descending(i, j)
                copies = range(self.stack.extra + 1)
                parts.append((i, j, copies[::-1] if descending else copies))
            i = j
        return parts

    def _descending(self, start: int, stop: int) -> bool:
        before = next((b for b in reversed(self.blocks[:start]) if b is not None and b != TEMPLATE), None)
        after = next((b for b in self.blocks[stop:] if b is not None and b != TEMPLATE), None)
        return before == TEMPLATE + 1 or (before is None and after == TEMPLATE - 1)


def compose(trace: Trace, stack: Stack, checkpointed: list[str], output_elements: dict[str, int],
            per_block_runs: bool = False):
    """(trace, checkpointed, output_elements) of the model with stack.total blocks (module docstring)."""
    composer = _Composer(trace, stack, per_block_runs)
    calls = _anchored_calls(trace.kernel_calls)
    ids: dict[tuple[int, int], int] = {}
    events, kernel_calls, pending = [], [], []
    before = [call for call, _ in calls.get(-1, [])]
    kernel_calls += [dataclasses.replace(call, at_seq=0) for call in before]
    starts: dict[int, int] = {}  # old index -> its place in the composed list (a template run: its first event's)
    for start, stop, copies in composer.runs():
        starts[start] = len(events)
        if len(copies) == 1:
            starts.update((index, len(events) + index - start) for index in range(start, stop))
        for copy in copies:
            composer.latest = copy
            for index in range(start, stop):
                event, block = trace.events[index], composer.blocks[index]
                key = composer.storage(event.sid, block, copy)
                if event.action == "alloc":
                    if key in ids:
                        raise NotComposable(f"storage {event.sid} allocated twice in copy {copy}")
                    ids[key] = len(ids)
                elif key not in ids:
                    raise NotComposable(f"storage {event.sid} freed before it is allocated in copy {copy}")
                pending += [(call, len(events) + after, block, copy) for call, after in calls.get(index, [])]
                events.append(Event(len(events), event.action, event.nbytes, ids[key], event.phase,
                                    stack.renamed(event.module, copy), event.op, event.step))
    for call, at, block, copy in pending:  # its outputs' ids once all are allocated
        sids = tuple(None if s is None else ids.get(composer.storage(s, block, copy)) for s in call.output_sids)
        kernel_calls.append(dataclasses.replace(call, at_seq=at, output_sids=sids))
    storages, copies_of = _storages(trace, ids, stack)
    sets = {name: {new for old in getattr(trace, name) for new in copies_of.get(old, [])}
            for name in ("host_storages", "managed_storages", "offloaded_storages")}
    marks = [_mark(mark, starts, len(trace.events), len(events), copies_of, stack) for mark in trace.loop_marks]
    composed = Trace(events, storages, kernel_calls, **sets, loop_marks=marks)
    return composed, composed_names(checkpointed, stack), dict(zip(composed_names(list(output_elements), stack),
                                                           _values(output_elements, stack)))


def _anchored_calls(kernel_calls: list[KernelCall]) -> dict[int, list[tuple[KernelCall, bool]]]:
    """Event index -> the kernel calls that go with it, and whether each is placed after it (a call that allocated
    nothing goes with the event before it)."""
    calls: dict[int, list[tuple[KernelCall, bool]]] = {}
    for call in kernel_calls:
        after = call.outputs_allocated == 0
        calls.setdefault(call.at_seq - 1 if after else call.at_seq, []).append((call, after))
    return calls


def _storages(trace: Trace, ids: dict[tuple[int, int], int], stack: Stack):
    """(the composed storage records by new sid, old sid -> its new sids)."""
    storages, copies_of = {}, {}
    for (old, copy), new in ids.items():
        record = trace.storages[old]
        storages[new] = dataclasses.replace(record, sid=new, module=stack.renamed(record.module, copy))
        copies_of.setdefault(old, []).append(new)
    return dict(sorted(storages.items())), copies_of


def _mark(mark: list, starts: dict[int, int], old_length: int, length: int, copies_of: dict[int, list[int]],
          stack: Stack) -> list:
    """A lean loop's mark (trace/loop_twin.py) in the composed trace: at the same place between parts, its storages
    with every copy of the template's. Op counts ("zero_grad probed", "end") are block_reuse.py's to extrapolate."""
    kind, position, phase, module, step, held = mark
    if position == old_length:
        at = length
    elif position in starts:
        at = starts[position]
    else:
        raise NotComposable(f"a loop mark ({kind}) inside block {TEMPLATE}'s events")
    if kind not in COUNT_MARKS:
        held = sorted(new for sid in held for new in copies_of.get(sid, []))
    return [kind, at, phase, stack.renamed(module, 0), step, held]


def _copies(name: str, stack: Stack) -> range:
    return range(stack.extra + 1) if stack.block_of(name) == TEMPLATE else range(1)


def composed_names(names: list[str], stack: Stack) -> list[str]:
    """Module names of the k-block model as the whole model has them, the template's repeated."""
    return [stack.renamed(name, copy) for name in names for copy in _copies(name, stack)]


def _values(table: dict[str, int], stack: Stack) -> list[int]:
    return [value for name, value in table.items() for _ in _copies(name, stack)]
