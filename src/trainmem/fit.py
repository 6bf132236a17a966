"""`trainmem fit`: the largest batch (or sequence length) whose high estimate stays under the device's
capacity less a safety margin.

Memory is not affine in the batch (the allocator rounds and splits blocks, workspaces and the CUDA
context are fixed), so the search estimates candidates one by one: it doubles until a candidate does
not fit, then bisects between the last fit and the first miss. A candidate fits when its high
estimate (`process_bytes_high`: the upper end of what real runs of the setup show) is at most
`capacity × (1 − margin)`. The margin covers what the high estimate has still been seen to miss: its
default is the worst low error measured for the counter fit compares (default_margin below). When
even 1 does not fit, the usual remedies are estimated rather than guessed: checkpointing and mixed
precision by tracing again with them, an 8-bit optimizer and sharding by rule on the traced breakdown.

What *is* affine in the batch is the trace: the same ops, allocations and frees, each size a constant
plus a multiple of the batch. So the batch search traces twice (ScaledBatches), predicts every other
candidate's trace from those two (trace/batch_scaling.py) and replays only the allocator on it; the
answer's batch is then traced for real and must equal its prediction, else every candidate is traced
as before (`exhaustive=True` asks for that from the start). The answer is the exhaustive search's:
the same candidates in the same order, each with the estimate its real trace gives. The sequence
search predicts from three traces, sizes quadratic in the length (fit_sequences.py).

A candidate whose estimate fails (a trace error, a feature this torch lacks) is no verdict: the search stops
there and answers with what it evaluated, listing the failure (FitResult.failed); when even the first
candidate fails there is no answer, and NothingEvaluated is raised (exit 2, never "does not fit").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from collections.abc import Callable, Mapping

from trainmem.errors import NothingEvaluated, SetupError, TorchVersionError, failure_reason
from trainmem.estimate import Estimate, cache_keyword, estimate
from trainmem.devices import Device, DeviceRef
from trainmem.progress import Progress
from trainmem.estimate.orchestrate import setup_of
from trainmem.fit_predicted import Candidates, ScaledBatches as ScaledBatches, cuda_options
from trainmem.setup import ADAM_FAMILY, InputSpec, Precision, TrainingSetup
from trainmem.setup.target_options import TargetOptions, refuse_loose_options
from trainmem.targets import fit_margin, report_words

SHARDING_WORLD = 8  # the remedy is shown for one node of 8 GPUs


@dataclasses.dataclass(frozen=True)
class Margin:
    """A fraction of the capacity kept free, and where it comes from."""

    fraction: float
    source: str


# The default margin is the worst low error (estimate below measured) recorded for the counter fit compares on
# the device's target, rounded up to the next whole percent: if a real run can exceed our estimate by that much,
# a batch whose estimate fills the device to the brim would run out of memory. Each target holds its own
# (targets/ fit_margin, with the results file and row); tests/test_fit.py reads both results files and fails
# when they record a worse low error, or when a regenerated table leaves a constant stale.
def default_margin(device: Device) -> Margin:
    return Margin(*fit_margin(device))


def resolve_margin(margin: float | None, device: Device) -> Margin:
    """The margin to keep: the caller's (0 ≤ m < 1), else the default for the device's target."""
    if margin is None:
        return default_margin(device)
    try:
        value = float(margin)
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 <= value < 1.0:  # NaN fails this too
        raise SetupError(f"expected --margin as a fraction of the capacity, 0 ≤ m < 1 (e.g. 0.1), got {margin!r}",
                         where="--margin")
    return Margin(value, "--margin")


def budget_of(capacity: int, margin: Margin) -> int:
    """What a candidate's high estimate may reach: the capacity less the margin."""
    return int(capacity * (1.0 - margin.fraction))


def compared_figure(device: Device) -> str:
    return f"process_bytes_high (the high estimate of {report_words(device).process_counter})"


@dataclasses.dataclass(frozen=True)
class Remedy:
    what: str
    process_bytes: int  # the expected figure with the change
    how: str  # "traced again" or the rule used
    process_bytes_high: int = 0  # the high figure with the change, which decides whether it fits
    error: str = ""  # why tracing with the change failed (its figures are then unknown)

    def saving(self, base: int) -> int:
        return base - self.process_bytes_high


