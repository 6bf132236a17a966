"""The CUDA target: turn a CPU trace recorded with CUDA semantics into the event stream a CUDA run
sends to PyTorch's caching allocator.

What the trace already carries (trace/cuda_autocast.py, trace/cuda_composites.py, the foreach optimizer
default): CUDA's autocast lists and cast cache, the attention backend CUDA picks and what it saves.
What this module adds or removes, one rule per mechanism, each with its source:

* cuBLAS workspace — allocated through the caching allocator the first time a thread's handle is
  used on a stream, and kept (aten/src/ATen/cuda/CublasHandlePool.cpp: getCurrentCUDABlasHandle →
  cublasSetWorkspace with getCUDABlasWorkspace(), keyed by (handle, stream); handles come from a
  per-thread pool). A training step uses two threads: the Python thread runs forward and the loss,
  autograd's device thread runs backward, so two workspaces. cuBLASLt shares it
  (getCUDABlasLtWorkspace returns the cuBLAS workspace unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=0).
* host tensors — the optimizers' `step` counters live on the CPU unless the optimizer is fused or
  capturable (torch/optim/adam.py _init_group: `torch.tensor(0.0, dtype=_get_scalar_dtype())`
  without a device), so they are not in the CUDA allocator's figures.
* managed memory — paged optimizers (bitsandbytes PagedAdamW8bit) allocate large states with
  cudaMallocManaged (functional.get_paged), outside the caching allocator: not in allocated/reserved.
  Their bytes are counted apart (`managed_peak`) and added to the process figure, as pages resident
  on the GPU while the optimizer runs.
* cuDNN convolution workspaces are transient and depend on the algorithm cuDNN's heuristics pick on
  the real GPU: counted and reported, not sized (a stated gap).
"""

from __future__ import annotations

import dataclasses

from trainmem.targets import DeviceEvent
from trainmem.trace.events import Category, Phase, Trace

# ops that reach cuBLAS / cuBLASLt (aten/src/ATen/native/cuda/Blas.cpp, LinearAlgebra.cpp)
CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot",
                        "_addmm_activation", "addr"})
CUDNN_CONV_OPS = frozenset({"convolution", "convolution_backward"})
CUDNN_RNN_OPS = frozenset({"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"})


def kernel_ops() -> frozenset[str]:
    return CUBLAS_OPS | CUDNN_CONV_OPS | CUDNN_RNN_OPS


@dataclasses.dataclass
class CudaStream:
    events: list[DeviceEvent]
    rules: dict[str, int]  # rule → times applied
    gaps: list[str]  # what this target knows it does not size
    managed_peak: int = 0  # peak bytes of storages in CUDA managed memory (outside the allocator)


def _thread(phase: Phase) -> str:
    # backward runs on autograd's device thread (torch/csrc/autograd/engine.cpp, one thread per device)
    return "autograd" if phase == Phase.BACKWARD else "main"


def device_stream(trace: Trace, cublas_workspace_bytes: int) -> CudaStream:
    workspaces: dict[int, str] = {}  # trace seq → thread whose first cuBLAS call comes there
    seen: set[str] = set()
    counts = {"conv": 0, "rnn": 0}
    for call in trace.kernel_calls:
        anchor = trace.events[min(call.at_seq, len(trace.events) - 1)] if trace.events else None
        if anchor is None:
            continue
        if call.op in CUBLAS_OPS and _thread(anchor.phase) not in seen:
            seen.add(_thread(anchor.phase))
            workspaces[call.at_seq] = _thread(anchor.phase)
        elif call.op in CUDNN_CONV_OPS:
            counts["conv"] += 1
        elif call.op in CUDNN_RNN_OPS:
            counts["rnn"] += 1
    events: list[DeviceEvent] = []
    managed, managed_peak = 0, 0
    for event in trace.events:
        thread = workspaces.pop(event.seq, None)
        if thread is not None:
            events.append(DeviceEvent("alloc", cublas_workspace_bytes, -1 - len(events), Category.RUNTIME,
                                      event.phase, event.module, f"cuBLAS workspace ({thread} thread)",
                                      event.step, event.seq))
        if event.sid in trace.host_storages:
            continue
        if event.sid in trace.managed_storages:
            managed += event.nbytes if event.action == "alloc" else -event.nbytes
            managed_peak = max(managed_peak, managed)
            continue
        events.append(DeviceEvent(event.action, event.nbytes, event.sid, trace.storages[event.sid].category,
                                  event.phase, event.module, event.op, event.step, event.seq))
    for thread in workspaces.values():  # a cuBLAS call that allocated nothing itself, at the very end
        events.append(DeviceEvent("alloc", cublas_workspace_bytes, -1 - len(events), Category.RUNTIME,
                                  Phase.OPTIMIZER, "", f"cuBLAS workspace ({thread} thread)", 0, len(trace.events)))
    rules = {f"cuBLAS workspace, {thread} thread ({cublas_workspace_bytes:,} B)": 1 for thread in sorted(seen)}
    gaps = []
    if counts["conv"]:
        gaps.append(f"{counts['conv']} convolution calls: cuDNN's workspaces are transient and chosen by "
                    "cuDNN on the real GPU; not sized here (reserved may be higher)")
    if counts["rnn"]:
        gaps.append(f"{counts['rnn']} recurrent-layer calls traced with the CPU kernel: cuDNN's RNN reserve "
                    "space is not modelled")
    if trace.managed_storages:
        rules[f"paged optimizer state in managed memory ({len(trace.managed_storages)} tensors)"] = 1
    return CudaStream(events, rules, gaps, managed_peak)


