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
* cuDNN convolution workspaces (targets/cudnn.py) — transient blocks through the caching allocator
  around each convolution call; the algorithm cuDNN picks on the real GPU decides their size, so the
  target builds two streams: the point estimate's and the high estimate's (process_bytes_high).
* what the process holds outside the allocator — the CUDA context by CUDA version and module loading,
  library kernel images — is in targets/cuda_runtime.py.
"""

from __future__ import annotations

import dataclasses

from trainmem.targets import DeviceEvent, cudnn
from trainmem.trace.events import Category, Phase, Trace

# ops that reach cuBLAS / cuBLASLt (aten/src/ATen/native/cuda/Blas.cpp, LinearAlgebra.cpp)
CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot",
                        "_addmm_activation", "addr"})
CUDNN_CONV_OPS = cudnn.CONV_OPS
CUDNN_RNN_OPS = cudnn.RNN_OPS
BATCH_NORM_OPS = cudnn.BN_OPS
# reduced losses whose 0-dim result keeps an input-sized storage on CUDA as on the CPU: Loss.cpp's
# structured meta functions (mse, smooth_l1) and huber/soft_margin are device-independent, and
# cuda/Loss.cu's binary_cross_entropy resizes its input-sized output in place; the CPU rules apply as they are
LOSS_OPS = frozenset({"mse_loss", "smooth_l1_loss", "binary_cross_entropy", "soft_margin_loss", "huber_loss"})


def kernel_ops() -> frozenset[str]:
    return CUBLAS_OPS | CUDNN_CONV_OPS | CUDNN_RNN_OPS | BATCH_NORM_OPS | LOSS_OPS


def _loss_effects(trace: Trace) -> tuple[dict[int, int], dict[int, list[cudnn.Workspace]], dict[str, int]]:
    """Output storages the loss kernels really allocate (sid → bytes) and their transient buffers, as
    blocks allocated right after the output and freed at once (trace seq → buffers)."""
    from trainmem.targets import cpu as cpu_target

    sizes: dict[int, int] = {}
    inserts: dict[int, list[cudnn.Workspace]] = {}
    fired: dict[str, int] = {}
    for call in trace.kernel_calls:
        if call.op not in LOSS_OPS:
            continue
        effect = cpu_target.rule_for(call.op)(call, "cuda")
        for index, nbytes in effect.output_nbytes:
            if index < len(call.output_sids) and call.output_sids[index] is not None:
                sizes[call.output_sids[index]] = nbytes
        transient = max((b for b in (*effect.before, *effect.after) if b > 0), default=0)
        if transient:
            inserts.setdefault(call.at_seq + call.outputs_allocated, []).append(
                cudnn.Workspace(transient, f"{call.op} element-wise buffer"))
        if effect.rule:
            fired[f"{effect.rule} ({call.op})"] = fired.get(f"{effect.rule} ({call.op})", 0) + 1
    return sizes, inserts, fired


def _merged(*plans: dict[int, list[cudnn.Workspace]]) -> dict[int, list[cudnn.Workspace]]:
    out: dict[int, list[cudnn.Workspace]] = {}
    for plan in plans:
        for seq, workspaces in plan.items():
            out.setdefault(seq, []).extend(workspaces)
    return out


@dataclasses.dataclass
class CudaStream:
    events: list[DeviceEvent]  # the point estimate's stream
    rules: dict[str, int]  # rule → times applied
    gaps: list[str]  # what this target knows it does not size
    managed_peak: int = 0  # peak bytes of storages in CUDA managed memory (outside the allocator)
    events_high: list[DeviceEvent] | None = None  # the high stream, where uncertain workspaces differ
    libraries: dict[str, bool] = dataclasses.field(default_factory=dict)  # library → loaded by this run


def _thread(phase: Phase) -> str:
    # backward runs on autograd's device thread (torch/csrc/autograd/engine.cpp, one thread per device)
    return "autograd" if phase == Phase.BACKWARD else "main"


def _cublas_first_calls(trace: Trace) -> dict[int, str]:
    """trace seq → thread whose first cuBLAS call comes there (one workspace per thread's handle)."""
    workspaces: dict[int, str] = {}
    seen: set[str] = set()
    for call in trace.kernel_calls:
        if call.op not in CUBLAS_OPS or not trace.events:
            continue
        thread = _thread(trace.events[min(call.at_seq, len(trace.events) - 1)].phase)
        if thread not in seen:
            seen.add(thread)
            workspaces[call.at_seq] = thread
    return workspaces


def _transients(events: list[DeviceEvent], extra: list[cudnn.Workspace], event) -> None:
    """A kernel's workspace: allocated after its outputs, freed when the kernel returns."""
    for ws in extra:
        key = -1 - len(events)
        for action in ("alloc", "free"):
            events.append(DeviceEvent(action, ws.nbytes, key, Category.RUNTIME, event.phase, event.module,
                                      ws.label, event.step, event.seq))


def _build(trace: Trace, cublas_workspace_bytes: int, inserts: dict[int, list[cudnn.Workspace]],
           sizes: dict[int, int]):
    workspaces = _cublas_first_calls(trace)
    events: list[DeviceEvent] = []
    managed, managed_peak = 0, 0
    for event in trace.events:
        _transients(events, inserts.get(event.seq, []), event)
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
        events.append(DeviceEvent(event.action, sizes.get(event.sid, event.nbytes), event.sid, trace.storages[event.sid].category,
                                  event.phase, event.module, event.op, event.step, event.seq))
    last = trace.events[-1] if trace.events else None
    if last is not None:
        _transients(events, [w for at, ws in inserts.items() if at >= len(trace.events) for w in ws], last)
    for thread in workspaces.values():  # a cuBLAS call that allocated nothing itself, at the very end
        events.append(DeviceEvent("alloc", cublas_workspace_bytes, -1 - len(events), Category.RUNTIME,
                                  Phase.OPTIMIZER, "", f"cuBLAS workspace ({thread} thread)", 0, len(trace.events)))
    return events, managed_peak


def device_stream(trace: Trace, cublas_workspace_bytes: int, cudnn_benchmark: bool = False) -> CudaStream:
    plan = cudnn.plan_workspaces(trace, cudnn_benchmark)
    sizes, loss_buffers, loss_rules = _loss_effects(trace)
    events, managed_peak = _build(trace, cublas_workspace_bytes, _merged(plan.point, loss_buffers), sizes)
    high = (_build(trace, cublas_workspace_bytes, _merged(plan.high, loss_buffers), sizes)[0]
            if plan.high != plan.point else None)
    threads = sorted(set(_cublas_first_calls(trace).values()))
    rules = {f"cuBLAS workspace, {thread} thread ({cublas_workspace_bytes:,} B)": 1 for thread in threads}
    rules.update(plan.rules)
    rules.update(loss_rules)
    if trace.managed_storages:
        rules[f"paged optimizer state in managed memory ({len(trace.managed_storages)} tensors)"] = 1
    ops = {call.op for call in trace.kernel_calls}
    libraries = {"cuBLAS/cuBLASLt": bool(ops & CUBLAS_OPS),
                 "cuDNN": bool(ops & (CUDNN_CONV_OPS | CUDNN_RNN_OPS | BATCH_NORM_OPS)), "NCCL": True}
    return CudaStream(events, rules, plan.gaps + cudnn.stated_gaps(trace, cudnn_benchmark), managed_peak,
                      high, libraries)


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
    CudaRule("cuDNN convolution workspace, cudnn.benchmark off: allocated and freed around each forward, "
             "backward-data and backward-filter call; 0 B (implicit GEMM) in the point estimate, the im2col "
             "matrix (explicit GEMM) in the high one", "targets/cudnn.py",
             "aten/src/ATen/native/cudnn/Conv_v8.cpp run_conv_plan, get_configs_from_heuristics, try_configs; "
             "cuDNN API reference cudnnConvolutionFwdAlgo_t (IMPLICIT_GEMM, GEMM)",
             "tests/test_cuda_runtime.py::test_heuristic_workspace_is_the_im2col_matrix_in_the_high_stream"),
    CudaRule("cuDNN convolution workspace, cudnn.benchmark on: the largest candidate workspace (at least the "
             "im2col matrix) on the first call of each shape on each thread, freed into the cache (no emptyCache "
             "in the v8 path)", "targets/cudnn.py",
             "aten/src/ATen/native/cudnn/Conv_v8.cpp generate_and_filter_plans, get_available_workspace, "
             "thread_local benchmark_cache; Conv_v7.cpp getMaxWorkspaceSize and emptyCache (older path)",
             "tests/test_cuda_runtime.py::test_benchmark_workspace_once_per_shape_and_thread"),
    CudaRule("depthwise fp32 convolution: PyTorch's own kernel, no cuDNN workspace", "targets/cudnn.py",
             "aten/src/ATen/native/Convolution.cpp _select_conv_backend, use_cudnn_depthwise",
             "tests/test_cuda_runtime.py::test_depthwise_fp32_has_no_cudnn_workspace"),
    CudaRule("CUDA context by CUDA version and module loading (lazy from 11.7, torch sets LAZY since 1.13)",
             "targets/cuda_runtime.py",
             "pytorch/pytorch PR #86509; NVIDIA CUDA Programming Guide, Lazy Loading; HF transformers "
             "perf_train_gpu_one (v4.21); invoke-ai/InvokeAI #9413; unslothai/unsloth-zoo PR #1053",
             "tests/test_cuda_runtime.py::test_context_by_version_and_loading"),
    CudaRule("cuBLAS/cuBLASLt and cuDNN kernel images: under eager loading the whole image for the GPU's arch, "
             "measured from the nvidia-* wheels (benchmarks/cuda_library_images.py); under lazy loading zero, "
             "bound stated; NCCL: zero on one GPU", "targets/cuda_runtime.py", "NVIDIA CUDA Programming Guide, "
             "Lazy Loading (kernels load at first use under LAZY); targets/data/cuda_library_images.json",
             "tests/test_cuda_runtime.py::test_eager_adds_library_images_by_arch_and_version"),
    CudaRule("reduced losses (mse, smooth_l1, binary_cross_entropy, soft_margin, huber): an input-sized "
             "storage behind the 0-dim loss, and an input-sized buffer during the call", "targets/cuda.py",
             "aten/src/ATen/native/Loss.cpp (structured meta + resize_), cuda/Loss.cu binary_cross_entropy_out_cuda",
             "tests/test_cuda_semantics.py::test_mse_loss_keeps_an_input_sized_block_on_cuda"),
    CudaRule("cuDNN batch-norm workspace and reserve space (sizes from cuDNN at run time)",
             "targets/cudnn.py (counted, stated gap)", "aten/src/ATen/native/cudnn/BatchNorm.cpp", ""),
    CudaRule("cuDNN RNN reserve space", "targets/cudnn.py (counted, stated gap)",
             "aten/src/ATen/native/cudnn/RNN.cpp", ""),
)
