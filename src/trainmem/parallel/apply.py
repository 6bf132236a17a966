"""Applying a layout to a model: which strategy modules run, in which order, and what they hand back.

The strategy modules (ddp.py, fsdp.py, zero.py, tp.py, pp.py) each expose
`on_meta(model, ctx) -> nn.Module`, run on the meta-built model before it is materialized (pipeline split,
`parallelize_module`, `fully_shard`), and `on_fake(model, ctx) -> Parallelized`, run inside the fake mode and
the recorder after materialization (the DDP wrapper, ZeroRedundancyOptimizer, the pipeline schedule). Either
may be absent from a module: then that step does nothing for it. The order is torchtitan's
(torchtitan/models/llama3/infra/parallelize.py: TP, then activation checkpointing, then FSDP; pipelining
splits the model before any of them):

    on_meta:  pp -> tp -> data-parallel (fsdp | hsdp | zero2 | zero3)
    on_fake:  data-parallel (ddp | zero1 | …) -> tp -> pp
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainmem.errors import SetupError
from trainmem.setup.layout import ParallelLayout, Strategy

# Which module carries each data-parallel kind: HSDP is fully_shard on a 2-D mesh; ZeRO 1/2/3 are torch's
# ZeroRedundancyOptimizer and FSDP2 with ZeRO's knobs (zero.py says which mechanism each stage uses).
DATA_PARALLEL_MODULES = {Strategy.DDP: "ddp", Strategy.FSDP: "fsdp", Strategy.FSDP1: "fsdp1", Strategy.HSDP: "fsdp",
                         Strategy.ZERO1: "zero", Strategy.ZERO2: "zero", Strategy.ZERO3: "zero"}


@dataclasses.dataclass
class ParallelContext:
    """What a strategy module is told: the resolved layout, this rank's fake world and role, the setup."""

    layout: ParallelLayout
    world: Any  # parallel.world.World
    role: Any  # parallel.roles.RankRole
    setup: Any  # setup.TrainingSetup
    notes: list[str] = dataclasses.field(default_factory=list)  # assumptions, printed as warnings
    cuda_semantics: bool = False  # the trace stands for a CUDA run (optimizer default, autocast lists)


@dataclasses.dataclass
class Parallelized:
    """What the steps run: the (wrapped) model and, where a strategy replaces them, the optimizer factory and
    the loop; tensors the recorder must place (host RAM, collective buffers)."""

    model: Any  # nn.Module: what the loop calls, model(*inputs)
    make_optimizer: Callable | None = None  # (params, setup) -> torch.optim.Optimizer
    run_steps: Callable | None = None  # (prepared, setup, observer) -> None, replaces the loop (pp schedules)
    host_tensors: Callable | None = None  # () -> tensors living in host RAM (offload)
    communication_tensors: Callable | None = None  # () -> tensors that are collective buffers (DDP buckets)
    notes: list[str] = dataclasses.field(default_factory=list)
    # FSDP1: what the wrapper allocates as it is built are the parameters (flat parameters and their shards), not
    # collective buffers; and on a GPU the model as materialized was the user's host copy (fsdp1.py)
    wraps_parameters: bool = False
    built_on_host: bool = False
    # FSDP1's CPU offload: host_tensors() already names host tensors right after wrapping (the sharded flat
    # parameters FSDP1 moved to the host), so they are placed from their birth, not from the first backward
    host_from_wrap: bool = False


def strategy_module(name: str, strategy: str) -> ModuleType:
    """trainmem.parallel.<name>, or a one-line refusal naming the strategy when this version lacks it."""
    try:
        return importlib.import_module(f"trainmem.parallel.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"trainmem.parallel.{name}":
            raise
        raise SetupError(f"expected a strategy this version traces, got --strategy {strategy}: not yet supported "
                         f"(trainmem.parallel.{name} is missing)", where="--strategy") from None


def _modules(layout: ParallelLayout) -> list[tuple[str, ModuleType]]:
    """(role, module) in on_meta order: pp, tp, data-parallel; each only where its degree is above 1 or the
    strategy names it."""
    chosen = []
    if layout.pp > 1:
        chosen.append(("pp", strategy_module("pp", "pp")))
    if layout.tp > 1:
        chosen.append(("tp", strategy_module("tp", "tp")))
    if layout.data_parallel is not None:
        chosen.append(("dp", strategy_module(DATA_PARALLEL_MODULES[layout.data_parallel], str(layout.data_parallel))))
    return chosen


def apply_on_meta(model: Any, ctx: ParallelContext, before_data_parallel: Callable | None = None) -> Any:
    """pp -> tp -> data-parallel `on_meta`, each on what the one before returned. `before_data_parallel(model)`
    runs between TP and the data-parallel wrapping: activation checkpointing, where torchtitan applies it
    (apply_tp, apply_ac, apply_fsdp)."""
    called = False
    for kind, module in _modules(ctx.layout):
        if kind == "dp" and before_data_parallel is not None:
            before_data_parallel(model)
            called = True
        if hasattr(module, "on_meta"):
            model = module.on_meta(model, ctx)
    if before_data_parallel is not None and not called:
        before_data_parallel(model)
    return model


def apply_on_fake(model: Any, ctx: ParallelContext) -> Parallelized:
    """data-parallel -> tp -> pp `on_fake`, inside the fake mode and recorder; later results wrap earlier ones:
    each module gets the model the one before returned, and a field a later one sets replaces the earlier."""
    result = Parallelized(model)
    for _, module in reversed(_modules(ctx.layout)):
        if hasattr(module, "on_fake"):
            result = _merged(result, module.on_fake(result.model, ctx))
    return result


def _merged(before: Parallelized, after: Parallelized) -> Parallelized:
    def both(first: Callable | None, second: Callable | None) -> Callable | None:
        if first is None or second is None:
            return first or second
        return lambda: [*first(), *second()]

    return Parallelized(
        model=after.model, make_optimizer=after.make_optimizer or before.make_optimizer,
        run_steps=after.run_steps or before.run_steps,
        host_tensors=both(before.host_tensors, after.host_tensors),
        communication_tensors=both(before.communication_tensors, after.communication_tensors),
        notes=[*before.notes, *after.notes], wraps_parameters=before.wraps_parameters or after.wraps_parameters,
        built_on_host=before.built_on_host or after.built_on_host, host_from_wrap=before.host_from_wrap or after.host_from_wrap)
