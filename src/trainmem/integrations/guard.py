"""The estimate inside a training script: `check` (does this run fit the memory the device has free now),
`guard` (the same as a `with` block that raises before the first step), and `find_batch_size` (the largest batch
that fits, with no trial step: accelerate's find_executable_batch_size runs one per halving, until an OOM).

Memory this process may use. The estimate is the whole training process (the CPU's peak RSS, a GPU's memory as
nvidia-smi shows it). Part of that process exists already when a script calls us: the model's parameters are
on the device, and so are the CUDA context and whatever the caching allocator holds. So the room is what the
device has free now plus what this process already holds there:
- CPU: MemAvailable (/proc/meminfo) plus this process's resident set (VmRSS, /proc/self/status);
- CUDA: torch.cuda.mem_get_info's free bytes plus torch.cuda.memory_reserved() plus the estimate's CUDA context
  (the context exists once a tensor is on the GPU, and mem_get_info counts it as used).
From that room the fit margin is kept free (fit.py: the measured worst low error for the device's kind, or
`margin=`), and the run fits when the estimate's high end (process_bytes_high) is within what is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from trainmem.errors import TrainmemError
from trainmem.units import format_bytes


class DoesNotFit(TrainmemError, MemoryError):
    """The estimate does not fit the memory the device has for this process now (raised by guard and by the
    integrations' callbacks before anything is allocated). `check` holds the figures."""

    def __init__(self, check: Check) -> None:
        super().__init__(check.reason, where="trainmem")
        self.check = check


@dataclasses.dataclass(frozen=True)
class Check:
    estimate: Any  # trainmem.Estimate
    batch_size: int
    device: str  # where the model is: "cpu", "cuda:0"
    room_bytes: int  # what this process may use on the device now (module docstring)
    kept_bytes: int  # the margin kept free of it
    fits: bool

    @property
    def needed_bytes(self) -> int:
        return self.estimate.process_bytes_high

    @property
    def reason(self) -> str:
        """One line: the verdict with the figures it rests on."""
        verdict = "fits" if self.fits else "does not fit"
        return (f"training at batch {self.batch_size:,} {verdict} on {self.device}: it needs up to "
                f"{format_bytes(self.needed_bytes)} (expected {format_bytes(self.estimate.process_bytes)}), and "
                f"{format_bytes(self.room_bytes - self.kept_bytes)} is available to this process "
                f"({format_bytes(self.room_bytes)} less a margin of {format_bytes(self.kept_bytes)})")

    def __bool__(self) -> bool:
        return self.fits


def check(model: Any, optimizer: Any, batch: Any, *, loss_fn: Callable | None = None, device: Any = None,
          margin: float | None = None, libraries: tuple[str, ...] = (), **setup_values: Any) -> Check:
    """Whether training `model` with `optimizer` on batches like `batch` fits the memory its device has now.
    `device` is where the run will train (default: where the model's parameters are); `libraries`: those the
    training framework brings into the process beside the model's own (live.model_libraries); `setup_values` are
    estimate()'s (precision="bf16-mixed", grad_accum=4, checkpointing=True, loop="step-fn", …)."""
    from trainmem.estimate import estimate
    from trainmem.integrations.live import live_run

    run = live_run(model, optimizer, batch, loss_fn, libraries)
    where = str(device) if device is not None else run.device
    values = {**run.values, "batch_size": run.batch_size, **setup_values}
    return verdict_of(estimate(run.source, device=where, **values), values["batch_size"], where, margin)


def verdict_of(est: Any, batch_size: int, where: str, margin: float | None) -> Check:
    """The Check of an estimate on `where`: its high end against the room less the margin, as fit.within judges a
    candidate (a simulated allocator that ran out of memory does not fit either)."""
    from trainmem.fit import within

    room, kept = room_on(where, est, margin)
    return Check(est, batch_size, where, room, kept, within(est, room - kept))


@contextlib.contextmanager
def guard(model: Any, optimizer: Any, batch: Any, **options: Any) -> Iterator[Check]:
    """`with trainmem.guard(model, optimizer, batch):` raises DoesNotFit before the block runs when the estimate
    does not fit the device's memory now (check's options); the block gets the Check."""
    verdict = check(model, optimizer, batch, **options)
    if not verdict.fits:
        raise DoesNotFit(verdict)
    yield verdict


def find_batch_size(model: Any, optimizer: Any, sample_batch: Any, *, loss_fn: Callable | None = None,
                    device: Any = None, margin: float | None = None, limit: int = 1 << 24,
                    **setup_values: Any) -> int:
    """The largest batch that fits the device's memory now, found by estimates alone: fit's search (doubling then
    bisecting on the estimate's high end, batches predicted from two traces and the answer confirmed by a third,
    fit.ScaledBatches). `sample_batch` gives the shapes at any batch size. `device` may also name a GPU of the
    catalog ("a100-80gb"), whose whole capacity is the room, as `trainmem fit` has it. Raises DoesNotFit when not
    even a batch of one fits."""
    from trainmem.estimate.orchestrate import setup_of
    from trainmem.fit import ScaledBatches, search
    from trainmem.integrations.live import live_run

    run = live_run(model, optimizer, sample_batch, loss_fn)
    where = str(device) if device is not None else run.device
    setup = setup_of(None, {**run.values, **setup_values, "batch_size": 1}, "find_batch_size()")
    candidates = ScaledBatches(run.source, setup, where, {}, limit)
    first = candidates.estimate(1)
    room, kept = room_on(where, first, margin)
    found = search(candidates, limit, room - kept)
    found.raise_if_nothing_evaluated("batch size", "find_batch_size")
    if found.best is None:
        raise DoesNotFit(Check(first, 1, where, room, kept, False))
    return found.best


def room_on(where: str, est: Any, margin: float | None) -> tuple[int, int]:
    """(what this process may use on `where` now, the margin kept free of it): module docstring."""
    from trainmem.fit import resolve_margin

    kept = int(est.device.capacity_bytes * resolve_margin(margin, est.device).fraction)
    if not _this_machine(where):  # a catalog GPU being planned for: its whole capacity, as fit has it
        return est.device.capacity_bytes, kept
    if where == "cpu":
        from trainmem.devices import available_bytes

        import os

        from trainmem.supervised import resident_bytes

        return (available_bytes() or est.device.capacity_bytes) + resident_bytes(os.getpid()), kept
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(where))
    return free + torch.cuda.memory_reserved(torch.device(where)) + est.process_parts.get("cuda_context", 0), kept


def _this_machine(where: str) -> bool:
    return where == "cpu" or where.split(":")[0] == "cuda"
