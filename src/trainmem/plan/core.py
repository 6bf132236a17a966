"""`plan()`: every layout for COUNT GPUs (enumerate.py), those that model states alone rule out left out
(states.py), the rest estimated from a few reused traces (reuse.py, tracer.py) and ranked by headroom."""

from __future__ import annotations

import dataclasses
import functools
import math
import time

from trainmem.errors import failure_reason
from trainmem.setup.layout import Offload, Strategy
from trainmem.plan import enumerate as layouts
from trainmem.plan.blocks import ModelFacts
from trainmem.plan.offload_order import ROUNDING_SLACK, OffloadOrder, offload_rank
from trainmem.plan.reuse import PADDING_BYTES_PER_ELEMENT, Figures, extrapolate, over_dp
from trainmem.plan.plan_result import PlanRow
from trainmem.plan.states import model_state_floor
from trainmem.plan.tracer import PastTimeLimit, Tracer
from trainmem.units import format_bytes

BLOCK_POINTS = (3, 4)  # blocks per pipeline stage traced for the line (reuse.py, 1.: why not from 1 or 2)
DP_POINTS = (2, 4)  # data-parallel degrees traced for the line in 1/dp (reuse.py, 3.)
REUSE_WORDS = ("each layout's rank roles traced with 3 and 4 blocks per pipeline stage and extrapolated to "
               "the model's blocks per (phase, category) maximum; micro-batches above 2 predicted from two traced "
               "ones (checked once per layout); data-parallel degrees above 4 whose ranks do not all hold alike "
               "shards from traces at 2 and 4 as lines in 1/dp plus a padded row per parameter; ZeRO-3 layouts that "
               "make FSDP's fully_shard calls take the FSDP layout's traces; figures rounded up to MiB "
               "(trainmem/plan/reuse.py)")


def dp_points(candidate: layouts.Candidate, tracer: Tracer) -> tuple[int, ...]:
    """The data-parallel degrees traced for `candidate` (reuse.py, 3.)."""
    dp, gpus_per_node = candidate.dp, tracer.gpus_per_node
    if dp <= DP_POINTS[-1] or tracer.ranks_alike(candidate):
        return (dp,)  # one role traced at the layout's own degree: no more than the two points would cost
    if candidate.kind == Strategy.DDP:
        return (2,)  # full replicas and buckets: the same for every dp ≥ 2
    if candidate.kind == Strategy.HSDP:
        shard = candidate.layout(gpus_per_node).hsdp_shard
        return (min(dp, 2 * shard),)  # only the shard degree moves memory; 2 replicas stand for any number
    return DP_POINTS


def block_points(facts: ModelFacts, pp: int) -> tuple[tuple[int, ...], int]:
    """(blocks per stage to trace, blocks per stage to extrapolate to): the most loaded stage holds ceil(L / pp)."""
    per_stage = math.ceil(facts.blocks / pp) if facts.blocks else 0
    if facts.blocks == 0 or per_stage <= BLOCK_POINTS[-1]:
        return (per_stage,), per_stage
    return BLOCK_POINTS, per_stage


def figures_for(tracer: Tracer, candidate: layouts.Candidate) -> Figures:
    """The most loaded rank's figures for `candidate` (max over pipeline stages of each stage's extrapolation)."""
    facts, pp = tracer.facts, candidate.pp
    ks, full = block_points(facts, pp)
    per_dp = []
    for dp in dp_points(candidate, tracer):
        # traced models hold k blocks per stage; the whole model when it has no repeated blocks
        traced = {k: tracer.stages(candidate, dp, k * pp if facts.blocks else 0) for k in ks}
        stages = [extrapolate([(k, traced[k][s]) for k in ks], full, "blocks") for s in range(len(traced[ks[0]]))]
        per_dp.append((dp, stages))
    padding = facts.row_elements * PADDING_BYTES_PER_ELEMENT if candidate.dp > per_dp[-1][0] else 0
    stage_figures = [over_dp([(dp, stages[s]) for dp, stages in per_dp], candidate.dp, padding)
                     for s in range(len(per_dp[0][1]))]
    return max(stage_figures, key=lambda f: f.peak())