@dataclasses.dataclass(frozen=True)
class CandidatePeak:
    """One candidate's peak as its estimate gives it: what the text compares when a larger candidate needs less
    than a smaller one (the trace's tensors, the allocator's blocks and segments, the process's parts)."""

    phase: str
    op: str
    tensor_bytes: int  # live tensor storage at the peak, as traced
    allocated_bytes: int | None  # the allocator's peak (blocks rounded); None where it rounds nothing
    reserved_bytes: int | None  # a caching allocator's segments; None on the CPU
    segments: int | None  # a caching allocator's segments at its peak
    process_bytes: int  # the expected figure (its high estimate is the candidate's row)
    process_parts: dict[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, est: Estimate) -> CandidatePeak:
        return cls(est.peak_phase, est.peak_op, est.tensor_bytes, est.allocated_bytes, est.reserved_bytes,
                   est.allocator.segments_at_peak if est.allocator else None, est.process_bytes,
                   dict(est.process_parts))


@dataclasses.dataclass(frozen=True)
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
    margin: Margin
    compared: str = "process_bytes_high"
    # how the candidates were estimated: the batch sizes traced, those predicted from them, and why
    search: dict[str, Any] = dataclasses.field(default_factory=dict)
    failed: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (value, why) of candidates that failed
    # value -> where its peak is and what the allocator held (CandidatePeak), to say why a larger one needs less
    peaks: dict[int, CandidatePeak] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def budget(self) -> int:
        return budget_of(self.capacity, self.margin)

    @property
    def headroom(self) -> int | None:
        """Capacity less the best candidate's high estimate (None when nothing fits)."""
        return None if self.best_estimate is None else self.capacity - self.best_estimate.process_bytes_high

    def __str__(self) -> str:
        return self.render()

    def render(self, verbose: bool = False) -> str:
        """The answer first, then the candidates that decided it (every one with `verbose`): report/fit_text.py."""
        from trainmem.report.fit_text import render

        return render(self, verbose)

    def to_dict(self) -> dict[str, Any]:
        return {"dimension": self.dimension, "best": self.best, "first_miss": self.first_miss,
                "device": self.device_name, "capacity_bytes": self.capacity,
                "margin": self.margin.fraction, "margin_source": self.margin.source, "budget_bytes": self.budget,
                "compared": self.compared, "headroom_bytes": self.headroom,
                "headroom_fraction": None if self.headroom is None else self.headroom / self.capacity,
                "best_estimate": self.best_estimate.to_dict() if self.best_estimate else None,
                "tried": [{"value": v, "process_bytes": b, "process_bytes_high": h, "fits": f}
                          for v, b, h, f in self.tried],
                "remedies": [dataclasses.asdict(r) for r in self.remedies], "search": dict(self.search),
                "failed": [{"value": value, "error": why} for value, why in self.failed]}


def _scaled_sequences(*args: Any) -> Candidates:
    from trainmem.fit_sequences import ScaledSequences  # here, not at the top: it builds on this module

    return ScaledSequences(*args)


def with_value(setup: TrainingSetup, value: int, sequence: bool, hf: bool = False) -> TrainingSetup:
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


