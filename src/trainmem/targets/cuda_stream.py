"""The CUDA target's stream: turn a CPU trace recorded with CUDA semantics into the event stream a CUDA run
sends to PyTorch's caching allocator.

What the trace already carries (trace/cuda_autocast.py, trace/cuda_composites.py, the foreach optimizer
default): CUDA's autocast lists and cast cache, the attention backend CUDA picks and what it saves.
What this module adds or removes, one rule per mechanism, each with its source:

* cuBLAS workspace — allocated through the caching allocator the first time a thread's handle is
  used on a stream, and kept (aten/src/ATen/cuda/CublasHandlePool.cpp: getCurrentCUDABlasHandle →
  cublasSetWorkspace with getCUDABlasWorkspace(), keyed by (handle, stream); handles come from a
  per-thread pool). A training step uses two threads: the Python thread runs forward and the loss,
  autograd's device thread runs backward, so two workspaces.
* cuBLASLt workspace — addmm with a 1-D bias (a Linear's forward) and _addmm_activation run cuBLASLt's
  gemm_and_bias (Blas.cpp addmm_out_cuda_impl, useLtInterface), whose workspace getCUDABlasLtWorkspace()
  keeps per (Lt handle, stream), i.e. per thread, from the first such call. Releases differ on whether it is
  the cuBLAS workspace (TORCH_CUBLASLT_UNIFIED_WORKSPACE, and in the newest source only when workspace
  caching is on): a real H200 run under torch 2.11 (memory history of nn.Linear(1024, 1024) → ReLU →
  Linear(1024, 10), Adam) allocated it apart, 1,048,576 B (getCUDABlasLtWorkspaceSize's default, 1024 KiB)
  in gemm_and_bias, kept to the end. It is added for every release: where a release unifies the two, the
  estimate is 1 MiB high, never low.
* reduction staging buffers — sum and mean split a large reduction over thread blocks through a global-memory
  buffer (targets/cuda_reduce.py: a bias gradient over 8192 rows of 8192 features takes 132 MiB for the launch).
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
  library kernel images — is in targets/cuda_runtime.py; targets/cuda_target.py puts it all together
  behind the Target interface, and targets/cuda_rules.py lists every rule with its source and test.
"""

from __future__ import annotations

from collections.abc import Callable

from trainmem.alloc.device_events import DeviceEvent

from trainmem.targets import DeviceStream, cuda_reduce, cudnn
from trainmem.targets.rule_registry import RuleRegistry
from trainmem.trace.events import Category, KernelCall, Phase, TensorMeta, Trace

# Each op the CUDA target watches is registered once, with the rule that says which library its kernel
# reaches (None: PyTorch's own kernel); a second rule for the same op is refused at import.
CudaKernelRule = Callable[[KernelCall], "str | None"]
_RULES: RuleRegistry[CudaKernelRule] = RuleRegistry("CUDA")


def _register(ops, rule: CudaKernelRule) -> CudaKernelRule:
    for op in sorted(ops):
        _RULES.register(op)(rule)
    return rule


def _cublas(call: KernelCall) -> str:
    """mm, addmm, bmm, …: cuBLAS / cuBLASLt (aten/src/ATen/native/cuda/Blas.cpp, LinearAlgebra.cpp); the
    calling thread's handle gets its workspace on first use (`_cublas_first_calls`)."""
    return "cuBLAS/cuBLASLt"


def _cudnn(call: KernelCall) -> str:
    """Convolutions, batch norm and RNNs reach cuDNN (targets/cudnn.py sizes the convolution
    workspaces and states what it does not size)."""
    return "cuDNN"


def _reduced_loss(call: KernelCall) -> None:
    """Reduced losses whose 0-dim result keeps an input-sized storage on CUDA as on the CPU: Loss.cpp's
    structured meta functions (mse, smooth_l1) and huber/soft_margin are device-independent, and
    cuda/Loss.cu's binary_cross_entropy resizes its input-sized output in place; the CPU rules apply as
    they are (`_loss_effects`)."""
    return None


