"""The one orchestrator: model reference + setup → trace → target stream → allocator → Estimate."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.devices import Device, get_device
from trainmem.errors import SetupError
from trainmem.setup import Loop, TrainingSetup


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
    allocated: int | None = None  # CUDA: max_memory_allocated (None on the CPU: the tensor peak)
    reserved: int | None = None  # CUDA: max_memory_reserved (the CPU allocator caches nothing)
    allocator: dict[str, Any] = dataclasses.field(default_factory=dict)  # CUDA: fragmentation, segments
    fits_override: bool | None = None  # False when the simulated allocator ran out of memory
    baselines: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # rules of thumb beside us
    # the upper end of what real runs of this setup show (run-to-run spread, uncertain runtime facts);
    # None: no spread is modelled, the point estimate is the high end too
    process_high: int | None = None
    quantized_parameters: int = 0  # parameters stored in 4 bits (QLoRA), included in `parameters`
    adapter_parameters: int = 0  # parameters LoRA adds to the model, not included in `parameters`
    quantized_storage_bytes: int = 0  # their packed storage with its quantization statistics
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)  # setup values the trace used

    # with compare_loop: the same setup in the lean loop, and what it would save (None: not compared)
    lean_loop: dict[str, Any] | None = None

    @property
    def process_bytes_high(self) -> int:
        return max(self.process_bytes, self.process_high or 0)

    @property
    def allocated_bytes(self) -> int:
        return self.tensor_bytes if self.allocated is None else self.allocated

    @property
    def reserved_bytes(self) -> int | None:
        return self.reserved

    @property
    def fits(self) -> bool:
        return self.process_bytes <= self.device.capacity_bytes and self.fits_override is not False

    def to_dict(self) -> dict[str, Any]:
        from trainmem import __version__

        return {
            "trainmem_version": __version__,
            "model": {"name": self.model_name, "parameters": self.parameters,
                      "trainable_parameters": self.trainable_parameters,
                      "adapter_parameters": self.adapter_parameters,
                      "quantized_parameters": self.quantized_parameters,
                      "quantized_storage_bytes": self.quantized_storage_bytes},
            "setup": {**self.setup.to_dict(), "resolved": self.resolved},
            **({"lean_loop": self.lean_loop} if self.lean_loop else {}),
            "device": self.device.to_dict(),
            "peak": {"tensor_bytes": self.tensor_bytes, "allocated_bytes": self.allocated_bytes,
                     "reserved_bytes": self.reserved_bytes, "process_bytes": self.process_bytes,
                     "process_bytes_high": self.process_bytes_high,
                     "phase": self.peak_phase, "module": self.peak_module, "op": self.peak_op,
                     "step": self.peak_step},
            "breakdown": dict(self.breakdown),
            "process": dict(self.process_parts),
            "fits": self.fits,
            "modules": self.modules,
            "explanation": self.explanation,
            "coverage": self.coverage,
            "baselines": self.baselines,
            **({"allocator": self.allocator} if self.allocator else {}),
            "warnings": list(self.warnings),
        }

    def __str__(self) -> str:
        from trainmem.report.text import render_text

        return render_text(self)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What an estimate needs besides the setup: the model's source, the target device and its options,
    and the module depth of the report. `plan()` checks the options before anything is traced."""

    source: Any  # frontends.ModelSource
    device: Device
    depth: int
    options: dict[str, Any]  # the target's: cuda_context, alloc_conf, cuda_version, module_loading, cudnn_benchmark


def estimate(model: Any, *, setup: TrainingSetup | None = None, device: str = "cpu", depth: int = 2,
             cuda_context: int | None = None, alloc_conf: str | None = None, cuda_version: str | None = None,
             module_loading: str | None = None, cudnn_benchmark: bool | None = None,
             compare_loop: bool = False, **setup_values: Any) -> Estimate:
    """Estimate training memory for `model` (a reference string or an nn.Module).

    Setup values may be passed as a TrainingSetup or as keywords (batch_size=256, optimizer="adam",
    input_shape="1000", …), the same names as the CLI flags and TOML keys. For a GPU `device`,
    `cuda_context` overrides the catalog's CUDA-context bytes and `alloc_conf` is a
    PYTORCH_CUDA_ALLOC_CONF string ("expandable_segments:True"); `cuda_version` ("12.4"),
    `module_loading` ("lazy"/"eager") and `cudnn_benchmark` describe the target run's CUDA stack.
    With `compare_loop`, the setup is traced a second time in the lean loop, and the result says what
    deleting the loop's references early would save (`lean_loop`)."""
    if setup is None:
        setup = TrainingSetup.from_mapping(setup_values, where="estimate()")
    elif setup_values:
        setup = TrainingSetup.from_mapping({**_plain(setup), **setup_values}, where="estimate()")
    options = dict(cuda_context=cuda_context, alloc_conf=alloc_conf, cuda_version=cuda_version,
                   module_loading=module_loading, cudnn_benchmark=cudnn_benchmark)
    if compare_loop and setup.loop != Loop.LEAN:
        return _with_lean_loop(estimate(model, setup=setup, device=device, depth=depth, **options),
                               estimate(model, setup=dataclasses.replace(setup, loop=Loop.LEAN), device=device,
                                        depth=depth, **options))
    chosen = plan(model, setup, device, depth, **options)
    return assemble_traced(chosen, setup, trace(chosen, setup))


