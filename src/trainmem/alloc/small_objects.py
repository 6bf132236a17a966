"""The runtime's small objects, interleaved with the tensor stream, for the glibc replay.

Why: after glibc's dynamic mmap threshold has risen (alloc/cpu_heap.py), large tensors come from the heap.
Between them the C++ and Python runtime allocates small objects of its own (TensorImpls and
StorageImpls, autograd nodes and saved variables, oneDNN primitive descriptors and their cache
entries, Python buffers). One that outlives the tensor allocated just before it sits above that
tensor's chunk: the chunk cannot merge into the top when it is freed, the heap cannot be trimmed, and
the next large tensor that does not fit the hole extends the heap. A replay of the tensors alone misses
this pinning and is low (benchmarks/results/glibc_fidelity.md).

What: `targets/data/cpu_small_objects.json`, derived by benchmarks/calibrate_small_objects.py from
malloc logs of real runs (an LD_PRELOAD shim), gives for each op kind, phase and step (first step or
later) the objects allocated after one of that op's tensor allocations, per allocation: request size,
whether it is a 64-byte posix_memalign (oneDNN's own allocator) or a plain malloc, and when it is
freed relative to the tensor stream:
- ["companion"]: with the tensor it followed (its TensorImpl/StorageImpl);
- ["same", n]: n stream events later, within the same phase (n is a power of two, the log2 bin);
- ["phase", phase, step_offset, quarter]: in a later phase (autograd nodes die in backward, gradient
  wrappers at zero_grad), a quarter of the way into it;
- ["cached"]: still alive when the steps end: cache entries keyed by shapes, placed at the first
  allocation of each (op, phase, bytes) signature only (a GRU's 64 time steps add one set, not 64);
- ["transient"]: before the next tensor event; replayed as a malloc followed at once by its free.
The transient ones matter: they keep the tcache and bins stocked, so that longer-lived objects reuse
old chunks instead of being carved from the top right after a tensor. On a logged run of cnn_bn (batch 16,
Adam) the model
replays the whole log to 78 MiB, 79 MiB with each transient object freed at once, 118 MiB without the
transient objects, and 150 MiB with them all freed at the end of their gap.
An op the table lacks takes the average of its phase, and the estimate says so.

Families: the objects between two tensor allocations are made by whatever code runs between the ops, so the
table has one set of rows per kind of model code. "torch" (plain nn.Modules: the zoo, torchvision, timm) and
"transformers" (its modules run hooks, kwargs handling, attention dispatch and ModelOutput building between
ops). Measured on two steps of GPT-2 with LoRA (batch 2, seq 128, Adam; its malloc log aligned with its trace),
held out from both calibrations: the real objects replayed on the estimate's stream hold the heap at 1,315 MiB;
rows calibrated on that run alone, 1,269; the "torch" rows, 1,122 (forward rows: 13.7 live objects per `add`
output against 6.1-7.1 in the zoo, 18 per `clone` against 0); the "transformers" rows (tests/data/tiny_llama,
its LoRA, DistilBERT), 1,189 (tiny_llama's alone, 1,242). A model takes the transformers rows when one of its
modules' own classes is defined there (frontends/libraries.py code_libraries).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from trainmem.alloc.gc_paused import gc_paused

DATA = Path(__file__).resolve().parents[1] / "targets" / "data" / "cpu_small_objects.json"


class Action(NamedTuple):
    """One step of the interleaved replay: a tensor event or a runtime object's malloc/free. A named
    tuple rather than a frozen dataclass: a replay makes hundreds of thousands of them, and a tuple
    is made three times faster."""

    action: str  # "alloc" | "free"
    key: object
    nbytes: int = 0
    aligned: bool = True  # tensors and oneDNN objects: posix_memalign(64); others: malloc
    transient: bool = False  # an object freed at once: this one action stands for its malloc and free


@lru_cache(maxsize=1)
def load_table() -> dict:
    return json.loads(DATA.read_text())


def family_of(libraries) -> str:
    """The table's row set for a model whose modules come from `libraries` (frontends/libraries.py)."""
    return "transformers" if "transformers" in libraries else "torch"