_register({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "_addmm_activation", "addr"},
          _cublas)
_register(cudnn.CONV_OPS | cudnn.RNN_OPS | cudnn.BN_OPS, _cudnn)
_register(cuda_reduce.REDUCE_OPS, lambda call: None)  # PyTorch's own kernel; its buffer: _reduce_buffers
_register({"mse_loss", "smooth_l1_loss", "binary_cross_entropy", "soft_margin_loss", "huber_loss"}, _reduced_loss)


def kernel_ops() -> frozenset[str]:
    return _RULES.ops()


def _is(call: KernelCall, rule: CudaKernelRule) -> bool:
    return call.op in _RULES.ops() and _RULES.rule_for(call.op) is rule


def _loss_effects(trace: Trace) -> tuple[dict[int, int], dict[int, list[cudnn.Workspace]], dict[str, int]]:
    """Output storages the loss kernels really allocate (sid → bytes) and their transient buffers, as
    blocks allocated right after the output and freed at once (trace seq → buffers)."""
    from trainmem.targets import cpu_kernels as cpu_target

    sizes: dict[int, int] = {}
    inserts: dict[int, list[cudnn.Workspace]] = {}
    fired: dict[str, int] = {}
    for call in trace.kernel_calls:
        if not _is(call, _reduced_loss):
            continue
        effect = cpu_target.rule_for(call.op)(call, None)  # the loss rules read nothing of the CPU
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


def _reduce_buffers(trace: Trace, grid: cuda_reduce.GridFacts) -> dict[int, list[cudnn.Workspace]]:
    """gpu_reduce_kernel's staging buffer and semaphores, right after the reduction's output (cuda_reduce.py)."""
    inserts: dict[int, list[cudnn.Workspace]] = {}
    for call in trace.kernel_calls:
        if call.op in cuda_reduce.REDUCE_OPS:
            nbytes = cuda_reduce.reduce_buffer_bytes(call, grid)
            if nbytes:
                inserts.setdefault(call.at_seq + call.outputs_allocated, []).append(
                    cudnn.Workspace(nbytes, f"{call.op} global-reduction buffer"))
    return inserts


def _merged(*plans: dict[int, list[cudnn.Workspace]]) -> dict[int, list[cudnn.Workspace]]:
    out: dict[int, list[cudnn.Workspace]] = {}
    for plan in plans:
        for seq, workspaces in plan.items():
            out.setdefault(seq, []).extend(workspaces)
    return out


def _thread(phase: Phase) -> str:
    # backward runs on autograd's device thread (torch/csrc/autograd/engine.cpp, one thread per device)
    return "autograd" if phase == Phase.BACKWARD else "main"


def _cublas_first_calls(trace: Trace) -> dict[int, str]:
    """trace seq → thread whose first cuBLAS call comes there (one workspace per thread's handle)."""
    return _first_calls(trace, lambda call: _is(call, _cublas))


def _first_calls(trace: Trace, reaches: Callable[[KernelCall], bool]) -> dict[int, str]:
    """trace seq → thread whose first call that `reaches` the library comes there (a handle, so a workspace,
    per thread)."""
    first: dict[int, str] = {}
    seen: set[str] = set()
    for call in trace.kernel_calls:
        if not reaches(call) or not trace.events:
            continue
        thread = _thread(trace.events[min(call.at_seq, len(trace.events) - 1)].phase)
        if thread not in seen:
            seen.add(thread)
            first.setdefault(call.at_seq, thread)
    return first


# CublasHandlePool.cpp getCUDABlasLtWorkspaceSize: CUBLASLT_WORKSPACE_SIZE (KiB), default 1024 KiB on CUDA;
# the H200 / torch 2.11 history above allocated exactly this
CUBLASLT_WORKSPACE_BYTES = 1024 * 1024


