"""Turn a trace recorded with CUDA semantics into an Estimate for a GPU: CUDA target stream → caching
allocator replay → allocated / reserved peaks → process memory (reserved + CUDA context)."""

from __future__ import annotations

import dataclasses

from trainmem.alloc.cuda_caching import CudaCachingAllocator, CudaOutOfMemoryError, replay, round_size
from trainmem.alloc.cuda_config import AllocatorConfig
from trainmem.assemble import module_table
from trainmem.devices import Device
from trainmem.estimate import Estimate
from trainmem.baselines import baselines
from trainmem.explain import explain
from trainmem.setup import TrainingSetup
from trainmem.targets import DeviceEvent
from trainmem.targets import cuda as cuda_target
from trainmem.targets import cuda_runtime
from trainmem.trace.events import Category


@dataclasses.dataclass
class Replay:
    allocator: CudaCachingAllocator
    peak_index: int  # the event after which max_memory_allocated was first reached
    tensor_peak: int  # live bytes as requested (no rounding), at their own peak
    oom: str | None  # the simulated out-of-memory message, if the run would fail


def replay_stream(events: list[DeviceEvent], config: AllocatorConfig, capacity: int | None) -> Replay:
    allocator = CudaCachingAllocator(config, capacity)
    best, peak_index, live, tensor_peak = -1, 0, 0, 0
    sizes: dict[int, int] = {}
    for index, event in enumerate(events):
        if event.action == "alloc":
            try:
                allocator.malloc(event.key, event.nbytes)
            except CudaOutOfMemoryError as error:
                return Replay(allocator, peak_index, tensor_peak, f"{error} (at {event.phase}, op {event.op})")
            sizes[event.key] = event.nbytes
            live += event.nbytes
            tensor_peak = max(tensor_peak, live)
            if allocator.allocated_bytes > best:
                best, peak_index = allocator.allocated_bytes, index
        elif event.key in sizes:
            allocator.free(event.key)
            live -= sizes.pop(event.key)
    return Replay(allocator, peak_index, tensor_peak, None)


def segments_at(events: list[DeviceEvent], config: AllocatorConfig, index: int):
    """torch.cuda.memory_snapshot() as it would read at the allocated peak (a second, partial replay)."""
    return replay(events[: index + 1], config).snapshot()


def live_at(events: list[DeviceEvent], index: int) -> dict[int, DeviceEvent]:
    live: dict[int, DeviceEvent] = {}
    for event in events[: index + 1]:
        if event.action == "alloc":
            live[event.key] = event
        else:
            live.pop(event.key, None)
    return live


@dataclasses.dataclass(frozen=True)
class Context:
    point: int
    high: int
    source: str


def context_for(gpu, runtime: cuda_runtime.CudaRuntime, cuda_context: int | None) -> Context:
    """The CUDA context: --cuda-context, else a custom device's context=, else the published figure for
    the target's CUDA version and module loading (targets/cuda_runtime.py), with its range."""
    if cuda_context is not None:
        return Context(cuda_context, cuda_context, "given with --cuda-context")
    if gpu.context_given:
        return Context(gpu.cuda_context_bytes, gpu.cuda_context_bytes, gpu.context_source)
    fact = cuda_runtime.context_fact(runtime)
    return Context(fact.point, fact.high, fact.source)


def _high_reserved(stream, config: AllocatorConfig, point_reserved: int) -> int:
    """max_memory_reserved when the uncertain workspaces take their high sizes (a second replay)."""
    if stream.events_high is None:
        return point_reserved
    return max(point_reserved, replay_stream(stream.events_high, config, None).allocator.peak_reserved_bytes)