def family_rows(table: dict, family: str) -> dict:
    """{"ops", "phases", "source"} of one family: "torch" at the table's top level, the others under "families"."""
    return table if family == "torch" else table["families"][family]


def family_facts(family: str) -> dict:
    """What an estimate says about its rows (and keeps in its cache entry): the family's source, the spread."""
    table = load_table()
    return {"family": family, "source": family_rows(table, family)["source"], "spread": table["spread"]}


def row_key(op: str, phase: str, first_step: bool) -> str:
    return f"{op}|{phase}|{'first' if first_step else 'later'}"


def segments(stream) -> tuple[list[tuple[int, str, int, int]], list[int]]:
    """Contiguous runs of one (step, phase): (step, phase, start, end) and each event's run index."""
    runs, owner = [], []
    for index, event in enumerate(stream):
        if not runs or (runs[-1][0], runs[-1][1]) != (event.step, str(event.phase)):
            runs.append([event.step, str(event.phase), index, index])
        runs[-1][3] = index
        owner.append(len(runs) - 1)
    return [tuple(r) for r in runs], owner


def first_signatures(stream) -> set[int]:
    """Stream indices of the first allocation of each (op, phase, bytes) signature: where a cache keyed
    by shapes (oneDNN's primitive cache, 1024 entries by default) adds an entry; later ones hit it."""
    seen, firsts = set(), set()
    for index, event in enumerate(stream):
        signature = (event.op, str(event.phase), event.nbytes)
        if event.action == "alloc" and str(event.phase) != "init" and signature not in seen:
            seen.add(signature)
            firsts.add(index)
    return firsts


def death_index(life: list, index: int, runs, owner) -> int | None:
    """The stream index after which an object born after event `index` is freed (None: never)."""
    run = runs[owner[index]]
    if life[0] == "same":
        return min(index + life[1], run[3])
    if life[0] == "phase":
        _, phase, step_offset, quarter = life
        target, step_end = run[0] + step_offset, None
        for step, name, start, end in runs[owner[index] + 1:]:
            if step == target:
                if name == phase:
                    return start + (end - start) * quarter // 4
                step_end = end
            elif step_end is not None:
                break
        # that step has no tensor event in the phase (SGD with momentum allocates nothing in its optimizer step
        # after the first): the object dies as the step ends, where the phase runs, not never. Never leaked the
        # objects of every step of a long run, and the modelled heap crept: tests/models.py:resnet_small batch 8
        # with momentum 156, 166, 170, 215, 255 MiB after 2, 4, 8, 16, 32 steps, now 161, 176, 176, 178, 178,
        # where its real malloc log replayed through glibc holds 168, 172, 180 MiB after 2, 8, 32 steps (peak
        # RSS 477, 493, 496 MiB; AMD EPYC Zen 4, torch 2.13.0, 2026-12-07); tiny_gpt batch 4 with momentum 257
        # MiB after 32 steps, now 106 (its real peak RSS 416 MiB, 107 above the process floor)
        return step_end
    return None  # "never"


@dataclasses.dataclass
class Interleaved:
    actions: list[Action]
    objects: int  # runtime objects placed
    defaulted_ops: dict[str, int]  # op|phase -> tensor allocations that took their phase's average
    step_starts: dict[int, int] = dataclasses.field(default_factory=dict)  # step -> index of its first action


def _templates(table: dict, event, first: bool, defaulted: dict[str, int]) -> list:
    key = row_key(event.op, str(event.phase), first)
    row = table["ops"].get(key)
    if row is None:
        row = table["phases"].get(row_key("*", str(event.phase), first))
        defaulted[f"{event.op}|{event.phase}"] += 1
    return row["objects"] if row else []