def _reaches_cublaslt(call: KernelCall) -> bool:
    """addmm with a 1-D bias (its useLtInterface case; the shape limits that send a few of them back to plain
    cuBLAS are not checked, so a rare estimate is 1 MiB high) and _addmm_activation."""
    if call.op == "_addmm_activation":
        return True
    bias = call.args[0] if call.op == "addmm" and call.args else None
    return isinstance(bias, TensorMeta) and len(bias.shape) == 1


def _cublaslt_first_calls(trace: Trace) -> dict[int, str]:
    """trace seq → thread whose first cuBLASLt call comes there (one Lt workspace per thread's Lt handle)."""
    return _first_calls(trace, _reaches_cublaslt)


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
    lt_workspaces = _cublaslt_first_calls(trace)
    events: list[DeviceEvent] = []
    managed, managed_peak = 0, 0
    for event in trace.events:
        _transients(events, inserts.get(event.seq, []), event)
        thread = workspaces.pop(event.seq, None)
        if thread is not None:
            events.append(DeviceEvent("alloc", cublas_workspace_bytes, -1 - len(events), Category.RUNTIME,
                                      event.phase, event.module, f"cuBLAS workspace ({thread} thread)",
                                      event.step, event.seq))
        thread = lt_workspaces.pop(event.seq, None)
        if thread is not None:
            events.append(DeviceEvent("alloc", CUBLASLT_WORKSPACE_BYTES, -1 - len(events), Category.RUNTIME,
                                      event.phase, event.module, f"cuBLASLt workspace ({thread} thread)",
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
    for thread in lt_workspaces.values():
        events.append(DeviceEvent("alloc", CUBLASLT_WORKSPACE_BYTES, -1 - len(events), Category.RUNTIME,
                                  Phase.OPTIMIZER, "", f"cuBLASLt workspace ({thread} thread)", 0, len(trace.events)))
    return events, managed_peak


def device_stream(trace: Trace, cublas_workspace_bytes: int, cudnn_benchmark: bool = False,
                  grid: cuda_reduce.GridFacts | None = None) -> DeviceStream:
    plan = cudnn.plan_workspaces(trace, cudnn_benchmark)
    sizes, loss_buffers, loss_rules = _loss_effects(trace)
    reductions = _reduce_buffers(trace, grid or cuda_reduce.GridFacts(None, None))
    events, managed_peak = _build(trace, cublas_workspace_bytes, _merged(plan.point, loss_buffers, reductions), sizes)
    high = (_build(trace, cublas_workspace_bytes, _merged(plan.high, loss_buffers, reductions), sizes)[0]
            if plan.high != plan.point else None)
    threads = sorted(set(_cublas_first_calls(trace).values()))
    rules = {f"cuBLAS workspace, {thread} thread ({cublas_workspace_bytes:,} B)": 1 for thread in threads}
    rules.update({f"cuBLASLt workspace, {thread} thread ({CUBLASLT_WORKSPACE_BYTES:,} B)": 1
                  for thread in sorted(set(_cublaslt_first_calls(trace).values()))})
    rules.update(plan.rules)
    rules.update(loss_rules)
    fired = sum(len(buffers) for buffers in reductions.values())
    if fired:
        rules["sum/mean global-reduction buffers (Reduce.cuh)"] = fired
    if trace.managed_storages:
        rules[f"paged optimizer state in managed memory ({len(trace.managed_storages)} tensors)"] = 1
    reached = {_RULES.rule_for(call.op)(call) for call in trace.kernel_calls if call.op in _RULES.ops()}
    libraries = {"cuBLAS/cuBLASLt": "cuBLAS/cuBLASLt" in reached, "cuDNN": "cuDNN" in reached, "NCCL": True}
    return DeviceStream(events, rules, tuple(plan.gaps + cudnn.stated_gaps(trace, cudnn_benchmark)), high,
                        managed_peak, libraries)