@cache_keyword
def fit(model: Any, setup: TrainingSetup | None = None, device: DeviceRef = "cpu", *, sequence: bool = False,
        limit: int = 1 << 24, margin: float | None = None, depth: int = 2, exhaustive: bool = False,
        target_options: TargetOptions | Mapping[str, Any] | None = None, **setup_values: Any) -> FitResult:
    """Search the batch size (or, with `sequence`, the sequence length: --seq-len of an hf: model, else the
    first input's first dimension) on `device`, keeping `margin` (a fraction of the capacity; default: the
    measured worst low error for the device's kind) free. An hf: model's search stops at its position limit.

    It is called as estimate() is: `fit(model, device="a100-80gb", optimizer="adamw", input_shape="1024")`,
    with `setup=TrainingSetup(...)`, or both (the one reader, estimate.orchestrate.setup_of); `device`, `cache` and
    `target_options` are estimate()'s (a name, a torch.device or a Device; a TargetOptions of its CUDA keys). The
    older positional form `fit(model, setup, device)` still works. The batch search searches batch_size, so a
    batch_size keyword is refused there (it is the batch of the sequence search). The searches trace two or three
    candidates and predict the others (module docstring); `exhaustive` traces every one."""
    from trainmem.devices import get_device

    if not sequence and "batch_size" in setup_values:
        raise SetupError(f"expected no batch_size for fit(): it searches the batch size (give sequence=True to "
                         f"search the sequence length at a batch size), got batch_size={setup_values['batch_size']!r}",
                         where="fit()")
    refuse_loose_options(setup_values, "fit()")
    setup = setup_of(setup, setup_values, "fit()")
    options = dict(depth=depth, **TargetOptions.of(target_options, "fit()").cuda_only("fit()"))
    hf, target = isinstance(model, str) and model.startswith("hf:"), get_device(device)  # once: "cuda" is this GPU
    kept = resolve_margin(margin, target)
    if sequence and hf:
        from trainmem.frontends.hf import max_sequence_length

        limit = min(limit, max_sequence_length(model[len("hf:"):]) or limit)
    elif sequence and (not setup.inputs or not setup.inputs[0].shape):
        raise SetupError("expected --input-shape whose first dimension is the sequence length with --max-seq, "
                         "got none", where="--max-seq")
    budget = budget_of(target.capacity_bytes, kept)
    if exhaustive or setup.parallel.distributed:  # many ranks: each candidate a per-rank estimate
        candidates: Candidates = _EveryCandidateTraced(model, setup, target, sequence, hf, options)
    else:  # the sequence search from three traces (fit_sequences.py), the batch search from two
        candidates = (_scaled_sequences if sequence else ScaledBatches)(model, setup, target, options, limit, hf)
    with Progress(f"fit: the largest {'sequence length' if sequence else 'batch size'}", unit="candidate") as bar:
        bar.total(None)  # doubling, then bisecting: the count is known only at the end
        found = search(candidates, limit, budget, bar)
    dimension = "sequence length" if sequence else "batch size"
    found.raise_if_nothing_evaluated(dimension, "fit")
    tried = [(value, est.process_bytes, est.process_bytes_high, within(est, budget))
             for value, est in found.estimates.items()]
    answer = dict(dimension=dimension, device_name=target.name, capacity=target.capacity_bytes, margin=kept,
                  compared=compared_figure(target), search=candidates.summary(), failed=sorted(found.failed.items()),
                  peaks={value: CandidatePeak.of(est) for value, est in found.estimates.items()})
    if found.best is None:
        return FitResult(best=None, best_estimate=None, first_miss=1, miss_estimate=found.estimates[1], tried=tried,
                         remedies=remedies(model, setup, target, found.estimates[1], options), **answer)
    return FitResult(best=found.best, best_estimate=found.estimates[found.best], first_miss=found.first_miss,
                     miss_estimate=found.estimates.get(found.first_miss), tried=sorted(tried), remedies=[], **answer)


@dataclasses.dataclass(frozen=True)
class Found:
    best: int | None  # the last value that fit (None: not even 1, or 1 failed)
    first_miss: int | None  # the first that did not (None: the limit fits, or the search stopped at a failure)
    estimates: dict[int, Estimate]  # every value evaluated, in the order tried
    failed: dict[int, str] = dataclasses.field(default_factory=dict)  # value -> why its estimate failed

    def raise_if_nothing_evaluated(self, dimension: str, where: str) -> None:
        """An error is no answer: when no candidate could be evaluated, say why in one line (exit 2)."""
        if not self.estimates:
            raise NothingEvaluated([(f"{dimension} {value:,}", why) for value, why in self.failed.items()],
                                   "candidate", "candidates", where=where)


