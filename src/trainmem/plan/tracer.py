"""Traced figures for one layout at a given block count, data-parallel degree and micro-batch, cached.

One process (dp = tp = pp = 1) goes through the single-process estimate (estimate/orchestrate.py); any other
layout through the distributed engine's `trace_role` / `assemble_role` (estimate/distributed.py), one trace per
rank role (parallel/roles.py). Each traced role is reduced to reuse.Figures from the target's device stream —
the same stream its allocator replays — and the roles of one pipeline stage to their element-wise maximum (the
most loaded data-parallel class, whichever it is at that size).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.parallel.layout import ParallelLayout
from trainmem.plan.blocks import ModelFacts, variant
from trainmem.plan.enumerate import Candidate
from trainmem.plan.reuse import Figures
from trainmem.setup import TrainingSetup


def stream_maxima(stream_events: list, charged) -> dict[tuple[str, str], int]:
    """(phase, category) -> the most bytes of that category live at any moment of that phase, each block as
    the allocator charges it."""
    live: dict[str, int] = {}
    maxima: dict[tuple[str, str], int] = {}
    phase = None
    for event in stream_events:
        if str(event.phase) != phase:  # a new phase starts with whatever is live
            phase = str(event.phase)
            for cat, value in live.items():
                maxima[(phase, cat)] = max(maxima.get((phase, cat), 0), value)
        category = str(event.category)
        size = charged(event.nbytes)
        value = live[category] = live.get(category, 0) + (size if event.action == "alloc" else -size)
        if value > maxima.get((phase, category), 0):
            maxima[(phase, category)] = value
    return maxima


def figures_of(target: Any, traced: Any, estimate: Any, label: str) -> Figures:
    stream = target.device_stream(traced.trace)
    events = stream.events_high if stream.events_high is not None else stream.events
    maxima = stream_maxima(events, target.allocator().charged)
    return Figures(maxima, estimate.allocated_bytes, estimate.process_bytes_high, label)


def merged(figures: list[Figures], label: str) -> Figures:
    """The element-wise maximum of several roles' figures."""
    keys = set().union(*(f.maxima for f in figures))
    maxima = {key: max(f.maxima.get(key, 0) for f in figures) for key in keys}
    allocated = max(f.allocated for f in figures)
    overhead = max(f.overhead for f in figures)
    return Figures(maxima, allocated, max(max(f.process for f in figures), allocated + overhead), label)


def traced_roles(roles: list, layout: ParallelLayout, model: Any) -> list:
    """The roles worth tracing. Under GPipe and 1F1B a pipeline stage holds its own layers and at most as many
    micro-batches in flight as any later stage (1F1B: stage s keeps pp - s; GPipe: all, on every stage); so a
    middle stage is never above an earlier middle stage with at least its parameters, and only the first
    stage, the last and the middle stages no earlier one dominates are traced. Interleaved 1F1B (several
    stages per rank) and layouts without a pipeline trace every role."""
    if layout.pp == 1 or str(layout.schedule) == "interleaved-1f1b":
        return roles
    from trainmem.parallel.pp_split import stage_parameter_counts

    counts = stage_parameter_counts(model, layout)
    kept, best_middle = {0, layout.pp - 1}, -1
    for stage in range(1, layout.pp - 1):
        if counts[stage] > best_middle:
            kept.add(stage)
            best_middle = counts[stage]
    return [role for role in roles if role.pp_index in kept]


class Tracer:
    """Figures per pipeline stage for (candidate's structure, dp, blocks, micro-batch); each traced once."""

    def __init__(self, source: Any, facts: ModelFacts, setup: TrainingSetup, device: Any, gpus_per_node: int):
        self.source, self.facts, self.setup, self.device = source, facts, setup, device
        self.gpus_per_node = gpus_per_node
        self.cache: dict[tuple, list[Figures]] = {}
        self.traces = 0  # rank-role traces run

    def setup_for(self, candidate: Candidate, dp: int) -> TrainingSetup:
        layout = dataclasses.replace(candidate, dp=dp).layout(self.gpus_per_node, self.setup.parallel)
        if layout.world_size == 1:
            layout = ParallelLayout()
        return dataclasses.replace(self.setup, precision=candidate.precision, checkpointing=candidate.checkpointing,
                                   batch_size=candidate.batch_size, parallel=layout)

    def stages(self, candidate: Candidate, dp: int, blocks: int) -> list[Figures]:
        key = (candidate.structure(), dp, blocks, candidate.micro_batch)
        if key not in self.cache:
            self.cache[key] = self._trace(candidate, dp, blocks)
        return self.cache[key]

    def _trace(self, candidate: Candidate, dp: int, blocks: int) -> list[Figures]:
        from trainmem.estimate.orchestrate import assemble_traced, plan, trace

        setup = self.setup_for(candidate, dp)
        source = variant(self.source, self.facts, blocks)
        chosen = plan(source, setup, self.device, 1)
        if not setup.parallel.distributed:
            traced = trace(chosen, setup)
            self.traces += 1
            return [figures_of(chosen.target, traced, assemble_traced(chosen, setup, traced), "all ranks")]
        return self._trace_roles(chosen, setup)

    def _trace_roles(self, chosen: Any, setup: TrainingSetup) -> list[Figures]:
        from trainmem.estimate.distributed import assemble_role, trace_role  # the engine (estimate/distributed.py)
        from trainmem.parallel.roles import rank_roles
        from trainmem.trace import step as training
        from trainmem.trace.meta_build import building_on_meta

        with building_on_meta():
            model = training.unpack_built(chosen.source.build(), chosen.source)[0]
        by_stage: dict[int, list[Figures]] = {}
        for role in traced_roles(rank_roles(setup.parallel, model), setup.parallel, model):
            traced = trace_role(chosen, setup, role)
            self.traces += 1
            estimate = assemble_role(chosen, setup, role, traced)
            by_stage.setdefault(role.pp_index, []).append(figures_of(chosen.target, traced, estimate, role.label))
        return [merged(figs, f"pp stage {stage}" if setup.parallel.pp > 1 else "all ranks")
                for stage, figs in sorted(by_stage.items())]
