"""The one orchestrator: model reference + setup → trace → target stream → allocator → Estimate."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.devices import Device, get_device
from trainmem.errors import SetupError
from trainmem.setup import TrainingSetup


@dataclasses.dataclass
class Estimate:
    """The answer: peaks, what is alive at the peak, where it happens, and why.
    Prints itself as the terminal report; `to_dict()` gives the JSON of DESIGN.md."""

    model_name: str
    setup: TrainingSetup
    device: Device
    parameters: int
    trainable_parameters: int
    tensor_bytes: int
    process_bytes: int
    breakdown: dict[str, int]
    peak_phase: str
    peak_module: str
    peak_op: str
    peak_step: int
    modules: list[dict[str, Any]]
    warnings: list[str]
    explanation: dict[str, Any]
    process_parts: dict[str, int]
    coverage: dict[str, Any]

    @property
    def allocated_bytes(self) -> int:
        return self.tensor_bytes  # on the CPU, what the allocator hands out is the tensor storage

    @property
    def reserved_bytes(self) -> int | None:
        return None  # the CPU allocator caches nothing

    @property
    def fits(self) -> bool:
        return self.process_bytes <= self.device.capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        from trainmem import __version__

        return {
            "trainmem_version": __version__,
            "model": {"name": self.model_name, "parameters": self.parameters,
                      "trainable_parameters": self.trainable_parameters},
            "setup": self.setup.to_dict(),
            "device": self.device.to_dict(),
            "peak": {"tensor_bytes": self.tensor_bytes, "allocated_bytes": self.allocated_bytes,
                     "reserved_bytes": self.reserved_bytes, "process_bytes": self.process_bytes,
                     "phase": self.peak_phase, "module": self.peak_module, "op": self.peak_op,
                     "step": self.peak_step},
            "breakdown": dict(self.breakdown),
            "process": dict(self.process_parts),
            "fits": self.fits,
            "modules": self.modules,
            "explanation": self.explanation,
            "coverage": self.coverage,
            "warnings": list(self.warnings),
        }

    def __str__(self) -> str:
        from trainmem.report.text import render_text

        return render_text(self)


def estimate(model: Any, *, setup: TrainingSetup | None = None, device: str = "cpu", depth: int = 2,
             **setup_values: Any) -> Estimate:
    """Estimate training memory for `model` (a reference string or an nn.Module).

    Setup values may be passed as a TrainingSetup or as keywords (batch_size=256, optimizer="adam",
    input_shape="1000", …), the same names as the CLI flags and TOML keys."""
    from trainmem.frontends import resolve
    from trainmem.targets import cpu as cpu_target
    from trainmem.trace.run import trace_training
    from trainmem.assemble import assemble

    if setup is None:
        setup = TrainingSetup.from_mapping(setup_values, where="estimate()")
    elif setup_values:
        setup = TrainingSetup.from_mapping({**_plain(setup), **setup_values}, where="estimate()")
    target_device = get_device(device)
    if target_device.kind != "cpu":
        raise SetupError(f"expected --device cpu: the CUDA target is not built yet, got {device!r} "
                         "(`trainmem devices` lists the GPU facts already collected)", where="--device")
    source = resolve(model, setup)
    traced = trace_training(source, setup, cpu_target.kernel_ops())
    return assemble(source, setup, target_device, traced, depth)


def _plain(setup: TrainingSetup) -> dict[str, Any]:
    return {f.name: getattr(setup, f.name) for f in dataclasses.fields(setup)}
