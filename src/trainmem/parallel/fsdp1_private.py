"""FSDP1's private attributes that `--strategy fsdp1 --offload params` reads, gathered here (tests/test_private_apis.py)
so that a torch upgrade that moves one breaks in one place. Checked against torch 2.13.0's and 2.15.0's
torch/distributed/fsdp/_flat_param.py and _runtime_utils.py:

- `FullyShardedDataParallel._handle`: the unit's FlatParamHandle (one per unit since torch 2.1);
- `FlatParamHandle._offload_params` and `.flat_param`; the FlatParameter's `_local_shard` (the sharded flat
  parameter, pinned in host RAM under CPU offload: init_flat_param_attributes) and `_cpu_grad` (the pinned host
  buffer each backward copies the reduced gradient shard into: _runtime_utils.py _offload_grad).

`offload_on_fake()` stands in for `Tensor.pin_memory()` while FSDP1 sets those up on fake tensors: a fake tensor
cannot be pinned (FakeTensorMode has no kernel for aten._pin_memory), and a torch without an accelerator refuses to
pin at all. Pinning copies the tensor into page-locked host memory, so a copy (`clone`) makes the same storage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def offloaded_handles(model: nn.Module) -> list:
    """The FlatParamHandles of the FSDP1 units in `model` that offload their parameters."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    handles = [unit._handle for unit in FullyShardedDataParallel.fsdp_modules(model)]
    return [handle for handle in handles if handle is not None and handle._offload_params]


def host_buffers(model: nn.Module) -> list[torch.Tensor]:
    """What each offloading unit keeps in host RAM: its sharded flat parameter (the FlatParameter's data whenever
    it is asked here: after wrapping, after backward and after the optimizer step, each unit is resharded),
    `_local_shard` and the host gradient buffer `_cpu_grad`, the last two where they exist (FSDP1's lazy init makes
    them at the first forward)."""
    out = []
    for handle in offloaded_handles(model):
        flat = handle.flat_param
        shard = flat._local_shard if hasattr(flat, "_local_shard") else None
        host_grad = flat._cpu_grad if hasattr(flat, "_cpu_grad") else None
        out += [flat, *(t for t in (shard, host_grad) if isinstance(t, torch.Tensor))]
    return out


@contextlib.contextmanager
def offload_on_fake() -> Iterator[None]:
    """While open, `Tensor.pin_memory()` returns a copy of the tensor (module docstring), and the CPU's stand-in
    stream (what FSDP1's device handle gives on the trace's device) has the `synchronize()` FSDP1 calls at the end
    of an offloading backward to wait for its gradient copies to the host (_runtime_utils.py
    _post_backward_final_callback): torch.cpu.Stream has none, and on the CPU there is nothing to wait for."""
    original = torch.Tensor.pin_memory
    had_synchronize = hasattr(torch.cpu.Stream, "synchronize")

    def pin_memory(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return self.clone()

    torch.Tensor.pin_memory = pin_memory
    if not had_synchronize:
        torch.cpu.Stream.synchronize = lambda self: None
    try:
        yield
    finally:
        torch.Tensor.pin_memory = original
        if not had_synchronize:
            del torch.cpu.Stream.synchronize
