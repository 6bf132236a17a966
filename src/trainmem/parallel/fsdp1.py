"""FSDP1 (`FullyShardedDataParallel`, FlatParameter), traced for real: torch's own FSDP1 wraps the materialized
fake model on this rank's fake process group, so the flat parameters, their shards, the all-gathered padded flat
parameters, the reduce-scatter buffers and the sharded gradients are made and freed by FSDP1's own code
(torch/distributed/fsdp/_flat_param.py, _runtime_utils.py). FSDP1 is what Lightning's FSDP strategy wraps a model
with (and Accelerate's FSDP plugin at fsdp_version 1); `--strategy fsdp` is FSDP2 (parallel/fsdp.py).

Wrapping: the units of `--fsdp-wrap` (parallel/fsdp.py wrap_units: each repeated block, else each top-level child
with parameters), each wrapped in its own FullyShardedDataParallel, then the root: what an auto-wrap policy over the
blocks' class makes. Each unit's parameters become one FlatParameter, padded so that every rank's shard has the
same size (FlatParamHandle._get_shard).

Knobs: `--fsdp1-sharding` is sharding_strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD over the 2-D
(replicate, shard) mesh HSDP uses: --dp-shard ranks shard, default a node's); `--fsdp1-use-orig-params`
is use_orig_params (the optimizer then steps views of the flat shard, one per original parameter, so its state
differs from rank to rank); `--fsdp1-backward-prefetch pre|post|none` and `--fsdp1-forward-prefetch` are FSDP1's
prefetch knobs (defaults BACKWARD_PRE, False). limit_all_gathers stays True: it bounds how far a GPU run's CPU thread
issues all-gathers ahead of the GPU, which a trace in program order does not do.
`--offload params` is CPUOffload(offload_params=True), run by FSDP1 itself (OFFLOAD_NOTE says where each tensor
lives; the pinned host buffers are made as copies, fsdp1_private.py offload_on_fake).

Mixed precision is Lightning's by default (lightning/fabric/plugins/precision/fsdp.py FSDPPrecision
.mixed_precision_config): for bf16-mixed MixedPrecision(param_dtype=float32, reduce_dtype=buffer_dtype=bfloat16) under
autocast, for fp16-mixed the same with float16; `--fsdp1-param-dtype bfloat16` (float16) is PyTorch's FSDP tutorial's
and llama-recipes' bfSixteen: the low dtype for the parameters too, so each rank keeps a low-precision copy of its
shard (_flat_param.py `_mp_shard`) and gathers 16-bit parameters. Pure bf16 builds the model in bf16 and wraps it
without a policy.

Where the model was built: a user builds it on the CPU (or loads it there) and FSDP1 moves each unit to the GPU as
it wraps it (`device_id`; _init_utils.py _move_module_to_device), then flattens it there. For a GPU target the
materialized model is the user's host copy, and each unit is copied before it is wrapped, as that move allocates
it on the device. On the CPU target nothing moves (`device_id=cpu`, what measure/dist_child.py runs).

On a GPU, FSDP1 calls record_stream on the padded flat parameters its unshard stream fills and on the reduce-scatter
output; the trace runs on the CPU, where those calls do nothing (_utils.py _no_dispatch_record_stream), so their
frees are where the trace drops the last reference.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from trainmem.parallel.fsdp1_private import host_buffers, offload_on_fake
from trainmem.parallel.offload import OptimizerHolder
from trainmem.setup.layout import Fsdp1Sharding, Offload
from trainmem.trace.fake_cache import fake_data_pointers

# FSDP1's CPUOffload, traced by FSDP1's own code (module docstring): what the trace cannot make is said here
OFFLOAD_NOTE = ("FSDP1 CPUOffload(offload_params=True): each unit's sharded flat parameter (pinned), its host "
                "gradient buffer and the optimizer state live in host RAM and the optimizer steps there; the gathered "
                "parameters, their gradients and each unit's reduced gradient shard are on the device, and FSDP1 "
                "keeps every unit's shard (_saved_grad_shard) there until the end of backward, when it is copied to "
                "the host. Not traced (the trace's device is the host, so FSDP1's copy to the compute device is a "
                "no-op): each unit's shard copied to the device before its all-gather, 1/dp of the unit's "
                "parameters, freed once gathered")


def on_fake(model: nn.Module, ctx: Any):
    """Wrap each unit in FullyShardedDataParallel, then the root, inside the fake mode and the recorder."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    from trainmem.parallel.apply import Parallelized
    from trainmem.parallel.fsdp import wrap_units
    from trainmem.trace.step import freeze_parameters

    layout = ctx.layout
    freeze_parameters(model, ctx.setup.freeze)  # before flattening, as a user freezes: the names are the model's
    units = wrap_units(model, layout.fsdp_wrap)
    _check_flattenable(model, units, layout)
    names = {id(m): name for name, m in model.named_modules()}
    kwargs = _fsdp1_kwargs(ctx)
    prefetch = kwargs["backward_prefetch"]
    moved = ctx.cuda_semantics
    offloaded = layout.offload == Offload.PARAMS
    with fake_data_pointers(), _offloading(offloaded):
        for unit in units:
            _replace(model, unit, FullyShardedDataParallel(_moved(unit) if moved else unit, **kwargs))
        wrapped = FullyShardedDataParallel(_moved(model) if moved else model, **kwargs)
    listed = ", ".join(names.get(id(u), "?") for u in units[:3]) + (", …" if len(units) > 3 else "")
    notes = [f"FSDP1: FullyShardedDataParallel on {len(units)} unit(s) ({listed or 'none'}) then the root "
             f"(--fsdp-wrap {layout.fsdp_wrap}); sharding_strategy={layout.fsdp1_sharding.name}, "
             f"use_orig_params={layout.fsdp1_use_orig_params}, backward_prefetch={prefetch.name if prefetch else None}, "
             f"forward_prefetch={layout.fsdp1_forward_prefetch}, limit_all_gathers=True (on a GPU it bounds how far "
             "the CPU runs ahead; the trace runs in program order)"]
    if "mixed_precision" in kwargs:
        notes.append(mixed_precision_note(kwargs["mixed_precision"]))
    if moved:
        notes.append("FSDP1: the model is built in host RAM and each unit is moved to the GPU as it is wrapped "
                     "(device_id): the host copy is not device memory, each unit's moved copy and its flat parameter "
                     "are, until the shard is kept")
    if not offloaded:
        return Parallelized(wrapped, run_steps=_steps_with_pointers, notes=notes, built_on_host=moved,
                            wraps_parameters=True)
    holder = OptimizerHolder(ctx)
    return Parallelized(wrapped, make_optimizer=holder, run_steps=_steps_with_pointers,
                        host_tensors=lambda: [*holder.state_tensors(), *host_buffers(wrapped)],
                        notes=[*notes, OFFLOAD_NOTE], built_on_host=moved, wraps_parameters=True, host_from_wrap=True)


