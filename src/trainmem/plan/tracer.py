"""Traced figures for one layout at a given block count, data-parallel degree and micro-batch, cached.

One process (dp = tp = pp = 1) goes through the single-process estimate (estimate/orchestrate.py); any other
layout through the distributed engine's `trace_role` / `assemble_role` (estimate/per_rank.py), one trace per
rank role (parallel/roles.py). Each traced role is reduced to reuse.Figures from the target's device stream —
the same stream its allocator replays — and the roles of one pipeline stage to their element-wise maximum (the
most loaded data-parallel class, whichever it is at that size).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.setup.layout import ParallelLayout, Strategy
from trainmem.plan.blocks import ModelFacts, variant
from trainmem.plan.enumerate import Candidate
from trainmem.plan.reuse import Figures
from trainmem.setup import TrainingSetup

NCCL_PART = "NCCL communicators"  # estimate/per_rank.py _with_nccl's process part


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
    # NCCL's communicator buffers depend on the layout's groups, not on what is traced: they leave the traced
    # figure here and are added for the planned layout itself (core.nccl_bytes)
    nccl = estimate.process_parts.get(NCCL_PART, 0)
    return Figures(maxima, estimate.allocated_bytes, estimate.process_bytes_high - nccl, label)


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


class PastTimeLimit(Exception):
    """The planner's time limit passed before a trace it needed (core.assess lists the layout as not evaluated)."""


@dataclasses.dataclass
class RoleTrace:
    """One traced rank role: what assembles it again at another batch size."""

    pp_index: int
    label: str
    role: Any  # parallel.roles.RankRole, None for one process
    traced: Any  # trace.run.TraceResult


