"""TensorFlow's CPU kernels: the temporaries they allocate inside a call (`OpKernelContext::allocate_temp`).

A TensorFlow kernel allocates its outputs, then its temporaries, through the device's one CPU allocator;
the temporaries are freed when Compute returns, before the executor drops the inputs. The graph never
sees them, so the Keras trace (trace/tf/keras_graph.py) cannot: each rule here sizes them from the call's
shapes with the formula of the kernel that runs on tensorflow-cpu 2.21 for x86-64. There oneDNN is off
unless the CPU has AVX512_VNNI/AVX512_BF16/AVX_VNNI/AMX or TF_ENABLE_ONEDNN_OPTS says so (util.cc, see
alloc/tf_mkl_cpu.py onednn_choice), and the Eigen/"custom" kernels run. With oneDNN on, MklLayoutRewritePass
(mkl_layout_pass.cc) gives the ops of ONEDNN_KERNELS an _Mkl* kernel: their Eigen rules no longer apply and
their own scratch (oneDNN scratchpads through allocate_temp; reorders in oneDNN's own malloc) is not sized,
so `tf_cpu_stream(..., onednn=True)` reports them as gaps; every other op keeps its Eigen kernel and rule.

Checked against TensorFlow's own allocation records (RunMetadata FULL_TRACE, default allocator: requested
bytes) by benchmarks/tf_kernel_scratch.py, results in benchmarks/results/tf_kernel_scratch.md.

Concurrency. The executor runs ready nodes at once on its inter-op threads (executor.cc ScheduleReady: one
inline, the rest pushed to the pool). A convolution's input- and filter-gradient kernels become ready
together (both wait on the same output gradient), so with two or more inter-op threads their col buffers
are live at the same time: the stream keeps the earlier call's temporaries until the later call's are
allocated. No tensorflow import here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from trainmem.alloc.device_events import DeviceEvent

from trainmem.targets import KernelEffect
from trainmem.trace.events import Category, KernelCall, TensorMeta, Trace

WORKING_SET = 30 << 20  # conv_grad_*_ops: "30MB is from ivybridge" (target_working_set_size)
L2_FOR_SPLIT = 256 << 10  # conv_grad_input_ops.h Conv2DCustomBackpropInputOp: l2_cache_size constant


@dataclasses.dataclass(frozen=True)
class CpuFacts:
    """What the CPU kernels read of the machine. `num_threads`: the intra-op pool
    (tensorflow_cpu_worker_threads; intra_op_parallelism_threads 0 → port::MaxParallelism() = schedulable
    CPUs); `inter_op_threads`: the executor's pool (same default); `packet_bytes`: Eigen's packet width the
    wheel is compiled for (256-bit AVX: measured here, depthwise filters padded from 13 to 16 floats);
    `l3_bytes`: Eigen CacheSizes().m_l3, which the 3-D kernels read (cpuid, as glibc's sysconf reads it: here
    256 MiB, the whole package's L3, though sysfs says 32 MiB per core complex; the measured 3-D fallbacks
    need more than 42 MB)."""

    num_threads: int
    inter_op_threads: int
    packet_bytes: int = 32
    l3_bytes: int = 0


def cpu_facts() -> CpuFacts:
    """This machine's facts, read as TensorFlow reads them (sched_getaffinity; sysfs for the L3)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    l3 = _glibc_l3()
    if l3 <= 0:
        try:
            text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
            l3 = int(text.rstrip("KkMm")) << (20 if text[-1] in "Mm" else 10)
        except (OSError, ValueError, IndexError):
            l3 = 0
    return CpuFacts(num_threads=cpus, inter_op_threads=cpus, l3_bytes=l3)