def _steps_with_pointers(prepared: Any, setup: Any, observer: Any) -> None:
    """The loop, with fake tensors' data pointers FSDP1 can compare (trace/fake_cache.py fake_data_pointers)."""
    from trainmem.trace import step as training

    with fake_data_pointers(), _offloading(setup.parallel.offload == Offload.PARAMS):
        training.run_steps(prepared, setup, observer)


def _offloading(offloaded: bool) -> Any:
    """offload_on_fake() where CPU offload runs (fsdp1_private.py), else nothing: the stand-ins are for its code only."""
    return offload_on_fake() if offloaded else contextlib.nullcontext()


def _fsdp1_kwargs(ctx: Any) -> dict[str, Any]:
    from torch.distributed.fsdp import CPUOffload, ShardingStrategy

    layout = ctx.layout
    # HYBRID_SHARD takes the 2-D (replicate, shard) mesh: it shards over the inner dimension, replicates over the outer
    group = {"device_mesh": ctx.world.dp_mesh()} if layout.replicate_x_shard else {"process_group": ctx.world.dp_group()}
    offload = {"cpu_offload": CPUOffload(offload_params=True)} if layout.offload == Offload.PARAMS else {}
    kwargs = dict(**group, **offload, sharding_strategy=ShardingStrategy[layout.fsdp1_sharding.name],
                  device_id=torch.device("cpu"), use_orig_params=layout.fsdp1_use_orig_params,
                  backward_prefetch=backward_prefetch(layout.fsdp1_backward_prefetch),
                  forward_prefetch=layout.fsdp1_forward_prefetch)
    policy = mixed_precision(ctx.setup, layout)
    if policy is not None:
        kwargs["mixed_precision"] = policy
    return kwargs


