"""`--offload optimizer|params`: which tensors live in host RAM, for the sharded data-parallel strategies.

The trace runs on CPU fake tensors for every target, so "on the host" is a label, given by `host_tensors()`:
- `--offload params` is FSDP2's CPUOffloadPolicy (fsdp.offload_policy): sharded parameters, their sharded
  gradients and the optimizer state (the optimizer steps on the host) live in host RAM; the unsharded
  parameters and the all-gather / reduce-scatter buffers are made on the device for each unit's use
  (torch/distributed/fsdp/_fully_shard/_fsdp_param.py offload_to_cpu; _fsdp_collectives.py copies the
  reduced shard `.to("cpu")`). That is what FSDP2 offers: parameters, gradients and optimizer state together.
- `--offload optimizer` keeps parameters and gradients on the device and the optimizer state on the host.
  FSDP2 has no such mode; it is DeepSpeed's `offload_optimizer` (ZeRO-Offload: fp32 master weights, optimizer
  state and the optimizer step on the CPU with DeepSpeedCPUAdam, gradients copied to pinned host buffers,
  updated parameters copied back; deepspeed/runtime/zero/stage_1_and_2.py `cpu_offload`, stage3.py
  `offload_optimizer`). Here the optimizer's state tensors are labelled host-resident and the step runs on
  the same fake tensors; the fp32 master copy DeepSpeed adds for fp16/bf16 parameters is not made (torch's
  optimizers step the parameters themselves).
The optimizer's step temporaries are host allocations under either offload (the step runs on the CPU):
the trace's optimizer phase is where they are; `host_tensors` can only name tensors alive when it is called.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from trainmem.setup.layout import Offload


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what holds storage), or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


class OptimizerHolder:
    """make_optimizer for Parallelized that keeps a weak reference to what it made, so that host_tensors can
    name the optimizer's state. `factory(params, setup)` makes the optimizer (default: the trace's own)."""

    def __init__(self, ctx: Any, factory: Any = None) -> None:
        self._ctx = ctx
        self._factory = factory
        self._made: weakref.ref | None = None

    def __call__(self, params: Any, setup: Any) -> torch.optim.Optimizer:
        if self._factory is not None:
            optimizer = self._factory(params, setup)
        else:
            from trainmem.parallel.optimizer_groups import by_tensor_kind
            from trainmem.trace import step

            optimizer = step.make_optimizer(by_tensor_kind(params), setup, getattr(self._ctx, "cuda_semantics", False))
        self._made = weakref.ref(optimizer)
        return optimizer

    def state_tensors(self) -> list[torch.Tensor]:
        optimizer = self._made() if self._made is not None else None
        if optimizer is None:
            return []
        inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer steps a local optimizer
        return [local(t) for state in inner.state.values() for t in state.values() if isinstance(t, torch.Tensor)]


def host_tensors_fn(model: nn.Module, offload: Offload, holder: OptimizerHolder):
    """() -> the tensors in host RAM now: optimizer state, and with params offload the sharded parameters
    and their gradients."""

    def host_tensors() -> list[torch.Tensor]:
        tensors = holder.state_tensors()
        if offload == Offload.PARAMS:
            for parameter in model.parameters():
                tensors.append(local(parameter))
                if parameter.grad is not None:
                    tensors.append(local(parameter.grad))
        return tensors

    return host_tensors


def parallelized(model: nn.Module, ctx: Any, factory: Any = None):
    """Parallelized for an offloading run: the optimizer made through an OptimizerHolder, host_tensors."""
    from trainmem.parallel.apply import Parallelized

    holder = OptimizerHolder(ctx, factory)
    offload = Offload(ctx.layout.offload)
    return Parallelized(model=model, make_optimizer=holder, host_tensors=host_tensors_fn(model, offload, holder),
                        notes=[note(offload)])


def note(offload: Offload) -> str:
    if offload == Offload.PARAMS:
        return ("offload params: FSDP2 CPUOffloadPolicy semantics, sharded parameters, gradients and optimizer "
                "state (and the optimizer step) in host RAM; unsharded parameters and collective buffers on the "
                "device. Not traced (the trace's device is the host, so FSDP2's .to(device) copies are no-ops): "
                "each unit's shards copied to the device before its all-gather (freed before the copy-out, which "
                "holds twice the unit's unsharded bytes, so never the peak) and the reduce-scatter output on the "
                "device until its copy to host (a unit's unsharded bytes / dp, during that unit's reduce-scatter)")
    return ("offload optimizer: optimizer state and its step in host RAM (DeepSpeed offload_optimizer "
            "semantics; FSDP2 only offloads parameters, gradients and state together); DeepSpeed's extra fp32 "
            "master copy for 16-bit parameters is not modelled")
