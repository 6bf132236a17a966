"""What TensorFlow holds on a GPU while Keras trains, and what each of its three numbers shows. No TensorFlow
import: the step comes as the TraceResult of trace_keras (trace/tf/keras_graph.py), the GPU as a devices.Device.

* The memory limit of TF's GPU device (tensorflow/core/common_runtime/gpu/gpu_device.cc,
  SingleVirtualDeviceMemoryLimit): `available` is the free memory cuMemGetInfo reports once the CUDA context
  exists; without per_process_gpu_memory_fraction the limit is available − MinSystemMemory(available, cc
  major): 225 MiB when available < 2 GiB, else 500 MiB (cc ≤ 6), 1050 MiB (7), 1536 MiB (8), 1800 MiB (9 and
  newer) — the table of the 2024 source read (xla/ include paths, PJRT-era); tensorflow PR #44810 (TF 2.5)
  introduced the first three, the 1800 MiB row came later. TF_DEVICE_MIN_SYS_MEMORY_IN_MB replaces
  the reserve. With a fraction the limit is fraction × total memory. A logical device's memory_limit (MB,
  tf.config.set_logical_device_configuration) is used as given: `static_cast<int64>(mb) * (1ll << 20)`.
* The allocator: GPUBFCAllocator (alloc/tf_bfc.py) over that limit, on cuMemAlloc regions
  (gpu_process_state.cc CreateSubAllocator: DeviceMemAllocator, whose SupportsCoalescing is false —
  xla/stream_executor/integrations/device_mem_allocator.h; the virtual-memory allocator is compiled out).
  Modes: "default" (allow_growth false: the first allocation maps one region of the whole limit, and it
  comes with the first op the device runs — BaseGPUDevice::ReinitializeGpuDevice → InitScratchBuffers
  allocates Eigen's scratch, Eigen::kGpuScratchSize (1024) + sizeof(unsigned int) bytes, before the op's
  outputs, so it heads the stream); "growth" (allow_growth / set_memory_growth:
  regions from 2 MiB, doubling); "limit:SIZE" (a logical device's memory_limit: one region of that size);
  "fraction:F" (per_process_gpu_memory_fraction).
* cuDNN convolution workspaces as TF requests them (conv_ops_gpu.cc AutotuneUnfusedConv, autotune_conv_impl.h
  AutotuneConvImpl): autotuning is on by default (TF_CUDNN_USE_AUTOTUNE) and runs at the first call of each
  convolution configuration: the op's result (output, input or filter gradient) is shadowed by a copy with
  8 MiB redzones on each side (RedzoneAllocator::kDefaultRedzoneSize, "8MiB per side, 16MiB total"; the
  check is on unless TF_DISABLE_RZ_CHECK), and every candidate algorithm's
  workspace is allocated with its redzones, run, and freed. Those requests may fail without failing the step
  (scratch is allocated with retry_on_failure false: the algorithm is skipped). Each workspace is capped by
  TF_CUDNN_WORKSPACE_LIMIT_IN_MB, default 1 << 32 B (4 GiB). Which algorithms cuDNN offers and what each asks
  for is known only on the GPU, so the point stream takes the explicit-GEMM candidate, whose workspace is the
  im2col matrix (as targets/cudnn.py sizes it for PyTorch; here over TF's HWIO filters), at every call (autotuning adds the output copy and redzones
  at the first); the high stream lets every call ask for the 4 GiB cap, which, when it cannot be served, means
  the workspace may take all the memory left: the high figures are then the limit.
* Outside the allocator: the CUDA context. TensorFlow 2.21 is built with CUDA 12.5 (its `and-cuda` extra:
  nvidia-cuda-runtime-cu12>=12.5.82), which loads modules lazily by default, so the context figures of
  targets/cuda_runtime.py (CUDA 12, lazy: 256 MiB, up to 426 MiB) apply — they were measured in PyTorch
  processes and are borrowed here: a CUDA context does not depend on the framework above it, but TF's
  cuBLAS/cuDNN handles and the kernels they load are not sized (the high end of the range covers them).
"""

from __future__ import annotations

import dataclasses
import math

