"""Inductor's own memory plan, run on fake tensors: the private torch._inductor and torch._functorch hooks that
`--compile` needs are gathered here (tests/test_private_apis.py), so that an upgrade that moves one breaks here.

How. torch.compile's default backend, Inductor, lowers the forward and backward graphs that AOTAutograd's min-cut
partitioner made, fuses them into kernels and writes a Python wrapper per graph. The wrapper *is* the compiled
step's memory plan: it allocates each buffer the fused kernels write (`buf3 = empty_strided_cpu(...)`), calls the
kernels and the extern ones (`extern_kernels.convolution`, `mm(..., out=buf)`), frees each buffer after its last
use (`del buf3`), reuses a dead buffer of the same size where Inductor's memory planning can, and returns the
outputs and the tensors saved for backward. So the trace lets Inductor compile for real, on the fake inputs
dynamo hands it, and runs the wrapper it wrote, with three things swapped while the wrapper module loads:

- the C++ kernels (AsyncCompile.cpp_pybinding / cpp) are not built: each becomes a call that does nothing. They
  only write values into buffers the wrapper allocated, and fake tensors have none;
- `empty_strided_cpu` and `reinterpret_tensor`, which the wrapper takes from torch._C._dynamo.guards and which
  make tensors in C++ below the dispatcher, become torch.empty_strided and torch.as_strided, which the fake mode
  and the recorder see: every buffer is an allocation of the size Inductor asked for;
- Inductor's on-disk graph caches are off, so a plan is always made, never read back from another run.

Compile workers are not started (compile_threads 1). The wrapper modules loaded with stub kernels are dropped from
Inductor's in-process module cache when the trace ends, so a real torch.compile later in the same process builds
its own. Written against torch 2.13 (torch/_inductor/codegen/wrapper.py's header, codecache.PyCodeCache,
async_compile.AsyncCompile).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class _NoKernel:
    """A compiled C++ kernel that is never built: the wrapper calls it with buffer pointers; it writes nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def _empty_strided(size: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


def _reinterpret_tensor(tensor: torch.Tensor, size: Any, stride: Any, offset_increment: int = 0) -> torch.Tensor:
    # torch/csrc/dynamo/guards.cpp _reinterpret_tensor: a view with the offset added to the tensor's own
    return torch.as_strided(tensor, size, stride, tensor.storage_offset() + offset_increment)


# the wrapper's allocation helpers (codegen/wrapper.py header) and what runs instead: the device of the fake trace
# is the CPU whichever device Inductor planned for
_SWAPPED = {"empty_strided_cpu": _empty_strided, "empty_strided_cuda": _empty_strided,
            "empty_strided_cpu_pinned": _empty_strided, "reinterpret_tensor": _reinterpret_tensor}


class PlanLoads:
    """How many wrapper modules Inductor loaded during the trace: 0 means nothing was compiled."""

    def __init__(self) -> None:
        self.count = 0


@contextlib.contextmanager
def inductor_plans_on_fake() -> Iterator[PlanLoads]:
    """While open, torch.compile with Inductor compiles as usual and runs its wrapper with no kernels built."""
    from torch._functorch import config as functorch_config
    from torch._inductor import async_compile, config as inductor_config
    from torch._inductor.codecache import PyCodeCache

    loads = PlanLoads()
    real_load = PyCodeCache.load_by_key_path.__func__
    real_cpp, real_binding = async_compile.AsyncCompile.cpp, async_compile.AsyncCompile.cpp_pybinding

    def load_by_key_path(cls: Any, *args: Any, **kwargs: Any) -> Any:
        module = real_load(cls, *args, **kwargs)
        if hasattr(module, "call") or hasattr(module, "runner"):
            loads.count += 1
        for name, replacement in _SWAPPED.items():
            if hasattr(module, name):
                setattr(module, name, replacement)
        return module

    caches_off = inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False, compile_threads=1,
                                       autotune_local_cache=False)
    with caches_off, functorch_config.patch(enable_autograd_cache=False):
        PyCodeCache.load_by_key_path = classmethod(load_by_key_path)
        async_compile.AsyncCompile.cpp = lambda self, source_code: _NoKernel()
        async_compile.AsyncCompile.cpp_pybinding = lambda self, argtypes, source_code: _NoKernel()
        try:
            yield loads
        finally:
            PyCodeCache.load_by_key_path = classmethod(real_load)
            async_compile.AsyncCompile.cpp, async_compile.AsyncCompile.cpp_pybinding = real_cpp, real_binding
            PyCodeCache.cache_clear()  # the stub-kernel modules: never served to a real compile in this process
