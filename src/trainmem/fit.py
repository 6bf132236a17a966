"""`trainmem fit`: the largest batch (or sequence length) whose estimate fits the device.

Each candidate is a full estimate: memory is not affine in the batch (the allocator rounds and
splits blocks, workspaces and the CUDA context are fixed), so the search doubles until a candidate
does not fit, then bisects between the last fit and the first miss. When even 1 does not fit, the
usual remedies are estimated rather than guessed: checkpointing and mixed precision by tracing again
with them, an 8-bit optimizer and sharding by rule on the traced breakdown.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.errors import SetupError
from trainmem.estimate import Estimate, estimate
from trainmem.setup import ADAM_FAMILY, InputSpec, Precision, TrainingSetup
from trainmem.units import format_bytes

SHARDING_WORLD = 8  # the remedy is shown for one node of 8 GPUs


@dataclasses.dataclass
class Remedy:
    what: str
    process_bytes: int
    how: str  # "traced again" or the rule used

    def saving(self, base: int) -> int:
        return base - self.process_bytes


@dataclasses.dataclass
class FitResult:
    dimension: str  # "batch size" or "sequence length"
    best: int | None  # the largest value that fits; None when even 1 does not
    best_estimate: Estimate | None
    first_miss: int | None  # the smallest value found not to fit (None: the search limit fits)
    miss_estimate: Estimate | None
    tried: list[tuple[int, int, bool]]  # (value, process bytes, fits)
    remedies: list[Remedy]
    device_name: str
    capacity: int

    def __str__(self) -> str:
        lines = [f"trainmem fit — {self.device_name} ({format_bytes(self.capacity)}), searching the {self.dimension}"]
        for value, nbytes, fits in self.tried:
            lines.append(f"  {self.dimension} {value:>8,}: {format_bytes(nbytes):>11s}  {'fits' if fits else 'does not fit'}")
        if self.best is not None:
            est = self.best_estimate
            headroom = self.capacity - est.process_bytes
            lines += ["", f"Largest {self.dimension} that fits: {self.best:,}",
                      f"  process {format_bytes(est.process_bytes)} of {format_bytes(self.capacity)}, "
                      f"headroom {format_bytes(headroom)} ({headroom / self.capacity:.1%})",
                      f"  peak in {est.peak_phase} (op {est.peak_op}); at the peak: "
                      + ", ".join(f"{k} {format_bytes(v)}" for k, v in est.breakdown.items() if v)]
            if self.first_miss is not None:
                miss = self.miss_estimate
                lines.append(f"  {self.dimension} {self.first_miss:,} needs {format_bytes(miss.process_bytes)}: "
                             f"{format_bytes(miss.process_bytes - self.capacity)} over")
            else:
                lines.append(f"  (the search stopped at its limit, {self.tried[-1][0]:,}, which still fits)")
        else:
            lines += ["", f"Even {self.dimension} 1 does not fit. What to change first (saving at {self.dimension} 1):"]
            base = self.tried[0][1]
            for remedy in sorted(self.remedies, key=lambda r: r.process_bytes):
                verdict = "fits" if remedy.process_bytes <= self.capacity else "still does not fit"
                lines.append(f"  - {remedy.what}: {format_bytes(remedy.process_bytes)} "
                             f"(saves {format_bytes(remedy.saving(base))}; {verdict}) — {remedy.how}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"dimension": self.dimension, "best": self.best, "first_miss": self.first_miss,
                "device": self.device_name, "capacity_bytes": self.capacity,
                "best_estimate": self.best_estimate.to_dict() if self.best_estimate else None,
                "tried": [{"value": v, "process_bytes": b, "fits": f} for v, b, f in self.tried],
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


def fit(model: Any, setup: TrainingSetup, device: str, *, sequence: bool = False, limit: int = 1 << 24,
        **options: Any) -> FitResult:
    """Search the batch size (or, with `sequence`, the sequence length: --seq-len of an hf: model, else the
    first input's first dimension) on `device`. An hf: model's search stops at its position limit."""
    hf = _is_hf(model)
    if sequence and hf:
        from trainmem.frontends.hf import max_sequence_length

        limit = min(limit, max_sequence_length(model[len("hf:"):]) or limit)
    elif sequence and (not setup.inputs or not setup.inputs[0].shape):
        raise SetupError("expected --input-shape whose first dimension is the sequence length with --max-seq, "
                         "got none", where="--max-seq")
    tried: list[tuple[int, int, bool]] = []
    cache: dict[int, Estimate] = {}

    def attempt(value: int) -> Estimate:
        if value not in cache:
            cache[value] = estimate(model, setup=_with_value(setup, value, sequence, hf), device=device, **options)
            tried.append((value, cache[value].process_bytes, cache[value].fits))
        return cache[value]

    first = attempt(1)
    dimension = "sequence length" if sequence else "batch size"
    if not first.fits:
        return FitResult(dimension, None, None, 1, first, tried, remedies(model, setup, device, first, options),
                         first.device.name, first.device.capacity_bytes)
    good, bad = 1, None
    while bad is None and good < limit:
        candidate = min(good * 2, limit)
        if attempt(candidate).fits:
            good = candidate
        else:
            bad = candidate
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if attempt(middle).fits else (good, middle)
    tried.sort()
    return FitResult(dimension, good, cache[good], bad, cache.get(bad) if bad else None, tried, [],
                     first.device.name, first.device.capacity_bytes)


def remedies(model: Any, setup: TrainingSetup, device: str, base: Estimate, options: dict) -> list[Remedy]:
    """What each usual change does at batch 1: traced again where we can trace it, by rule otherwise."""
    out: list[Remedy] = []
    one = dataclasses.replace(setup, batch_size=1)
    if not setup.checkpointing:
        est = estimate(model, setup=dataclasses.replace(one, checkpointing=True), device=device, **options)
        out.append(Remedy("activation checkpointing (--checkpointing)", est.process_bytes, "traced again"))
    if setup.precision == Precision.FP32:
        gpu = base.device.gpu
        mixed = Precision.BF16_MIXED if gpu is None or gpu.bf16 else Precision.FP16_MIXED
        est = estimate(model, setup=dataclasses.replace(one, precision=mixed), device=device, **options)
        out.append(Remedy(f"mixed precision (--precision {mixed})", est.process_bytes, "traced again"))
    state = base.breakdown.get("optimizer_state", 0)
    if setup.optimizer in ADAM_FAMILY and state:
        # bitsandbytes 8-bit Adam: each of the two moments in 1 byte per element instead of 4 (plus one
        # fp32 absmax per 2048-element block, under 0.2%); the allocator's rounding is not re-simulated
        saved = state - state // 4 - state // 4 // 2048 * 4
        out.append(Remedy("8-bit Adam (bitsandbytes)", base.process_bytes - saved,
                          "by rule: optimizer state × 1/4, from the traced state"))
    sharded = sum(base.breakdown.get(k, 0) for k in ("parameters", "gradients", "optimizer_state"))
    if sharded:
        saved = sharded - sharded // SHARDING_WORLD
        out.append(Remedy(f"ZeRO-3 / FSDP sharding over {SHARDING_WORLD} GPUs", base.process_bytes - saved,
                          f"by rule: parameters, gradients and optimizer state at the peak ÷ {SHARDING_WORLD}; "
                          "gathered layers and communication buffers not counted"))
    return out
