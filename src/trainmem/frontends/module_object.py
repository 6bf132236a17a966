"""An nn.Module object handed to the Python API.

Its parameters are real already; estimating must not copy them. The module is deep-copied with a
memo that maps every parameter and buffer to a meta tensor of the same shape, so the copy owns no
bytes and the original is left untouched.
"""

from __future__ import annotations

import copy
from typing import Any

from trainmem.errors import ModelRefError


def _meta_copy(module: Any) -> Any:
    import torch

    memo: dict[int, Any] = {}
    for tensor in list(module.parameters()) + list(module.buffers()):
        meta = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = torch.nn.Parameter(meta, tensor.requires_grad) if isinstance(
            tensor, torch.nn.Parameter) else meta
    return copy.deepcopy(module, memo)


def from_module(module: Any):
    import torch

    from trainmem.frontends import ModelSource

    if not isinstance(module, torch.nn.Module):
        raise ModelRefError(f"expected a model reference string or an nn.Module, got {type(module).__name__}",
                            where="model")
    wrapped = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule around the user's module
    if isinstance(wrapped, torch.nn.Module):
        return ModelSource(ref="", name=type(wrapped).__name__, build=lambda: _meta_copy(wrapped), notes=(COMPILED,))
    return ModelSource(ref="", name=type(module).__name__, build=lambda: _meta_copy(module))


# a torch.compile'd module given to estimate(): the module it wraps is traced, compiled only when asked
COMPILED = ("the model is torch.compile'd: the module it wraps is traced, eagerly unless compile=True (--compile) asks "
            "for the step as Inductor compiles it")
