"""How the planner reuses a few small traces for many layouts, and why its figures are never below a full
estimate's (tests/test_plan.py checks them against full estimates of small models).

1. Blocks. A transformer is a stack of identical blocks; what a rank holds of each block's parameters, gradients,
   optimizer state and saved activations is the same for every block. So the model is traced with k = 3 and 4 of its
   repeated blocks (the outermost nn.ModuleList cut short, trace/checkpointing.py's find_blocks; the rest of the
   model — embeddings, head — whole), and each figure is extrapolated to the model's L blocks as a line through the
   two points. A figure is not one number: the peak is a maximum over time, and the maximum of lines is not a line
   (the peak may sit in the optimizer step for 1 block and at the end of forward for 80). So each traced run is
   reduced to the maximum live bytes of each category (parameters, gradients, optimizer state, activations,
   temporaries, communication, …) in each phase (forward, backward, optimizer, …), as the allocator charges them;
   each of those is a maximum over a structurally fixed set of moments and grows by a block's share per block. The
   extrapolated peak is the largest, over phases, of the sum of its categories' extrapolated maxima — at least the
   real peak (a sum of maxima bounds the maximum of sums) and close to it, because within one phase the categories
   peak together. The first blocks are special, so the points start at 3 and the slope is the step from 3 to 4, never
   below 0 (a trace at 2 blocks, as before 2026-12-07, only named a series whose 2→3 step differed from its 3→4 one:
   it never moved a figure, and it cost a third of the traces). FSDP all-gathers the next block ahead, so a 1-block
   model holds one unsharded block and every longer one two (measured on Llama-3.1-70B with FSDP and offload:
   parameters 3.55, 5.51, 5.51 GiB at 1, 2, 3 blocks); and only from 3 blocks is there a middle block, whose backward
   holds its own reduce-scatter input beside the next block's prefetched all-gather output (FSDP2 keeps one reduce-
   scatter state, comm_ctx): on the same 70B layout allocated is 13.46, 15.09, 15.23, 15.37 GiB at 2-5 blocks, so a
   line through 1-3 blocks climbed 1.63 GiB a block and put the 80-block model at 171 GB against 38.7 GB fully traced
   (55.5 GB from 3-4). A series that accelerates has its steepest step last. The allocator's own peak is extrapolated
   as a line too, and the figure is at least that line plus the overhead: it catches a peak moment whose bytes grow
   faster than the category maxima (measured on Llama-3.1-70B, FSDP with offloaded parameters, dp 2: communication at
   the allocated peak 3.19 → 4.78 GiB from 2 to 3 blocks, while the backward's largest communication stayed 7.83
   GiB). What the allocator and the runtime add beyond the live bytes (rounding, cached blocks, the CUDA context) is
   extrapolated the same way.
2. Micro-batch. Micro-batches 1 and 2 are traced (2 and 4 where batch 1 traces another stream); larger ones are
   predicted from those two traces value by value (trace/batch_scaling.py, fit's ScaledBatches), once per layout a
   real trace at the first predicted micro-batch is found equal to its prediction (else all traced).
3. Data-parallel degree. A rank's sharded states are exact padded shards (ceil(dim0 / dp) rows per parameter), so
   every figure is U + W/dp plus at most one padded row per parameter tensor. With dp ≤ 4, or when every rank's
   shards have the same sizes (one data-parallel class, parallel/roles.py: one role to trace, as cheap as a trace at
   dp 2), the layout itself is traced; otherwise dp = 2 and dp = 4 are traced and each figure is extrapolated in
   1/dp, plus PADDING_BYTES_PER_ELEMENT × (one row of every parameter) to cover the padding. DDP's figures do not
   depend on dp ≥ 2 (full replicas, full buckets): dp = 2 stands for all. HSDP depends on its shard degree only:
   traced with that shard degree and 2 replicas.
4. Twins. A ZeRO-3 layout whose ranks make exactly the fully_shard calls of the FSDP layout of the same degrees
   (parallel/zero.py traces_as_fsdp) traces the same events (tests/test_plan_twins.py holds the traces equal where
   the check says twins, and unequal where it does not): it takes the FSDP layout's figures (tracer.py traced_as).
Every extrapolated figure is rounded up to whole MiB.

What this does not prove: a per-(phase, category) maximum is a maximum over moments, each moment's bytes a line
in the blocks (or in 1/dp); a maximum of lines bends upwards, so a line through traced points is below it beyond
them when the moment that holds the maximum changes past the traced sizes (a fixed-size temporary that leads at
3-4 blocks, overtaken at 80 by one that grows per block). The step from 3 to 4 catches a change within the
traced sizes only; tests/test_plan.py compares the planner with full estimates of small models, and
benchmarks/plan_vs_full.py every layout of one on 8 GPUs (46 layouts: none below, at most +0.88%, 2026-12-07).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

MiB = 1 << 20
# fp32 parameter + fp32 gradient + Adam's two fp32 moments: the most bytes a sharded element costs a rank
PADDING_BYTES_PER_ELEMENT = 16
# Two steps of one series are "the same" within the CUDA allocator's rounding of a few blocks (512 B each,
# alloc/cuda_caching.py round_size): a difference this small is rounding, not a second slope.
AFFINE_SLACK = 64 << 10


@dataclasses.dataclass(frozen=True)
class Figures:
    """One traced rank role reduced to what extrapolates: (phase, category) -> maximum live bytes in that phase;
    the allocator's allocated peak; the high process figure (nvidia-smi's, or peak RSS on the CPU)."""

    maxima: dict[tuple[str, str], int]
    allocated: int
    process: int
    label: str = "all ranks"
    not_affine: tuple[str, ...] = ()  # series whose two steps differed (after extrapolation)

    @property
    def overhead(self) -> int:
        """What the process holds beyond the allocated peak (cached blocks, context, libraries)."""
        return max(0, self.process - self.allocated)

    def bound(self) -> tuple[int, str, str]:
        """(bytes, phase, dominating category): the largest over phases of the sum of its categories' maxima."""
        by_phase: dict[str, dict[str, int]] = {}
        for (phase, category), value in self.maxima.items():
            by_phase.setdefault(phase, {})[category] = value
        best = (0, "", "")
        for phase, cats in by_phase.items():
            total = sum(cats.values())
            if total > best[0]:
                best = (total, phase, max(cats, key=cats.get))
        return best

    def peak(self) -> int:
        """The planner's per-rank figure: the bound of the live bytes plus the process overhead, at least the
        traced process figure itself."""
        return max(self.process, self.bound()[0] + self.overhead)

    def breakdown(self) -> dict[str, int]:
        _, phase, _ = self.bound()
        return {category: value for (p, category), value in self.maxima.items() if p == phase}