from trainmem.alloc.tf_bfc import BfcConfig, BfcReplay, replay_bfc
from trainmem.errors import SetupError
from trainmem.alloc.device_events import DeviceEvent
from trainmem.targets.cuda_runtime import LAZY, CudaRuntime, context_fact
from trainmem.trace.events import Category, KernelCall, Phase, TensorMeta, Trace
from trainmem.units import parse_bytes

MiB = 1 << 20
GiB = 1 << 30
TF_CUDA_VERSION = (12, 5)  # tensorflow 2.21 METADATA: and-cuda requires nvidia-cuda-runtime-cu12>=12.5.82
EIGEN_SCRATCH_BYTES = 1024 + 4  # gpu_device.cc InitScratchBuffers: Eigen::kGpuScratchSize + sizeof(unsigned int)
CUDNN_WORKSPACE_LIMIT = 1 << 32  # conv_ops_gpu.cc: GetDnnWorkspaceLimit("TF_CUDNN_WORKSPACE_LIMIT_IN_MB", 1LL << 32)
REDZONE_BYTES = 1 << 23  # redzone_allocator.h kDefaultRedzoneSize, per side
SMALL_AVAILABLE = 1 << 31  # MinSystemMemory: below 2 GiB available the reserve is 225 MiB
CONV_OPS = frozenset("Conv2D Conv2DBackpropInput Conv2DBackpropFilter Conv3D Conv3DBackpropInputV2 "
                     "Conv3DBackpropFilterV2 _FusedConv2D".split())
# (input, filter, output) positions per op: an index into the call's inputs, or "out" for its first output
_ROLES = {"Conv2D": (0, 1, "out"), "Conv3D": (0, 1, "out"), "_FusedConv2D": (0, 1, "out"),
          "Conv2DBackpropInput": ("out", 1, 2), "Conv3DBackpropInputV2": ("out", 1, 2),
          "Conv2DBackpropFilter": (0, "out", 2), "Conv3DBackpropFilterV2": (0, "out", 2)}
MODES = ("default", "growth", "limit:SIZE", "fraction:F")


def min_system_memory(available: int, cc_major: int) -> int:
    """gpu_device.cc MinSystemMemory for an optimized build (debug builds double it)."""
    if available < SMALL_AVAILABLE:
        return 225 * MiB
    if cc_major <= 6:
        return 500 * MiB
    if cc_major <= 7:
        return 1050 * MiB
    return 1536 * MiB if cc_major <= 8 else 1800 * MiB


@dataclasses.dataclass(frozen=True)
class MemoryLimit:
    limit: int  # the BFC allocator's memory limit
    available: int  # free memory once the context exists (cuMemGetInfo)
    reserve: int  # what the limit leaves of `available`
    how: str


def default_memory_limit(device, context: int, *, min_sys_memory_mb: int | None = None,
                         fraction: float = 0.0, driver_reserved: int = 0) -> MemoryLimit:
    """SingleVirtualDeviceMemoryLimit for `device` (a devices.Device with a GpuSpec) with `context` bytes of
    CUDA context already taken. `driver_reserved`: what the driver keeps beyond nvidia-smi's total
    (cuMemGetInfo's total is lower); the catalog does not record it, so 0 by default (the limit may then be
    high by it, ~0.5-1.5% of the card)."""
    total = device.capacity_bytes - driver_reserved
    available = total - context
    cc_major = device.gpu.compute_capability[0]
    if fraction > 0:
        limit, how = int(total * fraction), f"per_process_gpu_memory_fraction {fraction} × total {total:,} B"
    else:
        reserve = min_system_memory(available, cc_major)
        limit = available - reserve if reserve < available else available
        how = f"available {available:,} B − MinSystemMemory {reserve:,} B (cc {cc_major}.x)"
    if min_sys_memory_mb is not None and min_sys_memory_mb * MiB <= available:
        limit = available - min_sys_memory_mb * MiB
        how = f"available − TF_DEVICE_MIN_SYS_MEMORY_IN_MB={min_sys_memory_mb}"
    return MemoryLimit(limit, available, available - limit, how)