def assess(tracer: Tracer, candidate: layouts.Candidate, budget: int) -> PlanRow:
    """One candidate's row: its figure against the budget, or why it could not be traced (status "failed")."""
    try:
        figures = figures_for(tracer, candidate)
    except PastTimeLimit:
        return PlanRow(candidate, "not evaluated", why="past the time limit")
    except Exception as error:  # noqa: BLE001 - a layout that cannot be traced (a strategy this torch lacks, a
        # model the layout cannot split) has no figure: it is listed as failed with why, never as not fitting
        return PlanRow(candidate, "failed", why=failure_reason(error))
    nccl = nccl_bytes(candidate.layout(tracer.gpus_per_node, tracer.setup.parallel), tracer.device)
    peak = figures.peak() + nccl
    _, phase, dominant = figures.bound()
    how = "extrapolated" + (f"; not affine: {', '.join(figures.not_affine)}" if figures.not_affine else "")
    if tracer.twinned(candidate):
        how += "; traced as fsdp (the same fully_shard calls: parallel/zero.py traces_as_fsdp)"
    return PlanRow(candidate, "fits" if peak <= budget else "does not fit", peak, phase, dominant,
                   figures.breakdown(), figures.label, how)


@functools.lru_cache(maxsize=4096)
def nccl_bytes(layout, device) -> int:
    """NCCL's buffers on the rank that holds the most (targets/nccl.py: its groups and node-local members)."""
    if layout.world_size == 1:
        return 0
    try:
        from trainmem.targets.nccl import nccl_process_bytes
    except ImportError:
        return 0
    return max(nccl_process_bytes(layout, rank, device)[0] for rank in range(layout.world_size))


def least_first(candidate: layouts.Candidate) -> tuple:
    """The order knobs are tried in at one micro-batch: no offload before optimizer before params (offload
    is slower than recomputation), no checkpointing before checkpointing."""
    return (offload_rank(candidate.offload), candidate.checkpointing)


def evaluate(tracer: Tracer, candidates: list[layouts.Candidate], budget: int, past=lambda: False) -> list[PlanRow]:
    """Rows for the candidates of one (kind, dp, tp, pp, precision). Per micro-batch, from the smallest, the
    knobs are tried least intrusive first (least_first) and the first that fits is kept: the costlier ones at
    that micro-batch are skipped (they are not needed). A knob with less offload than one found not to fit is
    ruled out without a trace (offload_order.py, which may assess the most offload first). When nothing fits at a
    micro-batch, the larger ones are skipped (more samples never need less memory); when every one at a
    micro-batch failed, so are the larger ones (a failure is no verdict, and the same failure would repeat)."""
    rows: list[PlanRow] = []
    by_batch: dict[int, list[layouts.Candidate]] = {}
    for candidate in candidates:
        by_batch.setdefault(candidate.micro_batch, []).append(candidate)
    order = offload_order(tracer, budget)
    none_fit = None
    for batch in sorted(by_batch):
        fitted, statuses = None, set()
        probed = order.probe(by_batch[batch]) if none_fit is None and not past() else {}
        for candidate in sorted(by_batch[batch], key=least_first):
            if none_fit is not None or fitted is not None:
                rows.append(PlanRow(candidate, "skipped", why=none_fit or f"{fitted} fits with less"))
                continue
            row = probed.get(candidate) or order.ruled_out(candidate)
            if row is None and past():
                rows.append(PlanRow(candidate, "not evaluated", why="past the time limit"))
                continue
            row = row or assess(tracer, candidate, budget)
            rows.append(row)
            statuses.add(row.status)
            if row.status == "fits":
                fitted = _knobs(candidate)
        if fitted is None and none_fit is None:
            none_fit = _none_fit(batch, statuses)
    return rows


def offload_order(tracer: Tracer, budget: int) -> OffloadOrder:
    """offload_order.py's probes for one group, with the slack of this model's largest block."""
    facts = tracer.facts

    def floor(candidate: layouts.Candidate) -> int:
        setup = dataclasses.replace(tracer.setup, precision=candidate.precision)
        return model_state_floor(facts.parameters, candidate.layout(tracer.gpus_per_node), setup)

    return OffloadOrder(budget, ROUNDING_SLACK + 2 * 4 * facts.unit_parameters, floor,
                        lambda c: assess(tracer, c, budget))


def _none_fit(batch: int, statuses: set[str]) -> str | None:
    """Why the larger micro-batches are skipped, from what happened at `batch` (None: they are still tried)."""
    if "does not fit" in statuses or "ruled out" in statuses:
        failed = " of those evaluated" if "failed" in statuses else ""
        return f"nothing{failed} fits at micro-batch {batch} (more samples never need less memory)"
    if "failed" in statuses:
        return f"every layout at micro-batch {batch} failed (larger ones not tried)"
    return None  # nothing assessed (the time limit): the larger ones are listed as not evaluated


def _knobs(candidate: layouts.Candidate) -> str:
    words = ["checkpointing" if candidate.checkpointing else "no checkpointing",
             "no offload" if candidate.offload == Offload.NONE else f"offload {candidate.offload}"]
    return " and ".join(words)