def interleave(stream, table: dict | None = None, family: str = "torch") -> Interleaved:
    """The tensor stream with the runtime's objects placed after the tensor allocations that precede
    them and freed where the table says. Fractional rates accumulate per (row, template), so an
    object that follows every fourth convolution output is placed after every fourth one."""
    with gc_paused():
        return _interleave(stream, family_rows(table or load_table(), family))


def _interleave(stream, table: dict) -> Interleaved:
    runs, owner = segments(stream)
    first_step = min((e.step for e in stream if str(e.phase) != "init"), default=0)
    births: dict[int, list[Action]] = defaultdict(list)
    deaths: dict[int, list[Action]] = defaultdict(list)
    companions: dict[object, list[Action]] = defaultdict(list)
    defaulted: dict[str, int] = defaultdict(int)
    # per (op, phase, first step): its object templates and one running credit per template
    rows: dict[tuple, tuple[list, list[float]]] = {}
    # a death in a later phase depends on the run the object was born in, not on where in it
    later_phase_deaths: dict[tuple, int | None] = {}
    firsts = first_signatures(stream)
    count = 0
    new = tuple.__new__  # Action(...) runs a Python-level __new__: twice the cost, a million objects a long run
    for index, event in enumerate(stream):
        if event.action != "alloc":
            continue
        phase = str(event.phase)
        if phase == "init":
            continue
        row = (event.op, phase, event.step == first_step)
        found = rows.get(row)
        if found is None:
            templates = [(nbytes, bool(aligned), life[0], life, rate)
                         for nbytes, aligned, life, rate in _templates(table, event, row[2], defaulted)]
            found = rows[row] = (templates, [0.0] * len(templates))
        elif row[0] + "|" + row[1] in defaulted:
            defaulted[row[0] + "|" + row[1]] += 1
        templates, credits = found
        first_of_signature = index in firsts
        transient_sizes: set[tuple] = set()
        born = None
        for slot, (nbytes, aligned, kind, life, rate) in enumerate(templates):
            if kind == "cached" and not first_of_signature:
                continue
            credit = credits[slot] + rate
            placed = int(credit)
            credits[slot] = credit - placed
            if not placed:
                continue
            if born is None:
                born = births[index]
            if kind == "transient":
                # a second malloc+free of one size in the same gap finds the first one's chunk in the
                # tcache (or fastbin) and leaves the heap as it was: replay the first only
                count += placed
                if (nbytes + 15 >> 4, aligned) not in transient_sizes:
                    transient_sizes.add((nbytes + 15 >> 4, aligned))
                    born.append(new(Action, ("alloc", ("object", count), nbytes, aligned, True)))
                continue
            if kind == "companion":
                end = None
            elif kind == "phase":
                memo = (owner[index], *life[1:])
                if memo not in later_phase_deaths:
                    later_phase_deaths[memo] = death_index(life, index, runs, owner)
                end = later_phase_deaths[memo]
            else:
                end = death_index(life, index, runs, owner)
            for _ in range(placed):
                count += 1
                key = ("object", count)
                born.append(new(Action, ("alloc", key, nbytes, aligned, False)))
                if kind == "companion":
                    companions[event.key].append(new(Action, ("free", key, 0, True, False)))
                elif end is not None:
                    deaths[end].append(new(Action, ("free", key, 0, True, False)))
    actions, step_starts = _assemble(stream, births, deaths, companions)
    return Interleaved(actions, count, dict(defaulted), step_starts)


def _assemble(stream, births: dict, deaths: dict, companions: dict) -> tuple[list[Action], dict[int, int]]:
    """The tensor events with the objects' births and deaths after them, and where each step's actions begin."""
    actions: list[Action] = []
    step_starts: dict[int, int] = {}
    for index, event in enumerate(stream):
        if event.step not in step_starts:
            step_starts[event.step] = len(actions)
        actions.append(Action(event.action, event.key, event.nbytes))
        if event.action == "free" and companions:
            actions.extend(companions.pop(event.key, ()))
        if births:
            actions.extend(births.pop(index, ()))
        if deaths:
            actions.extend(deaths.pop(index, ()))
    return actions, step_starts