def assemble_cuda(source, setup: TrainingSetup, device: Device, traced, depth: int, config: AllocatorConfig,
                  cuda_context: int | None, runtime: cuda_runtime.CudaRuntime | None = None) -> Estimate:
    gpu = device.gpu
    runtime = runtime or cuda_runtime.resolve_runtime(None, None, None)
    context = context_for(gpu, runtime, cuda_context)
    stream = cuda_target.device_stream(traced.trace, gpu.cublas_workspace_bytes, runtime.cudnn_benchmark)
    # cudaMalloc may hand out what the card has left once the CUDA context is in place
    run = replay_stream(stream.events, config, max(device.capacity_bytes - context.point, 0))
    oom = run.oom
    if oom is not None:  # still report the whole run's figures, as if the card were large enough
        run = replay_stream(stream.events, config, None)
    allocator = run.allocator
    live = live_at(stream.events, run.peak_index)
    breakdown = _breakdown(live, allocator, config)
    reserved = allocator.peak_reserved_bytes
    reserved_high = _high_reserved(stream, config, reserved)
    process_parts = {"reserved": reserved, "cuda_context": context.point}
    if stream.managed_peak:
        process_parts["managed_memory"] = stream.managed_peak
    libs, libs_high, lib_notes = cuda_runtime.library_bytes(stream.libraries, runtime, gpu.compute_capability)
    if libs:  # library kernel images under eager module loading (targets/cuda_runtime.py)
        process_parts["library_kernels"] = libs
    process_high = reserved_high + context.high + libs_high + stream.managed_peak
    peak_event = stream.events[run.peak_index]
    warnings = list(traced.warnings) + _runtime_warnings(runtime, context, reserved, reserved_high, stream) + \
        lib_notes + [
        f"caching allocator: {config_text(config)}",
    ] + [f"CUDA rule: {rule}" for rule in stream.rules] + stream.gaps
    if oom is not None:
        warnings.insert(0, f"the simulated run runs out of memory on {device.name}: {oom}")
    if traced.checkpointed:
        warnings.append(f"activation checkpointing wraps {len(traced.checkpointed)} blocks")
    return Estimate(
        model_name=source.name, setup=setup, device=device, parameters=traced.parameters,
        trainable_parameters=traced.trainable_parameters, tensor_bytes=run.tensor_peak,
        process_bytes=sum(process_parts.values()), breakdown=breakdown, peak_phase=str(peak_event.phase),
        peak_module=peak_event.module, peak_op=peak_event.op, peak_step=peak_event.step,
        modules=module_table(traced, live, depth), warnings=warnings,
        explanation=explain(traced, setup, breakdown, "cuda"), process_parts=process_parts,
        baselines=baselines(traced, setup, allocator.peak_allocated_bytes, "max_memory_allocated"),
        coverage={"ops": dict(traced.op_counts), "kernel_rules": stream.rules,
                  "compute_capability": ".".join(map(str, gpu.compute_capability)),
                  "cuda_runtime": {**runtime.to_dict(), "cuda_context_bytes": context.point,
                                   "cuda_context_bytes_high": context.high, "cuda_context_source": context.source,
                                   "reserved_bytes_high": reserved_high, "library_kernel_bytes": libs,
                                   "library_kernel_bytes_high": libs_high}},
        allocated=allocator.peak_allocated_bytes, reserved=reserved,
        allocator=_allocator_summary(allocator, segments_at(stream.events, config, run.peak_index), config, oom),
        fits_override=oom is None, process_high=process_high)


def _breakdown(live: dict[int, DeviceEvent], allocator: CudaCachingAllocator, config: AllocatorConfig) -> dict:
    breakdown = {str(c): 0 for c in Category}
    for event in live.values():
        breakdown[str(event.category)] += round_size(event.nbytes, config)
    # what the allocator charges beyond the 512-byte rounding: blocks kept whole rather than split
    breakdown[str(Category.RUNTIME)] += allocator.peak_allocated_bytes - sum(breakdown.values())
    return breakdown


def _allocator_summary(allocator: CudaCachingAllocator, segments, config: AllocatorConfig, oom: str | None) -> dict:
    fragmentation = allocator.fragmentation
    return {"fragmentation_at_allocated_peak": fragmentation.at_allocated_peak,
            "fragmentation_at_reserved_peak": fragmentation.at_reserved_peak,
            "segments_at_peak": len(segments),
            "large_segment_bytes_at_peak": sum(s.total_size for s in segments if s.segment_type == "large"),
            "small_segment_bytes_at_peak": sum(s.total_size for s in segments if s.segment_type == "small"),
            "settings": config_text(config), "out_of_memory": oom}


def _runtime_warnings(runtime, context: Context, reserved: int, reserved_high: int, stream) -> list[str]:
    lines = [f"CUDA runtime: {runtime.label}",
             f"process memory = max reserved + CUDA context {context.point:,} B ({context.source})"]
    if context.high > context.point or reserved_high > reserved:
        lines.append(f"process_bytes_high = reserved with the high cuDNN workspaces {reserved_high:,} B + "
                     f"the largest reported CUDA context {context.high:,} B"
                     + (" + managed memory" if stream.managed_peak else ""))
    return lines


def config_text(config: AllocatorConfig) -> str:
    default = AllocatorConfig()
    changed = [f"{f.name}={getattr(config, f.name)}" for f in dataclasses.fields(config)
               if getattr(config, f.name) != getattr(default, f.name)]
    return ", ".join(changed) if changed else "PyTorch defaults (no PYTORCH_CUDA_ALLOC_CONF)"
