"""CUDA autocast on a CPU trace.

The trace runs on fake CPU tensors, where torch.autocast("cpu") casts by the CPU lists, which differ
from the CUDA ones (CPU runs layer_norm and softmax in low precision, CUDA in fp32; CPU casts `cat`
and `stack`, CUDA does not). To trace what a CUDA run keeps, this module replaces every AutocastCPU
kernel for the length of a trace with a Python kernel that applies CUDA's policy instead.

Source: aten/src/ATen/autocast_mode.cpp (TORCH_LIBRARY_IMPL(aten, Autocast, m), the KERNEL_CUDA
lists) and autocast_mode.h (cached_cast, set_opt_dtype, promote_type). The op lists below are
checked against the kernels the installed torch registers for the AutocastCUDA key
(tests/test_cuda_semantics.py), so a torch upgrade that moves an op fails a test, not an estimate.

The lists differ between torch versions, so the table holds every op of every supported version,
each with its policy, and which of them CUDA casts is read from the installed torch's dispatcher
(the ops with an AutocastCUDA kernel, `cuda_policy`): an op this torch does not register is not
cast, as on that torch's CUDA. What moved, checked in torch 2.6, 2.13, 2.14 and 2.15
(`_VERSION_DEPENDENT`): the Dimname overloads of softmax, log_softmax, cumsum, cumprod, prod, sum
and norm (registered by 2.6, gone by 2.13), rms_norm (not in 2.6, there by 2.13),
linalg_matrix_sqrth (new in 2.14), and _cudnn_rnn, registered only by builds with cuDNN
(aten/src/ATen/cudnn/AutocastRNN.cpp), which a CPU trace never calls (a CPU LSTM runs
mkldnn_rnn_layer or the native cells).

Mechanisms copied from the C++ wrapper:
* cast, then call the op with the autocast key excluded, so the ops it decomposes into are not cast
  again (WrapFunction_ with ExcludeDispatchKeyGuard);
* an op CPU autocasts but CUDA does not is passed on to the next dispatch key, so its decomposition
  meets autocast again, as it would on CUDA, where the Autocast key is a fallthrough for it;
* the cast cache: an fp32 leaf that requires grad (a parameter) is cast once per autocast region
  and the low-precision copy is kept until the region ends (cached_cast, clear_cache on exit).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from trainmem.trace import torch_private

LOWER_PRECISION = "lower_precision_fp"
FP32 = "fp32"
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"
FP32_APPEND_DTYPE = "fp32_append_dtype"
PROMOTE = "promote"
BANNED = "banned"

_LOWER = ("_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc",
          "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
          "cudnn_convolution", "cudnn_convolution_transpose", "prelu", "addmm", "addmv", "addr",
          "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm",
          "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
          "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
          "scaled_dot_product_attention")
_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
         "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
         "layer_norm", "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm.dim", "nuclear_norm",
         "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
         "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
         "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
         "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
         "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
         "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
         "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
         "upsample_bicubic2d", "_upsample_bicubic2d_aa", "linalg_matrix_sqrth")
# Dimname overloads, autocast by torch 2.6 (KERNEL_CUDA in its autocast_mode.cpp), not by 2.13
_NAMED_SET_OPT_DTYPE = ("prod.dim_Dimname", "softmax.Dimname", "log_softmax.Dimname", "cumprod.dimname",
                        "cumsum.dimname", "sum.dim_DimnameList")
_FP32_SET_OPT_DTYPE = ("prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
                       "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
                       "sum.dim_IntList", *_NAMED_SET_OPT_DTYPE)
# norm has no dtype argument of its own: CUDA calls the overload that takes one
# (autocast_mode.h AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE; the names_ overload only up to 2.6-era torch)
_FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
                      "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype"}
_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
            "tensordot", "scatter_add")
_BANNED = ("binary_cross_entropy",)
# cuDNN's RNN: AutocastRNN.cpp casts the input, states and weights to the lower precision (and
# reflattens the weights); a CPU trace never reaches it, the entry keeps the table complete
_CUDNN_LOWER = ("_cudnn_rnn",)

CUDA_POLICY: dict[str, str] = {
    **{op: LOWER_PRECISION for op in (*_LOWER, *_CUDNN_LOWER)}, **{op: FP32 for op in _FP32},
    **{op: FP32_SET_OPT_DTYPE for op in _FP32_SET_OPT_DTYPE}, **{op: FP32_APPEND_DTYPE for op in _FP32_APPEND_DTYPE},
    **{op: PROMOTE for op in _PROMOTE}, **{op: BANNED for op in _BANNED},
}


# Where an op's AutocastCUDA kernel depends on the torch: op -> (torch versions checked to register
# it, torch versions checked not to). Versions in neither were not checked; the dispatcher decides.
_NAMED_VERSIONS = (("2.6",), ("2.13", "2.14", "2.15"))
_VERSION_DEPENDENT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    **{op: _NAMED_VERSIONS for op in (*_NAMED_SET_OPT_DTYPE, "norm.names_ScalarOpt_dim")},
    "rms_norm": (("2.13", "2.14", "2.15"), ("2.6",)),
    "linalg_matrix_sqrth": (("2.14", "2.15"), ("2.6", "2.13")),
}
CUDNN_BUILD_ONLY = frozenset(_CUDNN_LOWER)  # registered by builds with cuDNN, whatever the version


def registered_in(op: str, torch_release: str, cudnn_build: bool) -> bool | None:
    """Whether torch `torch_release` ("2.6") registers an AutocastCUDA kernel for `op` (None: not checked)."""
    if op in CUDNN_BUILD_ONLY:
        return cudnn_build
    if op not in _VERSION_DEPENDENT:
        return op in CUDA_POLICY
    present, absent = _VERSION_DEPENDENT[op]
    return True if torch_release in present else False if torch_release in absent else None


def cuda_policy() -> dict[str, str]:
    """The policy of every op the installed torch's CUDA autocast casts: the table, limited to the ops
    this torch registers an AutocastCUDA kernel for (an op another version casts is not cast here)."""
    registered = torch_private.ops_with_kernel("AutocastCUDA")
    return {op: policy for op, policy in CUDA_POLICY.items() if op in registered}


def _overload(name: str):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


@dataclasses.dataclass
class _State:
    dtype: torch.dtype | None = None  # the autocast dtype while a region is open
    caching: bool = True  # torch.autocast(cache_enabled=...): Lightning's Trainer opens its regions without the cache
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = dataclasses.field(default_factory=dict)
    casts: int = 0


_STATE = _State()


def _eligible(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """cached_cast: floating tensors (not double) go to `dtype`; parameters are cast once per region."""
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    if not _eligible(value) or value.dtype == dtype:
        return value
    cacheable = (_STATE.caching and _STATE.dtype is not None and dtype == _STATE.dtype and value.dtype == torch.float32
                 and value.requires_grad and value.is_leaf and not torch_private.is_view(value))
    if cacheable and id(value) in _STATE.cache:
        return _STATE.cache[id(value)][1]
    cast = value.to(dtype)
    _STATE.casts += 1
    if cacheable:
        _STATE.cache[id(value)] = (value, cast)  # the source is held too, so its id cannot be reused
    return cast


def _widest(args: tuple, kwargs: dict) -> torch.dtype | None:
    widest = None
    for value in (*args, *kwargs.values()):
        for tensor in (value if isinstance(value, (list, tuple)) else (value,)):
            if _eligible(tensor):
                widest = tensor.dtype if widest is None else torch.promote_types(widest, tensor.dtype)
    return widest


def _first_tensor_eligible(args: tuple) -> bool:
    for value in args:
        if isinstance(value, torch.Tensor):
            return _eligible(value)
    return False


def _kernel(name: str, policy: str | None):
    op = _overload(name)
    arguments = torch_private.schema_arguments(op)
    dtype_index = next((i for i, a in enumerate(arguments) if a.name == "dtype" and not a.kwarg_only), None)

    def run(*args, **kwargs):
        if policy is None:  # CPU autocasts this op, CUDA does not: on to the next key, casts inside still apply
            return torch_private.call_as_fallthrough(op, args, kwargs)
        if policy == BANNED:
            raise RuntimeError(f"torch.nn.functional.{name} is unsafe to autocast on CUDA (autocast_mode.cpp "
                               "bans it); use binary_cross_entropy_with_logits")
        target = op
        # the autocast dtype in force: ours, or the one torch.utils.checkpoint re-enters for recomputation
        low = torch.get_autocast_dtype("cpu")
        if policy == LOWER_PRECISION:
            args, kwargs = _cast(args, low), {k: _cast(v, low) for k, v in kwargs.items()}
        elif policy == FP32:
            args, kwargs = _cast(args, torch.float32), {k: _cast(v, torch.float32) for k, v in kwargs.items()}
        elif policy == PROMOTE:
            widest = _widest(args, kwargs)
            if widest is not None:
                args, kwargs = _cast(args, widest), {k: _cast(v, widest) for k, v in kwargs.items()}
        elif policy == FP32_SET_OPT_DTYPE and _first_tensor_eligible(args):
            # set_opt_dtype: a dtype the caller gave is kept; otherwise the op computes in fp32
            if dtype_index is not None and len(args) > dtype_index:
                if args[dtype_index] is None:
                    args = (*args[:dtype_index], torch.float32, *args[dtype_index + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        elif policy == FP32_APPEND_DTYPE and _first_tensor_eligible(args):
            target, kwargs = _overload(_FP32_APPEND_DTYPE[name]), {**kwargs, "dtype": torch.float32}
        with torch_private.exclude_autocast_cpu():
            return target(*args, **kwargs)

    return run


def autocast_dtype() -> torch.dtype | None:
    """The autocast dtype in force now (a region of ours, or checkpoint's recomputation), or None."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


@contextlib.contextmanager
def cuda_autocast_kernels():
    """For the length of a trace: AutocastCPU follows CUDA's lists (see the module docstring)."""
    library = torch.library.Library("aten", "IMPL")
    policy = cuda_policy()
    try:
        with torch_private.quiet_kernel_override():
            for name in sorted(torch_private.ops_with_kernel("AutocastCPU") | set(policy)):
                library.impl(name, _kernel(name, policy.get(name)), "AutocastCPU")
        yield
    finally:
        torch_private.destroy_library(library)
        _STATE.dtype, _STATE.cache = None, {}


@contextlib.contextmanager
def cuda_autocast_region(dtype: torch.dtype, cache: bool = True):
    """One autocast region as CUDA would run it (use inside `cuda_autocast_kernels`); `cache`: autocast's
    cache_enabled, whether a parameter is cast once per region (kept until it closes) or at each use."""
    _STATE.dtype, _STATE.cache, _STATE.caching = dtype, {}, cache
    try:
        with torch.autocast("cpu", dtype=dtype, cache_enabled=False):
            yield
    finally:
        _STATE.dtype, _STATE.cache, _STATE.caching = None, {}, True  # clear_cache(): the casts die with the region