def _glibc_l3() -> int:
    """sysconf(_SC_LEVEL3_CACHE_SIZE) (glibc bits/confname.h: 194), which glibc derives from cpuid as Eigen's
    queryCacheSizes does; Python's os.sysconf does not name it. 0 when unavailable."""
    try:
        import ctypes

        return max(0, int(ctypes.CDLL(None).sysconf(194)))
    except (OSError, AttributeError, ValueError):
        return 0


Rule = Callable[[KernelCall, CpuFacts], KernelEffect]
_RULES: dict[str, Rule] = {}
# ops whose CPU kernel allocates nothing through the allocator but its outputs (source named per op)
NO_TEMPORARIES = {
    "Conv2D": "conv_ops.cc LaunchConv2DOp<CPUDevice>: Eigen SpatialConvolution into the output (measured: none)",
    "_FusedConv2D": "conv_ops_fused_impl.h LaunchFusedConv2DOp<CPUDevice>: Eigen output kernel (measured: none)",
    "MatMul": "matmul_op_impl.h LaunchMatMul<CPUDevice>: Eigen contraction; its packing blocks use Eigen's own "
              "aligned_malloc (the ThreadPoolDevice has no TF allocator), not the CPU allocator",
    "_FusedMatMul": "matmul_op_fused.cc: Eigen contraction with an output kernel, as MatMul",
    "BatchMatMulV2": "batch_matmul_op_impl.h LaunchBatchMatMul<CPUDevice>: Eigen contractions, as MatMul",
    "BatchMatMulV3": "batch_matmul_op_impl.h LaunchBatchMatMul<CPUDevice>: Eigen contractions, as MatMul",
    "MaxPool": "maxpooling_op.cc SpatialMaxPool: writes the output through matrix maps (measured: none)",
    "AvgPool": "avgpooling_op.cc AvgPoolingOp<CPUDevice>: Eigen SpatialAvgPooling (measured: none)",
    "AvgPoolGrad": "avgpooling_op.cc AvgPoolingGradOp<CPUDevice>: sums into the output (measured: none)",
    "Conv3D": "conv_ops_3d.cc LaunchConvOp<CPUDevice>: Eigen CuboidConvolution (measured: none)",
    "FusedBatchNormV3": "fused_batch_norm_op.cc FusedBatchNorm<CPUDevice> NHWC: outputs only (measured: none)",
}


# ops MklLayoutRewritePass rewrites to a oneDNN kernel in tensorflow-cpu 2.21: those it rewrote in this
# project's models with TF_ENABLE_ONEDNN_OPTS=1 (TF_CPP_VMODULE=mkl_layout_pass=1: "rewrote node … with op"),
# and the convolutions mkl_layout_pass.cc registers with AlwaysRewrite outside its ENABLE_ONEDNN_V3 guard.
# FusedBatchNormV3 and its gradient stayed Eigen kernels (their rewrite is inside that guard).
ONEDNN_KERNELS = frozenset({
    "MatMul", "_FusedMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv2D", "_FusedConv2D",
    "Conv2DBackpropFilter", "Conv2DBackpropInput", "Conv3D", "Conv3DBackpropFilterV2", "Conv3DBackpropInputV2",
    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter", "DepthwiseConv2dNativeBackpropInput",
    "MaxPool", "MaxPoolGrad", "Softmax", "Transpose"})