def round_up(value: float) -> int:
    return int(math.ceil(value / MiB)) * MiB


def _line(points: Sequence[tuple[float, int]], at: float) -> tuple[int, bool]:
    """The value at `at` of the line through the last two points (never falling), rounded up; and whether the
    points were on one line."""
    slopes = [(v2 - v1) / (x2 - x1) for (x1, v1), (x2, v2) in zip(points, points[1:])]
    slope = max(0.0, slopes[-1])
    last_x, last_v = points[-1]
    value = max(v for _, v in points) if at <= last_x else last_v + slope * (at - last_x)
    affine = all(abs((s - slopes[0]) * (points[1][0] - points[0][0])) <= AFFINE_SLACK for s in slopes)
    return round_up(value), affine


def extrapolate(points: Sequence[tuple[float, Figures]], at: float, axis: str) -> Figures:
    """Figures at `at` from figures at increasing x (blocks, or 1/dp read as x); axis names the series in
    `not_affine`."""
    if len(points) == 1 or at == points[-1][0]:
        return next((f for x, f in points if x == at), points[-1][1])
    keys = sorted(set().union(*(f.maxima for _, f in points)))
    maxima, odd = {}, list(points[-1][1].not_affine)
    for key in keys:
        maxima[key], affine = _line([(x, f.maxima.get(key, 0)) for x, f in points], at)
        if not affine:
            odd.append(f"{axis}: {key[1]} in {key[0]}")
    overhead, affine = _line([(x, f.overhead) for x, f in points], at)
    if not affine:
        odd.append(f"{axis}: process overhead")
    allocated, _ = _line([(x, f.allocated) for x, f in points], at)
    process = max(round_up(max(f.process for _, f in points)), allocated + overhead)
    return Figures(maxima, allocated, process, points[-1][1].label, tuple(dict.fromkeys(odd)))


def _towards_zero(points: Sequence[tuple[float, int]], at: float) -> int:
    """The value at `at` (smaller than every x) of a line in x through the point of smallest x, with the
    gentlest slope among consecutive points (never below 0): sharding removes at most that much per unit."""
    ordered = sorted(points)
    slopes = [(v2 - v1) / (x2 - x1) for (x1, v1), (x2, v2) in zip(ordered, ordered[1:])]
    slope = max(0.0, min(slopes))
    x0, v0 = ordered[0]
    return round_up(v0 - slope * (x0 - at))


def over_dp(points: Sequence[tuple[int, Figures]], dp: int, padding_bytes: int) -> Figures:
    """Figures at data-parallel degree `dp` from figures traced at smaller degrees: each series a line in 1/dp
    (module docstring, 3.), plus `padding_bytes` added to the peak phase's largest category."""
    exact = next((f for d, f in points if d == dp), None)
    if exact is not None or len(points) == 1:
        return exact or points[0][1]
    at = 1.0 / dp
    keys = sorted(set().union(*(f.maxima for _, f in points)))
    maxima = {key: _towards_zero([(1.0 / d, f.maxima.get(key, 0)) for d, f in points], at) for key in keys}
    overhead = _towards_zero([(1.0 / d, f.overhead) for d, f in points], at)
    allocated = _towards_zero([(1.0 / d, f.allocated) for d, f in points], at)
    first = min(points, key=lambda p: p[0])[1]
    result = Figures(maxima, allocated, allocated + overhead, first.label, first.not_affine)
    _, phase, category = result.bound()
    maxima[(phase, category)] += round_up(padding_bytes)
    return dataclasses.replace(result, maxima=maxima)