def screen(candidates: list[layouts.Candidate], facts: ModelFacts, tracer: Tracer, budget: int):
    """(rows ruled out by model states alone, candidates left with their floor), states.py's floor against
    the budget."""
    ruled, left = [], []
    for candidate in candidates:
        setup = dataclasses.replace(tracer.setup, precision=candidate.precision)
        floor = model_state_floor(facts.parameters, candidate.layout(tracer.gpus_per_node), setup)
        if floor > budget:
            ruled.append(PlanRow(candidate, "ruled out", floor, why=f"model states alone need at least "
                                 f"{format_bytes(floor)} per rank (no trace)"))
        else:
            left.append((floor, candidate))
    return ruled, left


def _jobs(left: list) -> list[list[list[layouts.Candidate]]]:
    """The groups of one (kind, dp, tp, pp, precision), the simplest first (_simplest_first), as the jobs a worker
    runs: a ZeRO-3 group with the FSDP group of the same degrees and precision, FSDP's first, so that a ZeRO-3
    layout traced as its FSDP twin (tracer.py traced_as) finds that trace made; every other group alone."""
    groups: dict[tuple, list] = {}
    for floor, candidate in left:
        key = (candidate.kind, candidate.dp, candidate.tp, candidate.pp, candidate.precision)
        groups.setdefault(key, []).append((floor, candidate))
    jobs: dict[tuple, list] = {}
    for (kind, *rest), members in groups.items():
        family = Strategy.FSDP if kind == Strategy.ZERO3 else kind
        jobs.setdefault((family, *rest), []).append((kind == Strategy.ZERO3, members))
    ordered = sorted(jobs.values(), key=lambda pairs: _simplest_first(min(pairs, key=lambda p: p[0])[1]))
    return [[[c for _, c in members] for _, members in sorted(pairs, key=lambda p: p[0])] for pairs in ordered]


def _simplest_first(members: list) -> tuple:
    """Fewer model-parallel ranks first (no pipeline bubble, fewer TP all-reduces), then the lower floor."""
    first = members[0][1]
    return (first.tp * first.pp, first.pp, min(f for f, _ in members), str(first))


def run(tracer: Tracer, candidates: list[layouts.Candidate], budget: int, progress, time_limit: float | None,
        started: float, jobs: int = 1) -> list[PlanRow]:
    """Groups of one (kind, dp, tp, pp, precision), the simplest first (_simplest_first), in `jobs` worker
    processes (workers.py); past `time_limit` seconds the rest are listed as not evaluated."""
    from trainmem.plan.workers import each_group

    ruled, left = screen(candidates, tracer.facts, tracer, budget)
    order = _jobs(left)
    progress.total(len(left))
    past = lambda: time_limit is not None and time.perf_counter() - started > time_limit  # noqa: E731
    tracer.past = past

    def one_group(job: list[list[layouts.Candidate]]) -> tuple[list[PlanRow], dict[str, int]]:
        if past():
            return [PlanRow(c, "not evaluated", why="past the time limit") for group in job for c in group], {}
        from trainmem.parallel.world import kept_worlds

        before = tracer.counts()
        with kept_worlds():  # the job's traces of one (dp, tp, pp) share one fake world (world.py)
            rows = [row for group in job for row in evaluate(tracer, group, budget, past)]
        tracer.forget()
        return rows, {name: value - before[name] for name, value in tracer.counts().items()}

    def done(index: int, counts: dict[str, int], in_worker: bool) -> None:
        if in_worker:  # counted in the worker's own copy of the tracer
            tracer.add(counts)
        progress.advance(sum(len(group) for group in order[index]))

    rows = list(ruled)
    for group_rows in each_group(one_group, order, jobs, done, None if time_limit is not None else _heaviest_first(order)):
        rows += group_rows
    return rows


def _heaviest_first(order: list[list[list[layouts.Candidate]]]) -> list[int]:
    """The jobs' indices, those likely to take longest first, for workers that run without a time limit: a pipeline
    rank traces each micro-batch through its stage (Llama-3.1-70B's plan on 8 GPUs, timed one job at a time on 2026-12-07:
    8-9 s a layout's traces at pp 4, 1-2 s at pp 1), tensor parallelism adds DTensor's dispatch; so more stages, then more
    tensor-parallel ranks, then more layouts. Handed out in that order, the last job to finish is a short one, where
    the simplest-first order (kept under a time limit: the simplest layouts are answered first) ends on the longest."""
    def weight(index: int) -> tuple:
        first = order[index][0][0]
        return (-first.pp, -first.tp, -sum(len(group) for group in order[index]), index)

    return sorted(range(len(order)), key=weight)