def rule(*ops: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for op in ops:
            if op in _RULES:
                raise ValueError(f"expected one TensorFlow CPU rule for {op}, got a second: {fn.__name__}")
            _RULES[op] = fn
        return fn
    return register


def kernel_scratch(call: KernelCall, cpu: CpuFacts) -> KernelEffect | None:
    """The call's temporaries as signed bytes (after its outputs); None when no rule knows the op."""
    if call.op in NO_TEMPORARIES:
        return KernelEffect(rule=f"{call.op}: none")
    fn = _RULES.get(call.op)
    if fn is None:
        return None
    try:
        return fn(call, cpu)
    except (AttributeError, IndexError, TypeError, ValueError):  # a call without the shapes its rule reads
        return None  # reported as a gap by the stream


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


def _attrs(call: KernelCall) -> dict:
    return call.args[-1] if call.args and isinstance(call.args[-1], dict) else {}


def _nhwc(call: KernelCall) -> bool:
    return str(_attrs(call).get("data_format", "NHWC")) in ("NHWC", "b'NHWC'")


def _col_dims(filter_hwio, out_backprop) -> tuple[int, int, int, int]:
    """(output_image_size, filter_total_size, out_depth, batch) as conv_grad_*_ops compute them."""
    kh, kw, cin, cout = (int(v) for v in filter_hwio)
    batch, oh, ow, _ = (int(v) for v in out_backprop)
    return oh * ow, kh * kw * cin, cout, batch


def _shard(work_unit: int, itemsize: int) -> int:
    # shard_size = ceil(target_working_set_size / work_unit_size), target = (30 << 20) / sizeof(T);
    # not capped by the batch (measured: 129 images' col buffer for a batch of 32)
    target = WORKING_SET // itemsize
    return (target + work_unit - 1) // work_unit


@rule("Conv2DBackpropFilter")
def _conv_filter(call: KernelCall, cpu: CpuFacts) -> KernelEffect:
    """conv_grad_filter_ops.cc Conv2DCustomBackpropFilterOp::Compute (the default CPU registration):
    col_buffer = allocate_temp({shard_size, output_image_size, filter_total_size}), work_unit =
    OIS·FTS + OIS·out_depth + FTS·out_depth."""
    out_backprop = call.args[2]
    if not _nhwc(call) or call.outputs[0] is None:
        return KernelEffect(rule="Conv2DBackpropFilter: not NHWC (unsized)")
    ois, fts, cout, _ = _col_dims(call.outputs[0].shape, out_backprop.shape)
    itemsize = out_backprop.itemsize
    if ois * fts * cout == 0:
        return KernelEffect(rule="Conv2DBackpropFilter: empty")
    col = _shard(ois * fts + ois * cout + fts * cout, itemsize) * ois * fts * itemsize
    return KernelEffect(after=(col, -col), rule="Conv2DCustomBackpropFilterOp col_buffer")


@rule("Conv2DBackpropInput")
def _conv_input(call: KernelCall, cpu: CpuFacts) -> KernelEffect:
    """conv_grad_input_ops.h Conv2DCustomBackpropInputOp::Compute: one image's col buffer when the
    contraction runs in parallel (batch 1, or work_unit / num_threads >= (256 KiB L2) / sizeof(T)),
    else shard_size images' (shard_size as the filter kernel's)."""
    filt, out_backprop = call.args[1], call.args[2]
    if not _nhwc(call):
        return KernelEffect(rule="Conv2DBackpropInput: not NHWC (unsized)")
    ois, fts, cout, batch = _col_dims(filt.shape, out_backprop.shape)
    itemsize = out_backprop.itemsize
    work_unit = ois * cout + fts * cout + ois * fts
    if work_unit == 0:
        return KernelEffect(rule="Conv2DBackpropInput: empty")
    parallel = batch == 1 or work_unit // max(1, cpu.num_threads) >= L2_FOR_SPLIT // itemsize
    col = (1 if parallel else _shard(work_unit, itemsize)) * ois * fts * itemsize
    return KernelEffect(after=(col, -col), rule="Conv2DCustomBackpropInputOp col_buffer")


def _depthwise(filter_hwim, itemsize: int, cpu: CpuFacts) -> tuple[int, int, bool]:
    """(filter_spatial_size, padded_out_depth, padded?) of depthwise_conv_op.cc / depthwise_conv_grad_op.cc."""
    kh, kw, cin, mult = (int(v) for v in filter_hwim)
    packet = max(1, cpu.packet_bytes // itemsize)
    out_depth = cin * mult
    return kh * kw, -(-out_depth // packet) * packet, out_depth % packet != 0


def _shard_buffers(each: int, cpu: CpuFacts) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per-shard buffers (allocate_temp inside Shard's work function): at most one per running shard,
    num_threads workers plus the calling thread (work_sharder.cc Shard → ParallelFor)."""
    count = max(1, cpu.num_threads) + 1
    return (each,) * count, (-each,) * count


@rule("DepthwiseConv2dNative")
def _dw_forward(call: KernelCall, cpu: CpuFacts) -> KernelEffect:
    """depthwise_conv_op.cc LaunchDepthwiseConvOp<CPUDevice>: padded_filter {fs, padded} when out_depth is
    not a packet multiple; each shard an input_buffer {fs, padded}."""
    itemsize = call.args[0].itemsize
    fs, padded, pad = _depthwise(call.args[1].shape, itemsize, cpu)
    grow, shrink = _shard_buffers(fs * padded * itemsize, cpu)
    filt = (fs * padded * itemsize,) if pad else ()
    return KernelEffect(after=filt + grow + shrink + tuple(-b for b in filt), rule="DepthwiseConv2dNative buffers")


@rule("DepthwiseConv2dNativeBackpropInput")
def _dw_input(call: KernelCall, cpu: CpuFacts) -> KernelEffect:
    """depthwise_conv_grad_op.cc LaunchDepthwiseConvBackpropInputOp<CPUDevice>: padded filter copy when
    out_depth is not a packet multiple; each shard a filter-sized buffer and an out_backprop row."""
    itemsize = call.args[2].itemsize
    fs, padded, pad = _depthwise(call.args[1].shape, itemsize, cpu)
    grow, shrink = _shard_buffers((fs * padded + padded) * itemsize, cpu)
    filt = (fs * padded * itemsize,) if pad else ()
    return KernelEffect(after=filt + grow + shrink + tuple(-b for b in filt),
                        rule="DepthwiseConv2dNativeBackpropInput buffers")


@rule("DepthwiseConv2dNativeBackpropFilter")
def _dw_filter(call: KernelCall, cpu: CpuFacts) -> KernelEffect:
    """depthwise_conv_grad_op.cc LaunchDepthwiseConvBackpropFilterOp<CPUDevice>: output_buffer
    {batch, fs, padded_out_depth}, and each shard an input_buffer {fs, padded}."""
    itemsize = call.args[0].itemsize
    fs, padded, _ = _depthwise(call.outputs[0].shape, itemsize, cpu)
    batch = int(call.args[0].shape[0])
    out_buffer = batch * fs * padded * itemsize
    grow, shrink = _shard_buffers(fs * padded * itemsize, cpu)
    return KernelEffect(after=(out_buffer,) + grow + shrink + (-out_buffer,),
                        rule="DepthwiseConv2dNativeBackpropFilter buffers")


@rule("MaxPoolGrad")
def _max_pool_grad(call: KernelCall, cpu: CpuFacts) -> KernelEffect:
    """maxpooling_op.cc MaxPoolingGradOp<CPUDevice>: tensor_out_dup = forward_input_or_allocate_temp of the
    pool's output (counted as a copy: measured allocated), tensor_out_arg_max = allocate_temp int64 of it."""
    pooled: TensorMeta = call.args[1]
    elements = _numel(pooled.shape)
    dup, argmax = elements * pooled.itemsize, elements * 8
    return KernelEffect(after=(dup, argmax, -argmax, -dup), rule="MaxPoolingGradOp out copy + int64 argmax")


MAX_OVERHEAD = 25  # conv_grad_ops_3d.cc kMaxTempAllocationOverhead: col buffer / all tensors' elements


def _conv3d_col(call: KernelCall, cpu: CpuFacts, filt, x, dy, parallel_if_batch_one: bool) -> KernelEffect:
    """conv_grad_ops_3d.cc Conv3DCustomBackprop{Input,Filter}Op: shard = ceil((m_l3 / sizeof(T)) / work_unit)
    (the input kernel: 1 image when batch is 1); col_buffer {shard, OIS, FTS}, unless col elements //
    (input + filter + out_backprop elements) > 25: then Eigen's CuboidConvolutionBackward*, no temporary."""
    if cpu.l3_bytes <= 0:
        return KernelEffect(rule=f"{call.op}: L3 size unknown (unsized)")
    kd, kh, kw, cin, cout = (int(v) for v in filt)
    ois, fts, itemsize = _numel(dy.shape[1:4]), kd * kh * kw * cin, dy.itemsize
    work_unit = ois * cout + fts * cout + ois * fts
    if work_unit == 0:
        return KernelEffect(rule=f"{call.op}: empty")
    batch = int(dy.shape[0])
    target = cpu.l3_bytes // itemsize
    shard = 1 if parallel_if_batch_one and batch == 1 else (target + work_unit - 1) // work_unit
    col = shard * ois * fts
    if col // (_numel(x) + _numel(filt) + _numel(dy.shape)) > MAX_OVERHEAD:
        return KernelEffect(rule=f"{call.op}: Eigen fallback, no col buffer")
    return KernelEffect(after=(col * itemsize, -col * itemsize), rule=f"{call.op} col_buffer")


@rule("Conv3DBackpropInputV2")
def _conv3d_input(call: KernelCall, cpu: CpuFacts) -> KernelEffect:
    return _conv3d_col(call, cpu, call.args[1].shape, call.outputs[0].shape, call.args[2], True)


@rule("Conv3DBackpropFilterV2")
def _conv3d_filter(call: KernelCall, cpu: CpuFacts) -> KernelEffect:
    return _conv3d_col(call, cpu, call.outputs[0].shape, call.args[0].shape, call.args[2], False)


@rule("FusedBatchNormGradV3")
def _batch_norm_grad(call: KernelCall, cpu: CpuFacts) -> KernelEffect:
    """fused_batch_norm_op.cc FusedBatchNormGrad<CPUDevice>: scratch_one_by_depth {depth} of U (float),
    and scratch_rest_by_depth {rest, depth} of U when T is not U (half/bfloat16); for float it reuses the
    x_backprop output."""
    x, scale = call.args[1], call.args[2]
    depth = int(scale.shape[0]) if scale.shape else 1
    u = scale.itemsize
    buffers = (depth * u,) + ((_numel(x.shape) * u,) if x.itemsize != u else ())
    return KernelEffect(after=buffers + tuple(-b for b in reversed(buffers)), rule="FusedBatchNormGrad scratch")


def kernel_rules() -> frozenset[str]:
    return frozenset(_RULES) | frozenset(NO_TEMPORARIES)


# kernels that become ready together: a convolution's two gradients wait on the same output gradient
_PAIRED = {"Conv2DBackpropInput": 2, "Conv2DBackpropFilter": 2, "DepthwiseConv2dNativeBackpropInput": 2,
           "DepthwiseConv2dNativeBackpropFilter": 2}  # op → index of the out_backprop argument


def tf_cpu_device_stream(trace: Trace, cpu: CpuFacts | None = None, *, onednn: bool = False):
    """targets.DeviceStream: the trace's events with each kernel call's temporaries spliced in after its
    outputs; `rules` counts the rules applied, `gaps` names the ops no rule knows (never dropped silently)."""
    from trainmem.targets import DeviceStream

    cpu = cpu or cpu_facts()
    per_call, fired, gaps = _call_events(trace, cpu, onednn)
    if cpu.inter_op_threads >= 2:
        _overlap_pairs(trace, per_call)
    stream: list[DeviceEvent] = []
    inserts: dict[int, list[DeviceEvent]] = {}
    for index, events in per_call.items():
        call = trace.kernel_calls[index]
        inserts.setdefault(call.at_seq + max(0, call.outputs_allocated - 1), []).extend(events)
    for seq, event in enumerate(trace.events):
        record = trace.storages.get(event.sid)
        stream.append(DeviceEvent(event.action, event.nbytes, event.sid,
                                  record.category if record else Category.TEMPORARIES, event.phase, event.module,
                                  event.op, event.step, event.seq))
        stream.extend(inserts.pop(seq, []))
    for rest in inserts.values():  # a call recorded after the last event
        stream.extend(rest)
    return DeviceStream(stream, fired, tuple(f"{op} ×{n}: temporaries not sized" for op, n in sorted(gaps.items())))


def tf_cpu_stream(trace: Trace, cpu: CpuFacts | None = None, *, onednn: bool = False) -> list[DeviceEvent]:
    """The allocator's event stream for the TensorFlow CPU target (the trace plus kernel temporaries)."""
    return tf_cpu_device_stream(trace, cpu, onednn=onednn).events


def _call_events(trace: Trace, cpu: CpuFacts, onednn: bool):
    """Per kernel call (by index): its temporaries as events; rule counts; unknown ops counted."""
    per_call: dict[int, list[DeviceEvent]] = {}
    fired: dict[str, int] = {}
    gaps: dict[str, int] = {}
    keys = iter(range(-1, -(1 << 62), -1))
    for index, call in enumerate(trace.kernel_calls):
        if onednn and call.op in ONEDNN_KERNELS:
            name = f"{call.op} as a oneDNN kernel (its scratchpad and reorders)"
            gaps[name] = gaps.get(name, 0) + 1
            continue
        effect = kernel_scratch(call, cpu)
        if effect is None:
            gaps[call.op] = gaps.get(call.op, 0) + 1
            continue
        if effect.after:  # known ops without temporaries (NO_TEMPORARIES) are neither rules nor gaps
            fired[effect.rule] = fired.get(effect.rule, 0) + 1
            per_call[index] = _events(effect.after, call, trace, keys)
    return per_call, fired, gaps


def _events(deltas, call: KernelCall, trace: Trace, keys) -> list[DeviceEvent]:
    """Signed sizes → alloc/free events; a free releases the latest live buffer of that size."""
    anchor = trace.events[min(call.at_seq, len(trace.events) - 1)] if trace.events else None
    live: list[tuple[int, int]] = []
    out: list[DeviceEvent] = []
    for delta in deltas:
        if delta > 0:
            live.append((next(keys), delta))
            key, size, action = live[-1][0], delta, "alloc"
        else:
            position = max(i for i, (_, size) in enumerate(live) if size == -delta)
            (key, size), action = live.pop(position), "free"
        out.append(DeviceEvent(action, size, key, Category.RUNTIME, anchor.phase if anchor else "backward",
                               anchor.module if anchor else "", call.op, anchor.step if anchor else 0, call.at_seq))
    return out


def _overlap_pairs(trace: Trace, per_call: dict[int, list[DeviceEvent]]) -> None:
    """Gradient kernels fed by the same output gradient run at once (executor.cc ScheduleReady): the
    earlier call's frees move after the later call's allocations, so both sets are live together."""
    groups: dict[int, list[int]] = {}
    for index, call in enumerate(trace.kernel_calls):
        position = _PAIRED.get(call.op)
        if position is None or index not in per_call or len(call.args) <= position:
            continue
        key = getattr(call.args[position], "storage_key", -1)
        if key not in (-1, None):
            groups.setdefault(key, []).append(index)
    for members in groups.values():
        members.sort(key=lambda i: trace.kernel_calls[i].at_seq)
        last = members[-1]
        for index in members[:-1]:
            frees = [e for e in per_call[index] if e.action == "free"]
            per_call[index] = [e for e in per_call[index] if e.action == "alloc"]
            allocs = [e for e in per_call[last] if e.action == "alloc"]
            per_call[last] = allocs + frees + [e for e in per_call[last] if e.action == "free"]