@dataclasses.dataclass(frozen=True)
class TfGpuFigures:
    """The three numbers a TensorFlow GPU run shows, with their parts and the assumptions behind them."""

    memory_mode: str
    memory_limit: int
    peak_in_use: int  # tf.config.experimental.get_memory_info("GPU:0")["peak"]
    peak_in_use_high: int
    region_bytes: int  # what the BFC regions held at most (cuMemAlloc)
    region_bytes_high: int
    process_bytes: int  # nvidia-smi, per process
    process_bytes_high: int
    parts: dict[str, int]  # process_bytes in named parts
    live_at_peak: dict[Category, int]  # chunk bytes at the in-use peak, by category
    out_of_memory: str | None  # the step does not fit: the failing request
    needed_in_use: int  # the in-use peak the step needs (on a card large enough when it does not fit)
    warnings: list[str]
    explanation: list[str]
    replay: BfcReplay

    @property
    def fits(self) -> bool:
        return self.out_of_memory is None


def parse_mode(mode: str) -> tuple[str, float | int | None]:
    text = str(mode).strip().lower()
    if text in ("default", "growth"):
        return text, None
    kind, _, value = text.partition(":")
    try:
        if kind == "limit" and value:
            return "limit", parse_bytes(value, "--tf-memory")
        if kind == "fraction" and value and 0 < float(value) <= 1:
            return "fraction", float(value)
    except (SetupError, ValueError):
        pass
    raise SetupError(f"expected a TensorFlow GPU memory mode among {', '.join(MODES)} (e.g. limit:8GiB), "
                     f"got {mode!r}", where="--tf-memory")


def tf_gpu_figures(traced, device, memory_mode: str = "default", *, context_bytes: int | None = None,
                   min_sys_memory_mb: int | None = None, garbage_collection: bool = True) -> TfGpuFigures:
    """The figures of `traced` (trace_keras's TraceResult) on `device` (a devices.Device of kind cuda) in `memory_mode`."""
    context, context_high, context_words = _context(_gpu(device), context_bytes)
    kind, limit, config = _bfc_setting(device, memory_mode, context, min_sys_memory_mb, garbage_collection)
    point, high, gaps = device_streams(traced.trace)
    replay = replay_bfc(point, config, optional=is_scratch)
    replay_high = replay_bfc(high, config, optional=is_scratch)
    needed = replay.peak_in_use
    if replay.out_of_memory is not None:
        roomy = dataclasses.replace(config, memory_limit=1 << 50, device_free=None)
        needed = replay_bfc(point, roomy, optional=is_scratch).peak_in_use
    in_use_high, regions_high = _high(replay_high, config)
    regions = replay.peak_region_bytes
    parts = {"CUDA context": context, "BFC regions": regions}
    warnings = _warnings(traced, kind, limit, context_words, gaps)
    return TfGpuFigures(memory_mode, limit.limit, replay.peak_in_use, max(in_use_high, replay.peak_in_use), regions,
                        max(regions_high, regions), sum(parts.values()), context_high + max(regions_high, regions),
                        parts, dict(replay.live_at_peak), replay.out_of_memory, needed, warnings,
                        _explain(kind, limit, replay, regions, context), replay)


def bfc_config(device, memory_mode: str = "default", context_bytes: int | None = None) -> BfcConfig:
    """The BFC allocator TensorFlow builds on `device` in `memory_mode` (what tf_gpu_figures replays)."""
    context = _context(_gpu(device), context_bytes)[0]
    return _bfc_setting(device, memory_mode, context, None, True)[2]


def _gpu(device):
    if device.gpu is None:
        raise SetupError(f"expected a GPU device for TensorFlow's GPU figures, got {device.name!r}", where="--device")
    return device


def _bfc_setting(device, memory_mode: str, context: int, min_sys_memory_mb: int | None,
                 garbage_collection: bool) -> tuple[str, MemoryLimit, BfcConfig]:
    kind, value = parse_mode(memory_mode)
    limit = _limit(kind, value, device, context, min_sys_memory_mb)
    config = BfcConfig(limit.limit, allow_growth=kind == "growth", garbage_collection=garbage_collection,
                       device_free=limit.available)
    return kind, limit, config


def is_scratch(event: DeviceEvent) -> bool:
    """cuDNN's scratch: a request that may fail (TF then skips that algorithm), alloc/tf_bfc.py replay_bfc."""
    return event.category == Category.RUNTIME and event.op.startswith("cuDNN")