class Tracer:
    """Figures per pipeline stage for (candidate's structure, dp, blocks, micro-batch), each traced once.

    Micro-batches 1 and 2 are traced; larger ones are predicted from those two traces, value by value
    (trace/batch_scaling.py, as fit's ScaledBatches does), once a real trace at the first larger micro-batch
    has been found equal to its prediction for that layout and data-parallel degree; when it is not (or the
    two traces are not one stream), every micro-batch of that layout is traced."""

    def __init__(self, source: Any, facts: ModelFacts, setup: TrainingSetup, device: Any, gpus_per_node: int):
        self.source, self.facts, self.setup, self.device = source, facts, setup, device
        self.gpus_per_node = gpus_per_node
        self.cache: dict[tuple, list[Figures]] = {}
        self.alike: dict[tuple, bool] = {}
        self.twins: dict[tuple, bool] = {}  # (ZeRO-3 structure, blocks) -> traced as its FSDP twin (traced_as)
        self.real: dict[tuple, tuple[Any, TrainingSetup, list[RoleTrace]]] = {}
        self.scalable: dict[tuple, Any] = {}  # (structure, dp) -> the confirmed pair of micro-batches, or False
        self.traces = 0  # rank-role traces run
        self.past: Any = lambda: False  # core.run's time limit: checked before each trace
        self.predicted = 0  # rank-role traces predicted from two others
        self.cached = 0  # rank-role traces read from the trace cache (counted in `traces` too)

    def counts(self) -> dict[str, int]:
        return {"traces": self.traces, "predicted": self.predicted, "cached": self.cached}

    def add(self, counts: dict[str, int]) -> None:
        """Counts a worker process made (workers.py)."""
        for name, value in counts.items():
            setattr(self, name, getattr(self, name) + value)

    def setup_for(self, candidate: Candidate, dp: int) -> TrainingSetup:
        layout = dataclasses.replace(candidate, dp=dp).layout(self.gpus_per_node, self.setup.parallel)
        if layout.world_size == 1:
            layout = ParallelLayout()
        return dataclasses.replace(self.setup, precision=candidate.precision, checkpointing=candidate.checkpointing,
                                   batch_size=candidate.batch_size, parallel=layout)

    def ranks_alike(self, candidate: Candidate) -> bool:
        """Whether every data-parallel rank of `candidate` holds shards of the same sizes (parallel/roles.py
        dp_classes of the whole model): then its layout is one role per stage, traced at its own degree."""
        from trainmem.parallel.roles import dp_classes

        key = (candidate.kind, candidate.dp, candidate.tp, candidate.pp)
        if key not in self.alike:
            layout = candidate.layout(self.gpus_per_node, self.setup.parallel)
            try:
                self.alike[key] = len(dp_classes(layout, self.facts.model)) == 1
            except Exception:  # noqa: BLE001 - a layout dp_classes cannot split is traced at two degrees, as before
                self.alike[key] = False
        return self.alike[key]

    def traced_as(self, candidate: Candidate, blocks: int) -> Candidate:
        """The candidate whose rank traces stand for `candidate`'s with `blocks` blocks: a ZeRO-3 layout that makes
        exactly FSDP's fully_shard calls on that model (parallel/zero.py traces_as_fsdp) is traced as the FSDP
        layout, once for both (core.run evaluates the two groups in one worker, the FSDP one first)."""
        if candidate.kind != Strategy.ZERO3:
            return candidate
        key = (candidate.structure(), blocks)
        if key not in self.twins:
            from trainmem.parallel.rank_trace import build_on_meta
            from trainmem.parallel.zero import traces_as_fsdp

            setup = self.setup_for(candidate, candidate.dp)
            model = build_on_meta(variant(self.source, self.facts, blocks), setup)[0]
            self.twins[key] = traces_as_fsdp(model, setup.parallel, setup)
        return dataclasses.replace(candidate, kind=Strategy.FSDP) if self.twins[key] else candidate

    def twinned(self, candidate: Candidate) -> bool:
        """Whether some figure of `candidate` came from its FSDP twin's traces (traced_as)."""
        structure = candidate.structure()
        return any(twin for (of, _), twin in self.twins.items() if of == structure)

    def stages(self, candidate: Candidate, dp: int, blocks: int) -> list[Figures]:
        candidate = self.traced_as(candidate, blocks)
        key = (candidate.structure(), dp, blocks, candidate.micro_batch)
        if key not in self.cache:
            self.cache[key] = self._figures(candidate, dp, blocks)
        return self.cache[key]

    def _figures(self, candidate: Candidate, dp: int, blocks: int) -> list[Figures]:
        family = (candidate.structure(), dp)
        if candidate.micro_batch > 2 and self.scalable.get(family) is not False:
            predicted = self._predicted(candidate, dp, blocks)
            if predicted is not None:
                return predicted
        chosen, setup, roles = self._real(candidate, dp, blocks)
        return self._assembled(chosen, setup, roles)

    def forget(self) -> None:
        """Drop the kept traces (core.run calls it after each group: no later group shares its layouts)."""
        self.real.clear()

    def _real(self, candidate: Candidate, dp: int, blocks: int):
        key = (candidate.structure(), dp, blocks, candidate.micro_batch)
        if key not in self.real:
            from trainmem.estimate.orchestrate import prepare

            if self.past():
                raise PastTimeLimit()

            setup = self.setup_for(candidate, dp)
            chosen = prepare(variant(self.source, self.facts, blocks), setup, self.device, 1)
            self.real[key] = (chosen, setup, self._trace_roles(chosen, setup))
        return self.real[key]

    def _predicted(self, candidate: Candidate, dp: int, blocks: int) -> list[Figures] | None:
        """Figures from traces at two smaller micro-batches — (2, 4) when below, else (1, 2) (batch 1 may trace
        another stream, fit's ScaledBatches says why) — or None where prediction is refuted or impossible."""
        from trainmem.trace.batch_scaling import BatchScaling, StreamsDiffer, Unpredictable

        family = (candidate.structure(), dp)
        setup = self.setup_for(candidate, dp)
        for pair in ((2, 4), (1, 2)):  # the nearer pair first
            if pair[1] >= candidate.micro_batch or self.scalable.get(family) not in (None, pair):
                continue
            keys = [(family[0], dp, blocks, b) for b in pair]
            if not all(key in self.real for key in keys):  # predict from traces made anyway, never trace for it
                continue
            traced = [self._real(dataclasses.replace(candidate, micro_batch=b), dp, blocks) for b in pair]
            try:
                scalings = [BatchScaling(traced[0][1].batch_size, one.traced, traced[1][1].batch_size, two.traced)
                            for one, two in zip(traced[0][2], traced[1][2])]
                roles = [dataclasses.replace(role, traced=scaling.at(setup.batch_size))
                         for role, scaling in zip(traced[0][2], scalings)]
            except (StreamsDiffer, Unpredictable):
                continue
            if family not in self.scalable:  # the family's first prediction is checked against a real trace
                real = self._real(candidate, dp, blocks)[2]
                if not all(s.matches(setup.batch_size, r.traced) for s, r in zip(scalings, real)):
                    self.scalable[family] = False
                    return None
                self.scalable[family] = pair
            else:
                self.predicted += len(roles)
            return self._assembled(traced[0][0], setup, roles)
        return None

    def _assembled(self, chosen: Any, setup: TrainingSetup, roles: list[RoleTrace]) -> list[Figures]:
        from trainmem.estimate.orchestrate import assemble_traced

        by_stage: dict[int, list[Figures]] = {}
        for role in roles:
            if role.role is None:
                estimate = assemble_traced(chosen, setup, role.traced)
            else:
                from trainmem.estimate.per_rank import assemble_role

                estimate = assemble_role(chosen, setup, role.role, role.traced)
            by_stage.setdefault(role.pp_index, []).append(figures_of(chosen.target, role.traced, estimate, role.label))
        label = (lambda stage: f"pp stage {stage}") if setup.parallel.pp > 1 else (lambda stage: "all ranks")
        return [merged(figs, label(stage)) for stage, figs in sorted(by_stage.items())]

    def _trace_roles(self, chosen: Any, setup: TrainingSetup) -> list[RoleTrace]:
        from trainmem.estimate.orchestrate import trace

        if not setup.parallel.distributed:
            return [RoleTrace(0, "all ranks", None, self._counted(trace(chosen, setup)))]
        from trainmem.estimate.per_rank import trace_role  # the engine (estimate/per_rank.py)
        from trainmem.parallel.roles import rank_roles
        from trainmem.parallel.rank_trace import build_on_meta

        model = build_on_meta(chosen.source, setup)[0]
        out = []
        for role in traced_roles(rank_roles(setup.parallel, model), setup.parallel, model):
            out.append(RoleTrace(role.pp_index, role.label, role, self._counted(trace_role(chosen, setup, role))))
        return out

    def _counted(self, traced: Any) -> Any:
        self.traces += 1
        self.cached += traced.cache_use is not None and traced.cache_use.used == "reused"
        return traced
