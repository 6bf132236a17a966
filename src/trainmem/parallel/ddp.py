"""DistributedDataParallel, traced for real: torch's own DDP wrapper and C++ Reducer run on fake tensors over
the fake process group, so the gradient buckets are allocated, filled, reduced, rebuilt and freed when and
as large as in a real run.

Four things in DDP touch tensor data, which fake tensors do not have; each is worked around with the real
Reducer kept (torch 2.13, torch/nn/parallel/distributed.py and torch/csrc/distributed/c10d/reducer.cpp):

1. and 2. At construction, `_verify_param_shape_across_processes` all-gathers parameter shapes and
   `_sync_module_states` broadcasts rank 0's parameters and buffers. Both run only when `init_sync=True`;
   DDP's own public argument `init_sync=False` skips them, no patch needed. Memory left out: the broadcast
   flattens parameters into buckets of `broadcast_bucket_size` = 250 MiB (distributed.py
   `self.broadcast_bucket_size = int(250 * 1024 * 1024)`) at construction, when only the parameters exist, so
   that transient is at most parameters + min(250 MiB, parameters); every training step holds parameters +
   gradients + buckets, at least as much, so it never sets the peak.
3. The default communication hook (`_AllReduceBySumCommHook`) returns the future of the process group's
   all-reduce, which the fake backend completes with no value: the Reducer then fails reading the reduced
   bucket. `_reduce_hook` below does what the default does, in place: divide the bucket by the world size
   (reducer.cpp skips its own division, `mul_out(bucket_view, grad, 1/div_factor)`, when a hook is
   registered and copies with `copy_` instead: the same bytes) and all-reduce it, then returns a completed
   future holding that same bucket, which the Reducer unflattens into the gradients (`populate_bucket_views_out`)
   as it does with the default's result. Memory: none left out.
4. At the start of the second forward, `Reducer::rebuild_buckets` re-buckets the parameters in the order
   their gradients became ready (first bucket capped at `dist._DEFAULT_FIRST_BUCKET_BYTES` = 1 MiB when the
   bucket size is DDP's default) and broadcasts the bucket indices from rank 0 (`sync_bucket_indices`),
   writing and reading an int32 index tensor through an accessor, which a fake tensor refuses. While the
   rebuild runs, `_RealIndexTensors` makes int32 `empty` calls (only the index tensors are int32 there) real
   host tensors, so the accessor works and the fake backend's broadcast leaves the values rank 0 wrote, which
   every rank writes alike; the new buckets are still fake and recorded. Memory left out: those index
   tensors, 4 bytes x (parameter tensors + 1) and 4 bytes x (buckets + 1), freed at the end of the rebuild.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from trainmem.errors import SetupError
from trainmem.trace.torch_private import TorchDispatchMode, disable_current_modes

DEFAULT_BUCKET_MB = 25.0  # DistributedDataParallel(bucket_cap_mb=None) -> distributed.py _DEFAULT_BUCKET_CAP_MB = 25


def on_meta(model: nn.Module, ctx: Any) -> nn.Module:
    """DDP wraps the materialized model (on_fake); nothing to do before."""
    return model


def on_fake(model: nn.Module, ctx: Any):
    """Wrap the fake model in DDP with the layout's bucket size and gradient_as_bucket_view."""
    from trainmem.parallel.apply import Parallelized

    wrapped, buckets = wrap_roots(model, ctx)
    return Parallelized(model=wrapped, communication_tensors=buckets, notes=notes(ctx.layout))


def wrap_roots(model: nn.Module, ctx: Any) -> tuple[nn.Module, Any]:
    """DDP around the model, or around each stage of a multi-stage pipeline rank (a DDP per stage, each with
    its Reducer); returns the module to call and `() -> bucket tensors` of all of them."""
    from trainmem.parallel.fsdp import roots

    if ctx.layout.tp > 1:
        raise SetupError(f"expected fsdp or hsdp over the data-parallel ranks with --tp (DDP replicates plain "
                         f"tensors, not DTensor shards; torchtitan refuses DDP with tensor parallelism), got "
                         f"--strategy {ctx.layout.strategy}", where="--strategy")
    stages = roots(model)
    if stages == [model]:
        wrapped, log = wrap(model, ctx)
        return wrapped, log.tensors
    logs = []
    for key, stage in list(model.stages.items()):
        if not any(p.requires_grad for p in stage.parameters()):
            continue  # DDP refuses a module with nothing to reduce (a stage of activations only)
        model.stages[key], log = wrap(stage, ctx)
        logs.append(log)
    return model, lambda: [t for log in logs for t in log.tensors()]