def _context(device, given: int | None) -> tuple[int, int, str]:
    if given is not None:
        return given, given, f"CUDA context {given:,} B as given"
    if device.gpu.context_given:
        return device.gpu.cuda_context_bytes, device.gpu.cuda_context_bytes, "CUDA context as given with the device"
    fact = context_fact(CudaRuntime(TF_CUDA_VERSION, LAZY, False, "TensorFlow 2.21's CUDA 12.5"))
    return fact.point, fact.high, (f"CUDA context {fact.point:,} B (high {fact.high:,} B), CUDA 12 lazy loading, "
                                   f"measured with PyTorch and borrowed: {fact.source}")


def _limit(kind: str, value, device, context: int, min_sys_memory_mb: int | None) -> MemoryLimit:
    if kind == "limit":
        base = default_memory_limit(device, context)
        mb = int(value) // MiB  # memory_limit_mb is whole MiB: static_cast<int64>(mb) * (1ll << 20)
        return MemoryLimit(mb * MiB, base.available, base.available - mb * MiB, f"memory_limit {mb} MB")
    fraction = float(value) if kind == "fraction" else 0.0
    return default_memory_limit(device, context, min_sys_memory_mb=min_sys_memory_mb, fraction=fraction)


def _high(replay_high: BfcReplay, config: BfcConfig) -> tuple[int, int]:
    """A 4 GiB workspace request that could not be served means cuDNN may take whatever is left: the limit."""
    if replay_high.optional_failed:
        return config.memory_limit, config.memory_limit
    return replay_high.peak_in_use, replay_high.peak_region_bytes


# ---- the device streams


def device_streams(trace: Trace) -> tuple[list[DeviceEvent], list[DeviceEvent], list[str]]:
    """The point and high streams TF's BFC allocator sees for `trace`: Eigen's scratch at device creation, the
    trace's storages (each alloc and free by storage id), and cuDNN's scratch around each convolution."""
    point_at, high_at, gaps = _conv_scratch(trace)
    return _build(trace, point_at), _build(trace, high_at), gaps


def _build(trace: Trace, inserts: dict[int, list[tuple[int, str]]]) -> list[DeviceEvent]:
    events = [DeviceEvent("alloc", EIGEN_SCRATCH_BYTES, -1, Category.RUNTIME, Phase.INIT, "",
                          "Eigen GPU scratch (BaseGPUDevice::InitScratchBuffers, at the first op)", 0, 0)]
    for event in trace.events:
        _scratch(events, inserts.get(event.seq, []), event)
        category = trace.storages[event.sid].category
        events.append(DeviceEvent(event.action, event.nbytes, event.sid, category, event.phase, event.module,
                                  event.op, event.step, event.seq))
    if trace.events:
        _scratch(events, [s for at, ss in inserts.items() if at >= len(trace.events) for s in ss], trace.events[-1])
    return events


def _scratch(events: list[DeviceEvent], buffers: list[tuple[int, str]], event) -> None:
    """Transient buffers, each allocated after the previous one: the autotuning output copy stays while
    the candidates' workspaces come and go (labels ending in "(held)" are freed after the others)."""
    held = []
    for nbytes, label in buffers:
        key = -2 - len(events)
        events.append(DeviceEvent("alloc", nbytes, key, Category.RUNTIME, event.phase, event.module, label,
                                  event.step, event.seq))
        if label.endswith("(held)"):
            held.append((key, nbytes, label))
            continue
        events.append(DeviceEvent("free", nbytes, key, Category.RUNTIME, event.phase, event.module, label,
                                  event.step, event.seq))
    for key, nbytes, label in held:
        events.append(DeviceEvent("free", nbytes, key, Category.RUNTIME, event.phase, event.module, label,
                                  event.step, event.seq))


def _conv_scratch(trace: Trace) -> tuple[dict, dict, list[str]]:
    point: dict[int, list[tuple[int, str]]] = {}
    high: dict[int, list[tuple[int, str]]] = {}
    gaps: list[str] = []
    seen: set[tuple] = set()
    for call in trace.kernel_calls:
        if call.op not in CONV_OPS:
            continue
        at = call.at_seq + call.outputs_allocated
        geometry = _geometry(call)
        workspace = _gemm_workspace(*geometry) if geometry is not None else 0
        if geometry is None:
            gaps.append(f"{call.op} without tensor shapes: its cuDNN workspace is sized only in the high figures")
        # the buffer autotuning shadows is the op's result: output, input gradient or filter gradient
        out = call.outputs[0] if call.outputs and isinstance(call.outputs[0], TensorMeta) else None
        out_bytes = out.itemsize * math.prod(out.shape) if out is not None and min(out.shape, default=1) > 0 else 0
        key = (call.op, tuple(a.shape for a in call.args if isinstance(a, TensorMeta)))
        first = key not in seen
        seen.add(key)
        point.setdefault(at, []).extend(_candidates(call.op, workspace, out_bytes, first))
        high.setdefault(at, []).extend(_candidates(call.op, CUDNN_WORKSPACE_LIMIT, out_bytes, first))
    return point, high, gaps