@dataclasses.dataclass(frozen=True)
class CudaRule:
    """One thing a CUDA run does differently from the CPU trace, where trainmem models it, the source it
    follows, and the test that holds it (tests/test_cuda_semantics.py checks that each test exists)."""

    name: str
    where: str
    source: str
    test: str  # "tests/file.py::test_name", or "" for a stated gap


RULES: tuple[CudaRule, ...] = (
    CudaRule("autocast lists and policies (lower precision, fp32, set_opt_dtype, promote, banned)",
             "trace/cuda_autocast.py", "aten/src/ATen/autocast_mode.cpp, autocast_mode.h",
             "tests/test_cuda_semantics.py::test_cuda_lists_not_cpu_lists"),
    CudaRule("autocast cast cache: one low-precision copy per parameter per region",
             "trace/cuda_autocast.py", "autocast_mode.cpp cached_cast, clear_cache",
             "tests/test_cuda_semantics.py::test_cast_cache_keeps_one_copy_per_parameter"),
    CudaRule("cross-entropy: log_softmax in the logits' dtype, nll_loss on an fp32 copy",
             "trace/cuda_autocast.py", "aten/src/ATen/native/LossNLL.cpp cross_entropy_loss (log_softmax with "
             "self.scalar_type()); nll_loss in autocast's fp32 list",
             "tests/test_cuda_semantics.py::test_cross_entropy_under_cuda_autocast"),
    CudaRule("attention backend (flash / memory-efficient / math) and what each saves",
             "trace/cuda_composites.py", "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; "
             "torch/_meta_registrations.py; derivatives.yaml",
             "tests/test_cuda_semantics.py::test_attention_backend_choice"),
    CudaRule("dropout: fused native_dropout with a bool mask", "trace/cuda_composites.py",
             "aten/src/ATen/native/Dropout.cpp is_fused_kernel_acceptable",
             "tests/test_cuda_semantics.py::test_dropout_keeps_a_bool_mask_on_cuda"),
    CudaRule("optimizer default: foreach (fused when asked); step counters on the host",
             "trace/step.py, trace/run.py", "torch/optim/optimizer.py _default_to_fused_or_foreach; adam.py _init_group",
             "tests/test_cuda_semantics.py::test_optimizer_default_is_foreach_on_cuda_and_steps_stay_on_host"),
    CudaRule("cuBLAS workspace per (thread, stream): forward thread and autograd thread", "targets/cuda.py",
             "aten/src/ATen/cuda/CublasHandlePool.cpp", "tests/test_cuda_semantics.py::test_two_cublas_workspaces_one_per_thread"),
    CudaRule("paged optimizer state in managed memory, outside the caching allocator", "targets/cuda.py",
             "bitsandbytes functional.get_paged (cudaMallocManaged)",
             "tests/test_optimizers.py::test_paged_states_leave_the_caching_allocator"),
    CudaRule("caching allocator: rounding, pools, segments, splitting, merging, settings", "alloc/cuda_caching.py",
             "c10/cuda/CUDACachingAllocator.cpp", "tests/test_cuda_semantics.py::test_reserved_counts_whole_segments"),
    CudaRule("cuDNN convolution workspaces (transient, chosen by cuDNN on the GPU)", "targets/cuda.py (reported gap)",
             "aten/src/ATen/native/cudnn/Conv_v8.cpp", ""),
    CudaRule("cuDNN batch-norm reserve space (size from cuDNN at run time)", "not sized (stated gap)",
             "aten/src/ATen/native/cudnn/BatchNorm.cpp", ""),
    CudaRule("cuDNN RNN reserve space", "targets/cuda.py (reported gap)", "aten/src/ATen/native/cudnn/RNN.cpp", ""),
)