def backward_prefetch(name: str) -> Any:
    """FSDP1's BackwardPrefetch for --fsdp1-backward-prefetch: pre all-gathers the next unit before the current one's
    gradients are computed (two units gathered), post after them, none when the next unit's backward starts."""
    from torch.distributed.fsdp import BackwardPrefetch

    return {"pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST, "none": None}[name]


def mixed_precision(setup: Any, layout: Any) -> Any:
    """The MixedPrecision for the setup's precision (module docstring), with `--fsdp1-param-dtype` as its param_dtype;
    None where there is none."""
    from torch.distributed.fsdp import MixedPrecision

    from trainmem.errors import SetupError
    from trainmem.setup import Precision

    low = {Precision.BF16_MIXED: torch.bfloat16, Precision.FP16_MIXED: torch.float16}.get(setup.precision)
    param = getattr(torch, layout.fsdp1_param_dtype)
    if low is None or param not in (torch.float32, low):
        if param is torch.float32:
            return None
        raise SetupError(f"expected --fsdp1-param-dtype float32 or the mixed precision's own dtype, got "
                         f"{layout.fsdp1_param_dtype} with --precision {setup.precision}", where="--fsdp1-param-dtype")
    return MixedPrecision(param_dtype=param, reduce_dtype=low, buffer_dtype=low)


def mixed_precision_note(policy: Any) -> str:
    """What the MixedPrecision the wrap took keeps and gathers, and whose recipe it is."""
    low = str(policy.reduce_dtype).removeprefix("torch.")
    if policy.param_dtype is torch.float32:
        return (f"FSDP1 mixed precision as Lightning's FSDP strategy sets it: MixedPrecision(param_dtype=float32, "
                f"reduce_dtype={low}, buffer_dtype={low}) with autocast: fp32 flat parameters gathered as they are, "
                f"gradients reduced in {low}")
    return (f"FSDP1 mixed precision as PyTorch's FSDP tutorial sets it (--fsdp1-param-dtype {low}): MixedPrecision("
            f"param_dtype={low}, reduce_dtype={low}, buffer_dtype={low}): each rank keeps a {low} copy of its fp32 "
            f"shard and gathers {low} parameters")


def _check_flattenable(model: nn.Module, units: list[nn.Module], layout: Any) -> None:
    """What FSDP1 refuses to flatten into one FlatParameter (_flat_param.py _init_flat_param_and_metadata), said in
    one line naming the flag: integer tensors (bitsandbytes' packed 4-bit weights) and, without use_orig_params,
    frozen and trainable parameters in one unit (a LoRA adapter beside its frozen base weight)."""
    from trainmem.errors import SetupError

    parameters = list(model.parameters())
    if any(not (p.is_floating_point() or p.is_complex()) for p in parameters):
        raise SetupError("expected floating-point parameters with --strategy fsdp1, got integer ones (--qlora's packed "
                         "4-bit weights): FSDP1 flattens only floating tensors, and QLoRA under FSDP1 (bitsandbytes' "
                         "bnb_4bit_quant_storage=bfloat16) is not traced yet", where="--qlora")
    in_units = [list(unit.parameters()) for unit in units]
    taken = {id(p) for group in in_units for p in group}
    groups = in_units + [[p for p in parameters if id(p) not in taken]]  # each unit, then the root's own
    if not layout.fsdp1_use_orig_params and any(len({p.requires_grad for p in group}) > 1 for group in groups):
        raise SetupError("expected --fsdp1-use-orig-params with frozen parameters beside trainable ones (--lora, "
                         "--freeze) under --strategy fsdp1: FSDP1 flattens a unit's parameters into one FlatParameter, "
                         "which has one requires_grad, unless use_orig_params=True (FSDP1 raises 'Must flatten tensors "
                         "with uniform requires_grad')", where="--fsdp1-use-orig-params")


def _moved(module: nn.Module) -> nn.Module:
    """What FSDP1's `_move_module_to_device` does to a unit built in host RAM: each parameter and buffer not already
    in a nested FSDP1 unit gets a device copy (`param.data = param.to(device)`), and the host copy is dropped."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    nested = {id(t) for m in module.modules() if isinstance(m, FullyShardedDataParallel) and m is not module
              for t in [*m.parameters(), *m.buffers()]}
    with torch.no_grad():
        for tensor in {id(t): t for t in [*module.parameters(), *module.buffers()]}.values():
            if id(tensor) not in nested:
                tensor.data = torch.empty_like(tensor.data)
    return module


def _replace(model: nn.Module, unit: nn.Module, wrapped: nn.Module) -> None:
    """Put the wrapped unit where the unit was (its parent's attribute), as an auto-wrap policy does."""
    for parent in model.modules():
        for name, child in parent.named_children():
            if child is unit and parent is not wrapped:
                setattr(parent, name, wrapped)
                return
    raise ValueError(f"FSDP1 unit {type(unit).__name__} is not a submodule of the model")


def dp_index_classes(layout: Any) -> list[tuple[int, ...]]:
    """Data-parallel indices whose per-rank sizes are equal: every rank's flat shard is padded to one size, so with
    the flat parameters in the optimizer every rank is alike; with use_orig_params the optimizer's state is
    per original parameter's share of the shard, which differs from rank to rank (each is traced)."""
    if not layout.fsdp1_use_orig_params or layout.fsdp1_sharding == Fsdp1Sharding.NO_SHARD:
        return [tuple(range(layout.dp))]
    if layout.replicate_x_shard:  # replicas of one shard index hold the same views (row-major: shard innermost)
        shard = layout.hsdp_shard
        return [tuple(i for i in range(layout.dp) if i % shard == index) for index in range(shard)]
    return [(index,) for index in range(layout.dp)]

