"""ZeRO stages 1, 2 and 3, traced through torch's own mechanisms (DeepSpeed is not installed here):

- zero1: DistributedDataParallel (parallel/ddp.py: full parameters, full gradients in all-reduced buckets)
  with `torch.distributed.optim.ZeroRedundancyOptimizer`, which gives each rank the optimizer state of a
  greedy, size-sorted partition of the parameters (zero_redundancy_optimizer.py `_partition_parameters`) and
  broadcasts each rank's updated parameters after its local step (`_sync_params`, in place: no buffer).
- zero2: FSDP2 fully_shard with reshard_after_forward=False: gradients and optimizer state sharded,
  parameters kept unsharded from forward to backward (FSDP2's SHARD_GRAD_OP), resharded after backward.
- zero3: FSDP2 full sharding (the layout's reshard_after_forward; unset: torch's default, where the root keeps
  its parameters unsharded into backward, _zero3). DeepSpeed's stage3_param_persistence_threshold
  (parameters of fewer elements stay whole on every rank, zero/partition_parameters.py `ds_persist`) maps
  onto fully_shard's `ignored_params`: such a parameter stays whole on every rank, and so do its gradient and
  optimizer state (DeepSpeed still partitions those: this errs high by 2 x state of those small parameters).
  stage3_prefetch_bucket_size (elements fetched ahead) maps onto FSDP2's explicit prefetch: as many units
  ahead as the bucket holds, counting the smallest unit (at least one, FSDP2's implicit prefetch).

How torch's mechanisms differ from DeepSpeed's (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py; the
defaults are DeepSpeedZeroConfig's in deepspeed/runtime/zero/config.py; docs:
https://deepspeed.readthedocs.io/en/latest/zero3.html): DeepSpeed keeps 16-bit parameters for the model and
fp32 master weights in the optimizer partition (the 2/2/12 bytes per parameter of the ZeRO paper's 16Ψ),
while torch trains the parameters in their own dtype (fp32 with autocast: no separate master copy); ZeRO-1/2
reduce into contiguous gradient buffers (`contiguous_gradients`) in buckets of `reduce_bucket_size` = 5e8
elements and all-gather updated parameters in `allgather_bucket_size` = 5e8 elements, and ZeRO-2 keeps the
full 16-bit parameters at all times, where FSDP2 reshards after backward; DDP's buckets default to 25 MiB.
ZeRO-3's `stage3_max_live_parameters` (1e9) and `stage3_max_reuse_distance` (1e9) have no FSDP2 counterpart
and are not modelled; DeepSpeed's `offload_param` is valid with stage 3 only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainmem.parallel import fsdp
from trainmem.setup.layout import Offload, ParallelLayout, Strategy

DEEPSPEED_NOTE = ("zero1/2/3 are traced through torch's own mechanisms (DeepSpeed is not installed): zero1 = DDP + "
                  "ZeroRedundancyOptimizer, zero2 = FSDP2 reshard_after_forward=False, zero3 = FSDP2 full "
                  "sharding; DeepSpeed differs: fp32 master weights beside 16-bit parameters, contiguous "
                  "gradient buffers, 5e8-element reduce buckets, ZeRO-2 keeps full parameters all the time")


def on_meta(model: nn.Module, ctx: Any) -> nn.Module:
    layout = ctx.layout
    for root in fsdp.roots(model):
        if layout.strategy == Strategy.ZERO2:
            ctx.notes.extend(fsdp.shard(root, ctx, reshard_after_forward=False, prefetch=layout.fsdp_prefetch))
        elif layout.strategy == Strategy.ZERO3:
            ctx.notes.extend(_zero3(root, ctx))
    return model


def _zero3(model: nn.Module, ctx: Any) -> list[str]:
    """Full sharding with the persistence threshold and the prefetch bucket (module docstring). With a
    mixed-precision policy an ignored parameter would stay fp32 beside bf16 unsharded ones (F.linear refuses
    mixed dtypes), so there the small units are not sharded on their own but with their parent instead."""
    layout = ctx.layout
    units, persistent, how = _units(model, layout, ctx.setup)
    prefetch = prefetch_count(units, layout.zero3_prefetch_bucket, persistent)
    # the layout's reshard_after_forward, as for fsdp (None: torch's default, the root kept unsharded into backward).
    # DeepSpeed ZeRO-3 has no root group: it releases each submodule's parameters after its forward unless they
    # are reused within stage3_max_reuse_distance (default 1e9 elements, config.py), which keeps more, not less;
    # keeping the root's parameters is the nearer (and higher) of the two FSDP2 choices
    notes = fsdp.shard(model, ctx, reshard_after_forward=layout.reshard_after_forward, prefetch=prefetch,
                       ignored_params=persistent,
                       units=units)
    return notes + [f"zero3: {how}; prefetch bucket {layout.zero3_prefetch_bucket:,} elements -> {prefetch} "
                    f"unit(s) ahead"]


def _units(model: nn.Module, layout: ParallelLayout, setup: Any) -> tuple[list[nn.Module], set[nn.Parameter], str]:
    """(the units fully_shard wraps, the parameters kept whole, how the persistence threshold was applied)."""
    threshold = layout.zero3_persistence_threshold
    units = fsdp.wrap_units(model, layout.fsdp_wrap)
    if fsdp.mixed_precision(setup)[1] != "":
        small = [u for u in units if sum(p.numel() for p in u.parameters()) < threshold]
        return [u for u in units if u not in small], set(), (
            f"{len(small)} unit(s) below the persistence threshold ({threshold:,} elements) sharded with "
            f"their parent, not on their own (ignored_params would keep them fp32 beside bf16 parameters)")
    persistent = persistent_params(model, threshold)
    return units, persistent, (
        f"{len(persistent)} parameter(s) below the persistence threshold ({threshold:,} elements) kept "
        f"whole on every rank (fully_shard ignored_params; their gradients and optimizer state too)")


def blocks_prefetch_alone(model: nn.Module, blocks: list[nn.Module], layout: ParallelLayout, setup: Any) -> bool:
    """Whether every one of `blocks` is a unit of its own and each unit prefetches only the next (the bucket holds
    fewer than two of the smallest unit): then a rank's trace may compose from 3 and 4 blocks (rank_trace.py).
    Blocks below the persistence threshold join their parent's unit, which then grows with the blocks; and with
    more units per bucket their count is capped by the units there are: a 3-block model prefetches fewer."""
    units, persistent, _ = _units(model, layout, setup)
    wrapped = {id(unit) for unit in units}
    return all(id(block) in wrapped for block in blocks) and \
        prefetch_count(units, layout.zero3_prefetch_bucket, persistent) == 1


def traces_as_fsdp(model: nn.Module, layout: ParallelLayout, setup: Any) -> bool:
    """Whether ZeRO-3 on `model` makes exactly the fully_shard calls FSDP makes with the same layout (fsdp.on_meta),
    on every root a rank wraps (each pipeline stage its own): the same units in the same order, no parameter kept
    whole (under a mixed-precision policy none is, _units) and as many units prefetched as --fsdp-prefetch. Nothing
    else of the two differs but the notes (on_fake), so their ranks trace the same events and the planner traces
    one for both (plan/tracer.py traced_as). `model`: the whole model on meta (pipeline stages are split from it)."""
    if layout.strategy != Strategy.ZERO3:
        return False
    if layout.pp > 1:
        from trainmem.parallel.pp_split import split_stages, total_stages

        roots = split_stages(model, total_stages(layout))
    else:
        roots = fsdp.roots(model)
    return all(_root_as_fsdp(root, layout, setup) for root in roots)


def _root_as_fsdp(root: nn.Module, layout: ParallelLayout, setup: Any) -> bool:
    units, persistent, _ = _units(root, layout, setup)
    if persistent or [id(u) for u in units] != [id(u) for u in fsdp.wrap_units(root, layout.fsdp_wrap)]:
        return False
    return prefetch_count(units, layout.zero3_prefetch_bucket, persistent) == layout.fsdp_prefetch


def on_fake(model: nn.Module, ctx: Any):
    """zero1: DDP + ZeroRedundancyOptimizer; zero2/3: offload labels when asked."""
    from trainmem.parallel import ddp, offload
    from trainmem.parallel.apply import Parallelized

    layout = ctx.layout
    if layout.strategy != Strategy.ZERO1:
        result = offload.parallelized(model, ctx) if layout.offload != Offload.NONE else Parallelized(model)
        result.notes.append(DEEPSPEED_NOTE)
        return result
    wrapped, buckets = ddp.wrap_roots(model, ctx)
    factory = zero1_factory(ctx)
    result = offload.parallelized(wrapped, ctx, factory)
    if layout.offload == Offload.NONE:
        result.host_tensors = None
        result.notes = []
    result.communication_tensors = buckets
    result.notes += ddp.notes(layout) + [DEEPSPEED_NOTE]
    return result


def zero1_factory(ctx: Any):
    """(params, setup) -> ZeroRedundancyOptimizer over the data-parallel group, stepping the optimizer class
    and hyper-parameters the setup would use alone."""
    import inspect

    from torch.distributed.optim import ZeroRedundancyOptimizer

    from trainmem.trace import step

    def make(params: Any, setup: Any) -> torch.optim.Optimizer:
        params = list(params)
        template = step.make_optimizer(params, setup, getattr(ctx, "cuda_semantics", False))
        # the hyper-parameters a user passes: those the class's constructor takes (AdamW's defaults also hold
        # decoupled_weight_decay=True, which AdamW.__init__ fixes itself and refuses as a keyword)
        accepted = inspect.signature(type(template).__init__).parameters
        defaults = {k: v for k, v in template.defaults.items() if k in accepted and k != "params"}
        zero = ZeroRedundancyOptimizer(params, optimizer_class=type(template), process_group=ctx.world.dp_group(),
                                       **defaults)
        # this rank's state lives in the local optimizer (`zero.optim.state`); ZeRO's own `state` stays an empty
        # dict that nothing of ZeRO's step reads: point it at the local one so that whoever reads
        # `optimizer.state` (the trace's category settling) sees this rank's partition
        zero.state = zero.optim.state
        return zero

    return make


def persistent_params(model: nn.Module, threshold: int) -> set[nn.Parameter]:
    """Parameters of fewer than `threshold` elements (DeepSpeed: param.ds_numel < param_persistence_threshold)."""
    return {p for p in model.parameters() if p.numel() < threshold}


def prefetch_count(units: list[nn.Module], bucket: int, persistent: set[nn.Parameter]) -> int:
    """Units ahead whose elements fit in the prefetch bucket, counting the smallest unit (so never fewer
    prefetched than DeepSpeed's bucket allows); at least 1, at most the units after the first."""
    sizes = [sum(p.numel() for p in unit.parameters() if p not in persistent) for unit in units]
    sizes = [size for size in sizes if size > 0]
    if len(sizes) < 2:
        return 1
    return max(1, min(len(sizes) - 1, bucket // min(sizes)))


def zero1_classes(model: nn.Module, layout: ParallelLayout) -> list[tuple[int, ...]]:
    """dp indices grouped by the sizes of their ZeroRedundancyOptimizer partitions. With pipeline parallelism
    each pp rank's optimizer partitions only its stages' parameters: indices are alike when they are alike
    on every pp rank."""
    if layout.pp == 1:
        return _group(partition_signatures(list(model.parameters()), layout.dp))
    import copy

    from trainmem.parallel import pp

    stages = pp.split_stages(copy.deepcopy(model), pp.total_stages(layout))  # meta: no storage copied
    per_rank = [partition_signatures([p for i in pp.rank_stage_indices(rank, layout.pp, len(stages))
                                      for p in stages[i].parameters()], layout.dp) for rank in range(layout.pp)]
    return _group([tuple(signatures[index] for signatures in per_rank) for index in range(layout.dp)])


def partition_signatures(params: list[nn.Parameter], ranks: int) -> list[tuple]:
    """What each rank's partition holds, (numel, dtype) sorted: parameters sorted by numel, largest first (a
    stable sort), each to the rank with the fewest elements so far, the first such rank on ties
    (zero_redundancy_optimizer.py _partition_parameters / _get_min_index); one param group."""
    trainable = [p for p in {id(p): p for p in params}.values() if p.requires_grad]
    sizes = [0] * ranks
    held: list[list[tuple[int, str]]] = [[] for _ in range(ranks)]
    for param in sorted(trainable, key=lambda t: t.numel(), reverse=True):
        rank = sizes.index(min(sizes))
        held[rank].append((param.numel(), str(param.dtype)))
        sizes[rank] += param.numel()
    return [tuple(sorted(partition)) for partition in held]


def _group(signatures: list) -> list[tuple[int, ...]]:
    groups: dict[Any, list[int]] = {}
    for index, signature in enumerate(signatures):
        groups.setdefault(signature, []).append(index)
    return [tuple(group) for group in groups.values()]
