"""The dtype checks that real kernels make and fake tensors skip.

A fake tensor runs an op's meta kernel, which computes the output's shape and dtype from the inputs.
For most ops the meta kernel checks what the real one checks, but torch's meta registrations for the
matrix products and convolutions check shapes only (torch/_meta_registrations.py meta_mm, meta_addmm,
meta_conv: no dtype check; meta_bmm and meta_baddbmm do check). So an nn.Linear fed `--input-dtype
int64` traced without complaint and estimated, while the real run fails at once in the CPU kernel
(aten/src/ATen/native/LinearAlgebra.cpp addmm_impl_cpu_: "mat1 and mat2 must have the same dtype";
Convolution.cpp: "expected scalar type Long but found Float"), and the same on CUDA.

`SameDtypeKernels` is a dispatch mode entered just above FakeTensorMode, below every other mode of
the trace, so it sees each op with the arguments its kernel gets: after autocast has cast them (the
Autocast keys run before the Python dispatch modes) and after every decomposition (F.linear arrives
as addmm or mm, matmul as mm or bmm). For the ops listed, the real kernels of every backend require all
tensor arguments to share one dtype; a call that does not is refused with the kernel's own wording,
raising inside the user's forward where the real run would, so the trace's error names the module
and the input (trace/run.py). Every other op passes through untouched: this mode changes no estimate.

A multi-rank trace passes `quiet`, true while DTensor works out an op's global output shape on throw-away fake
tensors (the recorder is muted then: torch_private.dtensor_shape_propagation_muted). Those tensors carry the
dtypes of the DTensors' specs, not of the local tensors the kernel gets, and the two differ where FSDP2
all-gathers a tensor-parallel parameter under autocast (torch 2.8-2.12: the unsharded weight's spec says fp32,
its local tensor is the bf16 autocast made): the real run computes the same global shapes on fake tensors,
which do not check, and its kernels then see one dtype. The local ops are checked as everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainmem.trace.compiled import compiled_trace_active
from trainmem.trace.torch_private import TorchDispatchMode

# aten ops whose CPU and CUDA kernels refuse tensor arguments of different dtypes, and whose meta
# kernels do not: the matrix products F.linear and matmul decompose into, and convolution (input,
# weight, bias). Measured against torch 2.13 CPU: each raises for (int64, float32) and (bfloat16,
# float32) for real and passes on fake tensors.
_SAME_DTYPE_OPS = frozenset({
    torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.mv, torch.ops.aten.addmv,
    torch.ops.aten.convolution, torch.ops.aten._convolution,
})


class SameDtypeKernels(TorchDispatchMode):
    """Refuse what the real kernel refuses: mixed dtypes in the ops of _SAME_DTYPE_OPS (not while `quiet()`)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:  # as the recorder's (trace/compiled.py)
        return compiled_trace_active()

    def __init__(self, quiet: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.quiet = quiet

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func.overloadpacket in _SAME_DTYPE_OPS and not (self.quiet is not None and self.quiet()):
            dtypes = [arg.dtype for arg in args if isinstance(arg, torch.Tensor)]
            if any(dtype != dtypes[0] for dtype in dtypes):
                names = ", ".join(str(dtype).removeprefix("torch.") for dtype in dtypes)
                raise RuntimeError(f"{func.overloadpacket.__name__} expects its tensors to have the same dtype, "
                                   f"got {names} (the real kernel refuses this; fake tensors do not check)")
        return func(*args, **(kwargs or {}))