def wrap(model: nn.Module, ctx: Any, process_group: Any = None) -> tuple[nn.Module, BucketLog]:
    """DistributedDataParallel around `model` with the fake-tensor workarounds of the module docstring; the
    BucketLog names the bucket buffers the Reducer hands to the communication hook."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    layout = ctx.layout
    group = process_group if process_group is not None else ctx.world.dp_group()
    # bucket_cap_mb=None is DDP's default: 25 MiB buckets after a first one of 1 MiB; an explicit size sets
    # both (BucketCapacityConfig.from_bucket_cap_mb: first_bucket_bytes_cap = bucket_bytes_cap unless default)
    cap = None if layout.ddp_bucket_mb == DEFAULT_BUCKET_MB else layout.ddp_bucket_mb
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=cap, init_sync=False,
                                  gradient_as_bucket_view=layout.gradient_as_bucket_view)
    buckets = BucketLog(ddp)
    # dist._register_comm_hook takes the C++ Reducer itself: register before the proxy replaces the attribute
    ddp.register_comm_hook(_HookState(dist.get_world_size(group), group, buckets), _reduce_hook)
    ddp.reducer = _ReducerProxy(ddp.reducer)
    return ddp, buckets


class BucketLog:
    """The bucket buffers the Reducer passed to the hook in the latest backward, held weakly (holding them
    would keep a rebuilt-away bucket alive)."""

    def __init__(self, ddp: nn.Module) -> None:
        self._ddp = ddp
        self._latest: list[weakref.ref] = []
        self._backward = -1

    def seen(self, buffer: torch.Tensor, backward: int) -> None:
        if backward != self._backward:
            self._latest, self._backward = [], backward
        self._latest.append(weakref.ref(buffer))

    def tensors(self) -> list[torch.Tensor]:
        """The latest backward's buckets, collective buffers of their own; none with gradient_as_bucket_view,
        where the buckets are the gradients' storage (also while zero_grad has set the gradients to None:
        the next backward writes into the same buckets) and count as gradients."""
        if self._ddp.gradient_as_bucket_view:
            return []
        return [t for t in (ref() for ref in self._latest) if t is not None]


class _HookState:
    def __init__(self, world: int, group: Any, log: BucketLog) -> None:
        self.world, self.group, self.log = world, group, log
        self.backwards = 0


def _reduce_hook(state, bucket):  # unannotated: DDP's _check_comm_hook refuses other annotations
    """What DDP's default hook does (default_comm_hooks.cpp AllReduceCommHook / allreduce_hook in
    ddp_comm_hooks/default_hooks.py): divide the flat bucket by the world size and all-reduce it in place;
    the future completes with the same bucket."""
    import torch.distributed as dist

    buffer = bucket.buffer()
    if bucket.index() == 0:  # the Reducer launches buckets in index order (next_bucket_): a new backward
        state.backwards += 1
    state.log.seen(buffer, state.backwards)
    buffer.div_(state.world)
    dist.all_reduce(buffer, group=state.group)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(buffer)
    return future


class _RealIndexTensors(TorchDispatchMode):
    """During the bucket rebuild: int32 `empty` calls (the Reducer's index tensors) make real host tensors."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.empty.memory_format and kwargs.get("dtype") == torch.int32:
            with disable_current_modes():
                return torch.empty(*args, dtype=torch.int32)
        return func(*args, **kwargs)


class _ReducerProxy:
    """The DDP wrapper's `reducer` attribute: every call goes to the real C++ Reducer; `_rebuild_buckets`
    runs under _RealIndexTensors (obstacle 4 of the module docstring)."""

    def __init__(self, reducer: Any) -> None:
        object.__setattr__(self, "_reducer", reducer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        with _RealIndexTensors():
            return self._reducer._rebuild_buckets()


def notes(layout: Any) -> list[str]:
    cap = ("DDP's default 25 MiB (first bucket 1 MiB)" if layout.ddp_bucket_mb == DEFAULT_BUCKET_MB
           else f"{layout.ddp_bucket_mb:g} MiB")
    view = "gradients are views into the buckets" if layout.gradient_as_bucket_view else \
        "gradients copied into separate buckets"
    return [f"ddp: torch's DistributedDataParallel and Reducer traced on fake tensors; buckets of {cap}, {view}; "
            "the first step's single bucket is rebuilt in gradient-ready order before the second forward; "
            "construction-time parameter broadcast not traced (never the peak: parameters only)"]
