"""`trainmem fit`: the largest batch (or sequence length) whose high estimate stays under the device's
capacity less a safety margin.

Each candidate is a full estimate: memory is not affine in the batch (the allocator rounds and
splits blocks, workspaces and the CUDA context are fixed), so the search doubles until a candidate
does not fit, then bisects between the last fit and the first miss. A candidate fits when its high
estimate (`process_bytes_high`: the upper end of what real runs of the setup show) is at most
`capacity × (1 − margin)`. The margin covers what the high estimate has still been seen to miss: its
default is the worst low error measured for the counter fit compares (DEFAULT_MARGIN below). When
even 1 does not fit, the usual remedies are estimated rather than guessed: checkpointing and mixed
precision by tracing again with them, an 8-bit optimizer and sharding by rule on the traced breakdown.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trainmem.errors import SetupError
from trainmem.estimate import Estimate, estimate
from trainmem.setup import ADAM_FAMILY, InputSpec, Precision, TrainingSetup
from trainmem.units import format_bytes

SHARDING_WORLD = 8  # the remedy is shown for one node of 8 GPUs


@dataclasses.dataclass(frozen=True)
class Margin:
    """A fraction of the capacity kept free, and where it comes from."""

    fraction: float
    source: str


# The default margins are the worst low error (estimate below measured) recorded for the counter fit
# compares, rounded up to the next whole percent: if a real run can exceed our estimate by that much, a
# batch whose estimate fills the card to the brim would run out of memory. tests/test_fit.py reads both
# results files and fails when they record a worse low error than these, or when a regenerated table
# leaves a constant stale.
# GPU: benchmarks/results/accuracy_gpu.md (2026-12-03), rows whose settings are published, the process
# (nvidia-smi) and reserved columns (a reserved row bounds nvidia-smi's relative error: the context adds
# the same bytes to measured and estimated); worst -13.17%, hf-doc-bert-large-b4-fp16 (nvidia-smi, V100).
# The margin is applied to the high estimate although the table's errors are the expected figure's:
# the high end is at least the expected figure, so the margin covers the table's worst row either way.
DEFAULT_MARGIN_GPU = Margin(0.14, "benchmarks/results/accuracy_gpu.md: worst low error of the nvidia-smi and "
                                  "reserved rows, -13.17% (hf-doc-bert-large-b4-fp16), rounded up")
# CPU: benchmarks/results/accuracy_cpu.md (2026-12-03), the peak RSS error column; worst -12.32%,
# resnet_small batch 32 adam.
DEFAULT_MARGIN_CPU = Margin(0.13, "benchmarks/results/accuracy_cpu.md: worst low error of peak RSS, "
                                  "-12.32% (resnet_small, batch 32, adam), rounded up")


def resolve_margin(margin: float | None, device_kind: str) -> Margin:
    """The margin to keep: the caller's (0 ≤ m < 1), else the default for the device's kind."""
    if margin is None:
        return DEFAULT_MARGIN_GPU if device_kind == "cuda" else DEFAULT_MARGIN_CPU
    try:
        value = float(margin)
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 <= value < 1.0:  # NaN fails this too
        raise SetupError(f"expected --margin as a fraction of the capacity, 0 ≤ m < 1 (e.g. 0.1), got {margin!r}",
                         where="--margin")
    return Margin(value, "--margin")


def compared_figure(device_kind: str) -> str:
    counter = "nvidia-smi" if device_kind == "cuda" else "peak RSS"
    return f"process_bytes_high (the high estimate of {counter})"


@dataclasses.dataclass
class Remedy:
    what: str
    process_bytes: int  # the expected figure with the change
    how: str  # "traced again" or the rule used
    process_bytes_high: int = 0  # the high figure with the change, which decides whether it fits

    def saving(self, base: int) -> int:
        return base - self.process_bytes_high


@dataclasses.dataclass
class FitResult:
    dimension: str  # "batch size" or "sequence length"
    best: int | None  # the largest value that fits; None when even 1 does not
    best_estimate: Estimate | None
    first_miss: int | None  # the smallest value found not to fit (None: the search limit fits)
    miss_estimate: Estimate | None
    tried: list[tuple[int, int, int, bool]]  # (value, process bytes, their high estimate, fits within the budget)
    remedies: list[Remedy]
    device_name: str
    capacity: int
    margin: Margin = DEFAULT_MARGIN_GPU
    compared: str = "process_bytes_high"

    @property
    def budget(self) -> int:
        """What a candidate's high estimate may reach: the capacity less the margin."""
        return int(self.capacity * (1.0 - self.margin.fraction))

    @property
    def headroom(self) -> int | None:
        """Capacity less the best candidate's high estimate (None when nothing fits)."""
        return None if self.best_estimate is None else self.capacity - self.best_estimate.process_bytes_high

    def __str__(self) -> str:
        lines = [f"trainmem fit — {self.device_name} ({format_bytes(self.capacity)}), searching the {self.dimension}",
                 f"  a candidate fits when {self.compared} ≤ {format_bytes(self.budget)}, "
                 f"keeping a {self.margin.fraction:.0%} margin", f"  margin from {self.margin.source}"]
        for value, _, nbytes, fits in self.tried:
            lines.append(f"  {self.dimension} {value:>8,}: {format_bytes(nbytes):>11s}  {'fits' if fits else 'does not fit'}")
        return "\n".join(lines + [""] + (self._answer() if self.best is not None else self._remedies()))

    def _answer(self) -> list[str]:
        est = self.best_estimate
        lines = [f"Largest {self.dimension} that fits: {self.best:,}",
                 f"  high estimate {format_bytes(est.process_bytes_high)} (expected {format_bytes(est.process_bytes)}) "
                 f"of {format_bytes(self.capacity)}: headroom {format_bytes(self.headroom)} "
                 f"({self.headroom / self.capacity:.1%}; the margin asks for {self.margin.fraction:.0%})",
                 f"  peak in {est.peak_phase} (op {est.peak_op}); at the peak: "
                 + ", ".join(f"{k} {format_bytes(v)}" for k, v in est.breakdown.items() if v)]
        if self.first_miss is None:
            return lines + [f"  (the search stopped at its limit, {self.tried[-1][0]:,}, which still fits)"]
        miss = self.miss_estimate.process_bytes_high
        over = (f"{format_bytes(miss - self.capacity)} over the capacity" if miss > self.capacity else
                f"{format_bytes(miss - self.budget)} over the margin, {format_bytes(self.capacity - miss)} under the capacity")
        return lines + [f"  {self.dimension} {self.first_miss:,} needs {format_bytes(miss)} (high): {over}"]

    def _remedies(self) -> list[str]:
        base = self.tried[0][2]
        why = (f"its high estimate {format_bytes(base)} exceeds {format_bytes(self.budget)}" if base > self.budget
               else "the simulated caching allocator runs out of memory")
        lines = [f"Even {self.dimension} 1 does not fit: {why}. What to change first (high estimate and saving "
                 f"at {self.dimension} 1):"]
        for remedy in sorted(self.remedies, key=lambda r: r.process_bytes_high):
            verdict = "fits" if remedy.process_bytes_high <= self.budget else "still does not fit"
            lines.append(f"  - {remedy.what}: {format_bytes(remedy.process_bytes_high)} "
                         f"(saves {format_bytes(remedy.saving(base))}; {verdict}) — {remedy.how}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        headroom = self.headroom
        return {"dimension": self.dimension, "best": self.best, "first_miss": self.first_miss,
                "device": self.device_name, "capacity_bytes": self.capacity,
                "margin": self.margin.fraction, "margin_source": self.margin.source, "budget_bytes": self.budget,
                "compared": self.compared, "headroom_bytes": headroom,
                "headroom_fraction": None if headroom is None else headroom / self.capacity,
                "best_estimate": self.best_estimate.to_dict() if self.best_estimate else None,
                "tried": [{"value": v, "process_bytes": b, "process_bytes_high": h, "fits": f}
                          for v, b, h, f in self.tried],
                "remedies": [dataclasses.asdict(r) for r in self.remedies]}


def _is_hf(model: Any) -> bool:
    return isinstance(model, str) and model.startswith("hf:")


def _with_value(setup: TrainingSetup, value: int, sequence: bool, hf: bool = False) -> TrainingSetup:
    if not sequence:
        return dataclasses.replace(setup, batch_size=value)
    if hf:
        return dataclasses.replace(setup, seq_len=value)
    first = setup.inputs[0]
    return dataclasses.replace(setup, inputs=(InputSpec((value, *first.shape[1:]), first.dtype, first.max_value),
                                              *setup.inputs[1:]))


def within(est: Estimate, budget: int) -> bool:
    """A candidate fits when its high estimate is within the budget and the simulated allocator did not
    run out of memory."""
    return est.process_bytes_high <= budget and est.fits_override is not False


def fit(model: Any, setup: TrainingSetup, device: str, *, sequence: bool = False, limit: int = 1 << 24,
        margin: float | None = None, **options: Any) -> FitResult:
    """Search the batch size (or, with `sequence`, the sequence length: --seq-len of an hf: model, else the
    first input's first dimension) on `device`, keeping `margin` (a fraction of the capacity; default: the
    measured worst low error for the device's kind) free. An hf: model's search stops at its position limit."""
    from trainmem.devices import get_device

    hf = _is_hf(model)
    target = get_device(device)
    kept = resolve_margin(margin, target.kind)
    if sequence and hf:
        from trainmem.frontends.hf import max_sequence_length

        limit = min(limit, max_sequence_length(model[len("hf:"):]) or limit)
    elif sequence and (not setup.inputs or not setup.inputs[0].shape):
        raise SetupError("expected --input-shape whose first dimension is the sequence length with --max-seq, "
                         "got none", where="--max-seq")
    result = FitResult("sequence length" if sequence else "batch size", None, None, 1, None, [], [],
                       target.name, target.capacity_bytes, kept, compared_figure(target.kind))
    cache: dict[int, Estimate] = {}

    def attempt(value: int) -> bool:
        if value not in cache:
            cache[value] = estimate(model, setup=_with_value(setup, value, sequence, hf), device=device, **options)
            est = cache[value]
            result.tried.append((value, est.process_bytes, est.process_bytes_high, within(est, result.budget)))
        return within(cache[value], result.budget)

    if not attempt(1):
        result.miss_estimate = cache[1]
        result.remedies = remedies(model, setup, device, cache[1], options)
        return result
    result.best, result.first_miss = _search(attempt, limit)
    result.best_estimate, result.miss_estimate = cache[result.best], cache.get(result.first_miss)
    result.tried.sort()
    return result


def _search(attempt, limit: int) -> tuple[int, int | None]:
    """Double from 1 until a value does not fit (or the limit does), then bisect: (last fit, first miss)."""
    good, bad = 1, None
    while bad is None and good < limit:
        candidate = min(good * 2, limit)
        if attempt(candidate):
            good = candidate
        else:
            bad = candidate
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if attempt(middle) else (good, middle)
    return good, bad


def remedies(model: Any, setup: TrainingSetup, device: str, base: Estimate, options: dict) -> list[Remedy]:
    """What each usual change does at batch 1: traced again where we can trace it, by rule otherwise.
    Each carries the high estimate, which is what fit compares; a rule's saving comes off both figures."""
    out: list[Remedy] = []
    one = dataclasses.replace(setup, batch_size=1)
    if not setup.checkpointing:
        est = estimate(model, setup=dataclasses.replace(one, checkpointing=True), device=device, **options)
        out.append(Remedy("activation checkpointing (--checkpointing)", est.process_bytes, "traced again",
                          est.process_bytes_high))
    if setup.precision == Precision.FP32:
        gpu = base.device.gpu
        mixed = Precision.BF16_MIXED if gpu is None or gpu.bf16 else Precision.FP16_MIXED
        est = estimate(model, setup=dataclasses.replace(one, precision=mixed), device=device, **options)
        out.append(Remedy(f"mixed precision (--precision {mixed})", est.process_bytes, "traced again",
                          est.process_bytes_high))
    state = base.breakdown.get("optimizer_state", 0)
    if setup.optimizer in ADAM_FAMILY and state:
        # bitsandbytes 8-bit Adam: each of the two moments in 1 byte per element instead of 4 (plus one
        # fp32 absmax per 2048-element block, under 0.2%); the allocator's rounding is not re-simulated
        saved = state - state // 4 - state // 4 // 2048 * 4
        out.append(Remedy("8-bit Adam (bitsandbytes)", base.process_bytes - saved,
                          "by rule: optimizer state × 1/4, from the traced state", base.process_bytes_high - saved))
    sharded = sum(base.breakdown.get(k, 0) for k in ("parameters", "gradients", "optimizer_state"))
    if sharded:
        saved = sharded - sharded // SHARDING_WORLD
        out.append(Remedy(f"ZeRO-3 / FSDP sharding over {SHARDING_WORLD} GPUs", base.process_bytes - saved,
                          f"by rule: parameters, gradients and optimizer state at the peak ÷ {SHARDING_WORLD}; "
                          "gathered layers and communication buffers not counted", base.process_bytes_high - saved))
    return out