def search(candidates: Candidates, limit: int, budget: int, progress: Any = None) -> Found:
    """fit's search with its confirmation: when an estimate the answer rests on proves wrong (a predicted
    trace), the search runs again on the candidates' real traces. `progress` (progress.Progress) advances once
    per candidate estimated. trainmem compare --devices runs the same search per device (sweep.py)."""

    def estimate_at(value: int) -> Estimate:
        est = candidates.estimate(value)
        if progress is not None:
            progress.advance()
        return est

    found = _search(estimate_at, limit, budget)
    if not candidates.confirm(found.best, found.first_miss):  # a prediction was wrong: trace every candidate
        found = _search(estimate_at, limit, budget)
    return found


def _search(estimate_at: Callable[[int], Estimate], limit: int, budget: int) -> Found:
    """Double from 1 until a value does not fit (or the limit does), then bisect: (last fit, first miss). A value
    whose estimate fails stops the search where it is (a failure is no verdict)."""
    estimates: dict[int, Estimate] = {}
    failed: dict[int, str] = {}

    def attempt(value: int) -> bool | None:
        if value not in estimates:
            try:
                estimates[value] = estimate_at(value)
            except TorchVersionError:  # this torch cannot trace the setup at any value: its own one line
                raise
            except Exception as error:  # noqa: BLE001 - listed with its reason, never taken for "does not fit"
                failed[value] = failure_reason(error)
                return None
        return within(estimates[value], budget)

    first = attempt(1)
    if not first:
        return Found(None, None if first is None else 1, estimates, failed)
    good, bad = 1, None
    while bad is None and good < limit:
        candidate = min(good * 2, limit)
        verdict = attempt(candidate)
        if verdict is None:
            break
        good, bad = (candidate, None) if verdict else (good, candidate)
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        verdict = attempt(middle)
        if verdict is None:
            break
        good, bad = (middle, bad) if verdict else (good, middle)
    return Found(good, bad, estimates, failed)


class _EveryCandidateTraced(Candidates):
    """Today's search: a whole estimate (trace and replay) per candidate."""

    def __init__(self, model: Any, setup: TrainingSetup, device: DeviceRef, sequence: bool, hf: bool,
                 options: dict[str, Any]) -> None:
        self.model, self.setup, self.device, self.sequence, self.hf, self.options = \
            model, setup, device, sequence, hf, options
        self.traced: list[int] = []

    def estimate(self, value: int) -> Estimate:
        self.traced.append(value)
        return _estimate_with(self.model, with_value(self.setup, value, self.sequence, self.hf), self.device,
                              self.options)

    def summary(self) -> dict[str, Any]:
        return {"traced": sorted(self.traced), "predicted": [], "how": "traced, each one"}


def remedies(model: Any, setup: TrainingSetup, device: DeviceRef, base: Estimate, options: dict) -> list[Remedy]:
    """What each usual change does at batch 1: traced again where we can trace it, by rule otherwise.
    Each carries the high estimate, which is what fit compares; a rule's saving comes off both figures."""
    out: list[Remedy] = []
    one = dataclasses.replace(setup, batch_size=1)
    if not setup.checkpointing:
        out.append(_traced_again("activation checkpointing (--checkpointing)", model,
                                 dataclasses.replace(one, checkpointing=True), device, options))
    if setup.precision == Precision.FP32:
        gpu = base.device.gpu
        mixed = Precision.BF16_MIXED if gpu is None or gpu.bf16 else Precision.FP16_MIXED
        out.append(_traced_again(f"mixed precision (--precision {mixed})", model,
                                 dataclasses.replace(one, precision=mixed), device, options))
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


def _estimate_with(model: Any, setup: TrainingSetup, device: DeviceRef, options: dict[str, Any]) -> Estimate:
    """estimate() with fit's options: the report depth and the CUDA target's options."""
    return estimate(model, setup=setup, device=device, depth=options.get("depth", 2),
                    target_options=cuda_options(options))


def _traced_again(what: str, model: Any, setup: TrainingSetup, device: DeviceRef, options: dict) -> Remedy:
    """A remedy estimated by tracing with it; one whose trace fails says so (its figures are unknown)."""
    try:
        est = _estimate_with(model, setup, device, options)
    except Exception as error:  # noqa: BLE001 - the other remedies and the answer stand
        return Remedy(what, 0, "traced again", 0, failure_reason(error))
    return Remedy(what, est.process_bytes, "traced again", est.process_bytes_high)