def _candidates(op: str, workspace: int, out_bytes: int, autotune: bool) -> list[tuple[int, str]]:
    """The first call of a configuration autotunes (conv_ops_gpu.cc: WrapRedzoneBestEffort shadows the result
    while each candidate's workspace comes and goes); later calls run the chosen algorithm's workspace."""
    if not autotune:
        return [(workspace, f"cuDNN workspace, {op}")] if workspace else []
    out = [(out_bytes + 2 * REDZONE_BYTES, f"cuDNN autotune result copy with redzones, {op} (held)")]
    return out + [(workspace + 2 * REDZONE_BYTES, f"cuDNN autotune workspace with redzones, {op}")]


def _geometry(call: KernelCall) -> tuple[TensorMeta, TensorMeta, TensorMeta] | None:
    roles = _ROLES.get(call.op)
    picked = []
    for role in roles or ():
        meta = (call.outputs[0] if call.outputs else None) if role == "out" else (
            call.args[role] if role < len(call.args) else None)
        picked.append(meta)
    if len(picked) != 3 or not all(isinstance(m, TensorMeta) and all(d > 0 for d in m.shape) for m in picked):
        return None
    return picked[0], picked[1], picked[2]


def _gemm_workspace(x: TensorMeta, w: TensorMeta, y: TensorMeta) -> int:
    """The explicit-GEMM workspace: (∏kernel · in channels) × (batch · ∏output positions) elements. TF's
    filters are [spatial..., in, out] (HWIO), so ∏w.shape[:-1] rows; the output's positions are its elements
    over the out channels, whatever the data format."""
    rows = math.prod(w.shape[:-1])
    columns = math.prod(y.shape) // max(w.shape[-1], 1)
    return rows * columns * x.itemsize


# ---- words


def _warnings(traced, kind: str, limit: MemoryLimit, context_words: str, gaps: list[str]) -> list[str]:
    out = [context_words, f"memory limit {limit.limit:,} B: {limit.how}",
           "cuDNN workspaces: the algorithm TF's autotuner picks is known only on the GPU; the point takes the "
           "explicit-GEMM (im2col) workspace, the high lets each convolution take up to the 4 GiB "
           "TF_CUDNN_WORKSPACE_LIMIT_IN_MB cap", "cuBLAS/cuDNN handles and the kernels they load lazily are not "
                                                  "sized (covered by the context's high figure)"]
    if traced.framework.jit_compile_on_gpu:
        out.append("Keras compiles the step with XLA on a GPU (jit_compile='auto'): XLA packs temporaries into "
                   "its own buffers in the same BFC allocator, so the op-by-op stream here is an approximation")
    if kind == "default":
        out.append("default mode: TF maps the whole memory limit at start; nvidia-smi shows it whatever the model")
    return out + gaps


def _explain(kind: str, limit: MemoryLimit, replay: BfcReplay, regions: int, context: int) -> list[str]:
    growth = {"default": "one region of the whole limit, mapped when the GPU device is created",
              "growth": "regions from 2 MiB, each doubling, as the step needs them",
              "limit": "one region of the configured limit", "fraction": "one region of the fraction's limit"}[kind]
    return [f"peak in use {replay.peak_in_use:,} B: tf.config.experimental.get_memory_info('GPU:0')['peak'], the "
            "BFC chunks in use at the step's peak (each request rounded to 256 B; chunks not split are counted "
            "whole), cuDNN's autotuning scratch of the first step included",
            f"BFC regions {regions:,} B: what TF took from cuMemAlloc — {growth}; limit {limit.limit:,} B",
            f"nvidia-smi {context + regions:,} B: the CUDA context ({context:,} B) plus the regions; TF never "
            "returns regions to the driver during training (only idle ones, to avoid an OOM)"]