def plan(model: Any, setup: TrainingSetup, device: str = "cpu", depth: int = 2, **options: Any) -> Plan:
    """Resolve the model and the target and check the target's options, without tracing."""
    from trainmem.frontends import resolve

    target_device = get_device(device)
    if target_device.kind == "cuda":
        _check_cuda(setup, target_device, options)
    elif any(v is not None for v in options.values()):
        raise SetupError("expected --cuda-context, --alloc-conf, --cuda-version, --module-loading and "
                         "--cudnn-benchmark only with a GPU --device, got --device cpu",
                         where="--device")
    return Plan(resolve(model, setup), target_device, depth, options)


def trace(chosen: Plan, setup: TrainingSetup):
    """Trace the training run of `setup` for the plan's target (trace.run.TraceResult)."""
    from trainmem.trace.run import trace_training

    if chosen.device.kind == "cuda":
        from trainmem.targets import cuda as cuda_target
        from trainmem.trace.cuda_composites import CudaFacts

        return trace_training(chosen.source, setup, cuda_target.kernel_ops(),
                              CudaFacts(chosen.device.gpu.compute_capability))
    from trainmem.targets import cpu as cpu_target

    return trace_training(chosen.source, setup, cpu_target.kernel_ops())


def assemble_traced(chosen: Plan, setup: TrainingSetup, traced: Any) -> Estimate:
    """The device stream, the allocator's replay and the report facts of a traced run."""
    if chosen.device.kind == "cuda":
        from trainmem.alloc.cuda_config import AllocatorConfig
        from trainmem.assemble_cuda import assemble_cuda
        from trainmem.targets.cuda_runtime import resolve_runtime

        options = chosen.options
        config = AllocatorConfig.from_env_string(options.get("alloc_conf") or "")
        cuda = resolve_runtime(cuda_version=options.get("cuda_version"), module_loading=options.get("module_loading"),
                               cudnn_benchmark=options.get("cudnn_benchmark"))
        est = assemble_cuda(chosen.source, setup, chosen.device, traced, chosen.depth, config,
                            options.get("cuda_context"), cuda)
    else:
        from trainmem.assemble import assemble

        est = assemble(chosen.source, setup, chosen.device, traced, chosen.depth)
    return _trace_facts(est, traced)


def _with_lean_loop(est: Estimate, lean: Estimate) -> Estimate:
    """What the lean loop (`del outputs` before backward, `del loss, inputs` after it) would need."""
    est.lean_loop = {"loop": str(Loop.LEAN), "allocated_bytes": lean.allocated_bytes,
                     "process_bytes": lean.process_bytes, "saving_bytes": est.allocated_bytes - lean.allocated_bytes}
    return est


def _check_cuda(setup: TrainingSetup, device: Device, options: dict[str, Any]) -> None:
    """Bad --alloc-conf, --precision for the card, --cuda-version or --module-loading fail before the trace."""
    from trainmem.alloc.cuda_config import AllocatorConfig
    from trainmem.targets.cuda_runtime import resolve_runtime

    try:
        config = AllocatorConfig.from_env_string(options.get("alloc_conf") or "")
    except ValueError as error:
        raise SetupError(f"expected PYTORCH_CUDA_ALLOC_CONF settings (key:value,…), {error}",
                         where="--alloc-conf") from None
    if config.backend != "native":
        raise SetupError("expected the native caching allocator, got backend:cudaMallocAsync "
                         "(CUDA's own pool is not modelled)", where="--alloc-conf")
    if setup.precision.value.startswith("bf16") and not device.gpu.bf16:
        raise SetupError(f"expected a GPU with bf16 (compute capability 8.0 or newer) for --precision "
                         f"{setup.precision}, got {device.name} (cc {device.gpu.compute_capability[0]}."
                         f"{device.gpu.compute_capability[1]})", where="--precision")
    resolve_runtime(cuda_version=options.get("cuda_version"), module_loading=options.get("module_loading"),
                    cudnn_benchmark=options.get("cudnn_benchmark"))


def _trace_facts(est: Estimate, traced: Any) -> Estimate:
    """Facts of the trace that every target reports alike: the model's own parameter count (LoRA's adapters
    beside it, as a model card counts), quantized counts, the setup values used."""
    est.parameters = traced.parameters - traced.adapter_parameters
    est.adapter_parameters = traced.adapter_parameters
    est.quantized_parameters, est.quantized_storage_bytes = traced.quantized_parameters, traced.quantized_storage_bytes
    est.resolved = traced.resolved
    return est


def _plain(setup: TrainingSetup) -> dict[str, Any]:
    return {f.name: getattr(setup, f.name) for f in dataclasses.fields(setup)}
