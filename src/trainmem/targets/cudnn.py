"""cuDNN's buffers below the dispatcher on a CUDA run: convolution workspaces, batch-norm and RNN
reserve space.

Convolution workspaces (aten/src/ATen/native/cudnn/Conv_v8.cpp, the default path since torch 2.0):
* every cuDNN call — forward, backward-data, backward-filter are three separate calls (ConvShared.cpp) —
  allocates its plan's workspace through the caching allocator just before it runs and frees it on
  return (run_conv_plan: `CUDACachingAllocator::get()->allocate(plan.getWorkspaceSize())`). The block
  counts in allocated while the kernel runs and stays in reserved afterwards.
* with `cudnn.benchmark` off the plan is the first of cuDNN's heuristic list that builds and runs
  (get_configs_from_heuristics, try_configs). Which engine that is depends on the GPU and the cuDNN
  release, so its workspace is not knowable here. The point estimate takes the implicit-GEMM engines,
  which cuDNN's API reference describes as computing the convolution "without actually explicitly
  forming the matrix that holds the input tensor data" (cudnnConvolutionFwdAlgo_t): no workspace. The
  high estimate takes the explicit-GEMM engine (CUDNN_CONVOLUTION_FWD_ALGO_GEMM), which forms that
  matrix: channels·∏kernel rows × batch·∏output columns of the input's dtype (the im2col matrix).
* with `cudnn.benchmark` on, the first call of each configuration on each thread (the plan cache is
  thread_local) runs get_plans_from_find: generate_and_filter_plans allocates the largest workspace of
  all candidate plans that fits the largest free block or the free device memory, times every plan in
  it, then frees it — into the cache: Conv_v8.cpp calls no emptyCache (the v7 path, Conv_v7.cpp, does).
  The explicit-GEMM plan is among the candidates, so that allocation is at least the im2col matrix: the
  point estimate. FFT plans can ask for more, up to the free memory; no bound is modelled (a warning).
* depthwise convolutions in fp32 run PyTorch's own depthwise kernels, not cuDNN (Convolution.cpp
  _select_conv_backend, use_cudnn_depthwise): no workspace.

Batch norm (aten/src/ATen/native/cudnn/BatchNorm.cpp): training allocates a workspace and a reserve
space whose sizes cuDNN reports at run time (cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize,
cudnnGetBatchNormalizationTrainingExReserveSpaceSize); RNNs likewise (cudnn/RNN.cpp,
cudnnGetRNNTrainingReserveSize). Counted and stated as gaps: no public formula gives their sizes.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

from trainmem.trace.events import KernelCall, Phase, TensorMeta, Trace

CONV_OPS = frozenset({"convolution", "convolution_backward"})
BN_OPS = frozenset({"native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update"})
RNN_OPS = frozenset({"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"})


@dataclasses.dataclass(frozen=True)
class Workspace:
    """A transient buffer a kernel allocates and frees around its launch."""

    nbytes: int
    label: str


@dataclasses.dataclass
class CudnnPlan:
    """Workspaces to insert before trace event index → list, for the point and the high stream."""

    point: dict[int, list[Workspace]] = dataclasses.field(default_factory=dict)
    high: dict[int, list[Workspace]] = dataclasses.field(default_factory=dict)
    rules: Counter = dataclasses.field(default_factory=Counter)
    gaps: list[str] = dataclasses.field(default_factory=list)


def _conv_geometry(call: KernelCall) -> tuple[TensorMeta, TensorMeta, TensorMeta, bool, int] | None:
    """(input, weight, output) in convolution terms, transposed flag and groups, from either op."""
    if call.op == "convolution":
        x, w = call.args[0], call.args[1]
        transposed, groups = call.args[6], call.args[8]
        y = call.outputs[0] if call.outputs else None
    else:  # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
        #                         transposed, output_padding, groups, output_mask)
        y, x, w = call.args[0], call.args[1], call.args[2]
        transposed, groups = call.args[7], call.args[9]
    if not all(isinstance(t, TensorMeta) for t in (x, w, y)):
        return None
    return x, w, y, bool(transposed), int(groups)


def im2col_bytes(x: TensorMeta, w: TensorMeta, y: TensorMeta, transposed: bool) -> int:
    """The explicit-GEMM matrix: (channels · ∏kernel) × (batch · ∏output spatial) elements of x's dtype.
    A transposed convolution is the data-gradient of the ordinary one, so its roles swap: the matrix is
    built over the transposed op's output channels and its input's positions."""
    image, other = (y, x) if transposed else (x, y)
    channels = image.shape[1]
    kernel = math.prod(w.shape[2:])
    return channels * kernel * image.shape[0] * math.prod(other.shape[2:]) * x.itemsize


def _native_depthwise(x: TensorMeta, w: TensorMeta, groups: int) -> bool:
    return groups > 1 and groups == x.shape[1] and w.shape[1] == 1 and x.dtype == "float32"


def _passes(call: KernelCall) -> list[str]:
    if call.op == "convolution":
        return ["forward"]
    mask = call.args[10] if len(call.args) > 10 else (True, True, False)
    return [name for name, wanted in zip(("backward-data", "backward-filter"), mask) if wanted]


def _key(call: KernelCall, direction: str, thread: str) -> tuple:
    shapes = tuple(a.shape if isinstance(a, TensorMeta) else a for a in call.args[:3])
    return thread, direction, shapes, tuple(str(a) for a in call.args[3:10])


def plan_workspaces(trace: Trace, benchmark: bool) -> CudnnPlan:
    plan, seen = CudnnPlan(), set()
    for call in trace.kernel_calls:
        if call.op not in CONV_OPS or not trace.events:
            continue
        geometry = _conv_geometry(call)
        anchor = trace.events[min(call.at_seq, len(trace.events) - 1)]
        if geometry is None:
            plan.gaps.append(f"{call.op} in '{anchor.module}' without tensor shapes: its cuDNN workspace is not sized")
            continue
        x, w, y, transposed, groups = geometry
        if _native_depthwise(x, w, groups):
            plan.rules["depthwise convolution on PyTorch's own kernel: no cuDNN workspace"] += 1
            continue
        thread = "autograd" if anchor.phase == Phase.BACKWARD else "main"
        size = im2col_bytes(x, w, y, transposed)
        at = call.at_seq + call.outputs_allocated  # after the call's outputs are allocated
        for direction in _passes(call):
            first = _key(call, direction, thread) not in seen
            seen.add(_key(call, direction, thread))
            _add(plan, at, direction, size, benchmark and first)
    return plan


def _add(plan: CudnnPlan, at: int, direction: str, size: int, benchmarking: bool) -> None:
    if benchmarking:
        label = f"cuDNN benchmark workspace, convolution {direction}"
        plan.point.setdefault(at, []).append(Workspace(size, label))
        plan.high.setdefault(at, []).append(Workspace(size, label))
        plan.rules["cuDNN benchmark: largest candidate workspace ≥ im2col matrix, first call per shape and thread"] += 1
        return
    plan.high.setdefault(at, []).append(Workspace(size, f"cuDNN workspace (explicit GEMM), convolution {direction}"))
    plan.rules["cuDNN convolution workspace: 0 B implicit GEMM (point), im2col matrix (high)"] += 1


def _cudnn_batch_norm(call: KernelCall) -> bool:
    """Normalization.cpp _batch_norm_impl_index takes cuDNN for fp32/fp16 inputs with weight and bias (not
    bf16: PyTorch's own kernel, no reserve space)."""
    x = call.args[0] if call.args else None
    return isinstance(x, TensorMeta) and x.dtype != "bfloat16" and len(call.args) > 2 and call.args[1] is not None


def stated_gaps(trace: Trace, benchmark: bool) -> list[str]:
    """What this module counts but does not size."""
    counts = Counter(call.op for call in trace.kernel_calls)
    bn = sum(_cudnn_batch_norm(call) for call in trace.kernel_calls if call.op in BN_OPS)
    rnn = sum(counts[op] for op in RNN_OPS)
    gaps = []
    if bn:
        gaps.append(f"{bn} batch-norm calls: cuDNN's batch-norm workspace and reserve space are sized by cuDNN at "
                    "run time (BatchNorm.cpp cudnnGetBatchNormalizationTrainingExReserveSpaceSize); not sized here")
    if rnn:
        gaps.append(f"{rnn} recurrent-layer calls traced with the CPU kernel: cuDNN's RNN reserve space "
                    "(RNN.cpp cudnnGetRNNTrainingReserveSize) is not modelled")
    if benchmark and any(call.op in CONV_OPS for call in trace.kernel_calls):
        gaps.append("cudnn.benchmark: cuDNN may try workspaces larger than the im2col matrix (FFT plans), up to "
                    "the free device memory (Conv_v8.cpp get_available_workspace); reserved may be higher than both "
                    "figures on the first step")
    return gaps
