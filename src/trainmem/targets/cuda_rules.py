"""Where each thing a CUDA run does differently from the CPU trace is modelled, the source it follows, and
the test that holds it (tests/test_cuda_semantics.py checks that each named test exists). Documentation
as data: nothing here runs in an estimate."""

from __future__ import annotations

import dataclasses


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
    CudaRule("cuBLAS workspace per (thread, stream): forward thread and autograd thread", "targets/cuda_stream.py",
             "aten/src/ATen/cuda/CublasHandlePool.cpp", "tests/test_cuda_semantics.py::test_two_cublas_workspaces_one_per_thread"),
    CudaRule("cuBLASLt workspace per thread: addmm with a 1-D bias (gemm_and_bias), 1 MiB, kept",
             "targets/cuda_stream.py", "aten/src/ATen/cuda/CublasHandlePool.cpp getCUDABlasLtWorkspace / "
             "getCUDABlasLtWorkspaceSize; Blas.cpp addmm_out_cuda_impl useLtInterface; an H200 memory history "
             "(torch 2.11)", "tests/test_cuda_semantics.py::test_cublaslt_workspace_only_where_a_bias_is_fused"),
    CudaRule("sum/mean global-reduction staging buffer and semaphores when inputs are split across blocks",
             "targets/cuda_reduce.py", "aten/src/ATen/native/cuda/Reduce.cuh setReduceConfig, global_memory_size, "
             "semaphore_size; an H200 memory history (torch 2.11)",
             "tests/test_cuda_reduce.py::test_estimate_equals_the_h200_history"),
    CudaRule("paged optimizer state in managed memory, outside the caching allocator", "targets/cuda_stream.py",
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
             "storage behind the 0-dim loss, and an input-sized buffer during the call", "targets/cuda_stream.py",
             "aten/src/ATen/native/Loss.cpp (structured meta + resize_), cuda/Loss.cu binary_cross_entropy_out_cuda",
             "tests/test_cuda_semantics.py::test_mse_loss_keeps_an_input_sized_block_on_cuda"),
    CudaRule("cuDNN batch-norm workspace and reserve space (sizes from cuDNN at run time)",
             "targets/cudnn.py (counted, stated gap)", "aten/src/ATen/native/cudnn/BatchNorm.cpp", ""),
    CudaRule("cuDNN RNN reserve space", "targets/cudnn.py (counted, stated gap)",
             "aten/src/ATen/native/cudnn/RNN.cpp", ""),
)
