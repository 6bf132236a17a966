"""Trace one rank of a many-rank run: the real torch.distributed code (DDP, FSDP2, DTensor TP, pipelining)
on fake tensors over the fake process group, in this one process.

For one RankRole, inside `fake_world(layout, role.rank)`: build on meta -> LoRA/QLoRA (finetune.apply) -> pure
bf16 cast and --freeze on meta -> the strategies' `on_meta` (pp -> tp -> checkpointing -> data-parallel) ->
FakeTensorMode + recorder -> materialize (`to_empty`, DTensor-aware) -> the strategies' `on_fake` -> prepare
(the strategy's optimizer) -> the steps (the strategy's loop, for pipelines, or the user's loop).

What the recorder does differently for ranks (trace/recorder.py): a DTensor op is left to DTensor, whose ops on
the local shards are the ones recorded; DTensor's throw-away global-shape tensors are muted; FSDP2's storage
resizes (free and re-allocate unsharded parameters) are alloc/free events; collective ops' outputs are
communication buffers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from typing import Any

import torch

from trainmem.errors import SetupError, TrainmemError, one_line
from trainmem.frontends import ModelSource
from trainmem.frontends.libraries import code_libraries
from trainmem.parallel.apply import ParallelContext, Parallelized, apply_on_fake, apply_on_meta
from trainmem.setup.layout import Offload, Strategy
from trainmem.parallel.world import fake_world
from trainmem.setup import Precision, TrainingSetup
from trainmem.trace import cache_store, keras_torch_step
from trainmem.trace import step as training
from trainmem.trace.checkpointing import checkpoint_blocks
from trainmem.trace.dtype_checks import SameDtypeKernels
from trainmem.trace.events import Category, Phase
from trainmem.trace.fake_cache import tracing_fake_mode
from trainmem.trace.meta_build import building_on_meta
from trainmem.trace.modules import ModuleTracker
from trainmem.trace.recorder import TraceRecorder
from trainmem.trace.run import (TraceSemantics, traced_model_facts, RecordingObserver, materialize_fake,
                                module_sets)
from trainmem.trace.torch_private import (FAKE_TENSOR_LOG, dtensor_shape_propagation_muted,
                                          is_wrapper_subclass,
                                          storage_resizes_reported, storage_tensors)
from trainmem.trace.traced import TraceResult


def build_on_meta(source: ModelSource, setup: TrainingSetup) -> tuple[Any, Any, Any, list[str]]:
    """The model as every rank builds it, on meta: LoRA applied, cast for pure bf16, --freeze applied (FSDP2
    and DDP read requires_grad when they wrap)."""
    from trainmem.trace import finetune

    with building_on_meta():
        model, make_batch, loss_fn = training.unpack_built(source.build(), source)
        if keras_torch_step.is_keras_model(model):
            raise SetupError("expected a PyTorch model with --strategy, got a Keras model", where="--strategy")
        model, notes = finetune.apply(model, setup)
        if setup.precision == Precision.BF16:
            model.to(torch.bfloat16)  # on meta: the shards are made in bf16, and ties stay ties
        training.freeze_parameters(model, setup.freeze)
    return model, make_batch, loss_fn, notes


def trace_rank(source: ModelSource, setup: TrainingSetup, role: Any, kernel_ops: frozenset[str] = frozenset(),
               semantics: TraceSemantics | None = None) -> TraceResult:
    """The training steps of one rank (role.rank) as the TraceResult the assembler reads; extra fields on the
    trace: `host_storages` (offloaded tensors) and the notes of the strategies in `warnings`."""
    cuda = semantics is not None and semantics.cuda_semantics
    # torch's own warnings during the fake steps (FSDP2's "returned a view tensor" once per module and step) are
    # the real run's too: kept, once each, as the estimate's warnings rather than printed mid-trace
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        traced, key = _trace_rank(source, setup, role, kernel_ops, semantics, cuda)
    if traced.cache_use is not None and traced.cache_use.used == "reused":  # stored with its warnings
        return traced
    said = dict.fromkeys(f"torch warned while tracing rank {role.rank}: {one_line(w.message)}" for w in caught)
    traced.warnings.extend(said)
    if key is not None:  # parallel/rank_cache.py
        traced = dataclasses.replace(traced, cache_use=cache_store.store(key, traced))
    return traced


def _trace_rank(source: ModelSource, setup: TrainingSetup, role: Any, kernel_ops: frozenset[str],
                semantics: TraceSemantics | None, cuda: bool) -> tuple[TraceResult, str | None]:
    """The rank's trace and its key in the trace cache (None: not cached); a stored trace when there is one."""
    from trainmem.parallel.rank_cache import rank_key
    from trainmem.trace.block_reuse import traced_by_blocks

    with fake_world(setup.parallel, role.rank) as world:
        model, make_batch, loss_fn, notes = build_on_meta(source, setup)
        key, use = rank_key(model, make_batch, loss_fn, source, setup, role, kernel_ops, semantics)
        hit = cache_store.lookup(key) if key is not None else None
        if hit is not None:
            return dataclasses.replace(hit[0], cache_use=hit[1]), None
        facts = traced_model_facts(model)  # the whole model's counts, as its card gives them

        def traced(variant: Any, more_notes: tuple[str, ...] = ()) -> TraceResult:
            ctx = ParallelContext(setup.parallel, world, role, setup, cuda_semantics=cuda)
            checkpointed: list[str] = []

            def checkpoint(module: Any) -> None:
                if setup.checkpointing:
                    checkpointed.extend(checkpoint_blocks(module))

            wrapped = apply_on_meta(variant, ctx, before_data_parallel=checkpoint)
            return _traced(source, setup, wrapped, make_batch, loss_fn, ctx, checkpointed, facts,
                           notes + list(more_notes), kernel_ops, semantics)

        reuse = traced_by_blocks(model, setup, traced) if composable(setup.parallel, model, setup) else None
        if reuse is not None and reuse.traced is not None:
            return dataclasses.replace(reuse.traced, cache_use=use), key
        return dataclasses.replace(traced(model, (reuse.note,) if reuse is not None and reuse.note else ()),
                                   cache_use=use), key


# The strategies whose ranks' traces compose from 3 and 4 blocks (trace/block_reuse.py), as checked on the zoo's
# deep GPT and Llama-3.1-70B (tests/test_block_reuse.py, benchmarks/results/block_reuse.md): FSDP2's units are the
# blocks (HSDP's too), with or without tensor parallelism, and tensor parallelism alone (its backward attributed to
# its blocks by trace/modules.py _made_in); FSDP1's units too (its wrappers' gathers and frees are their blocks',
# modules.py _name_of); ZeRO-3 where the blocks are units that prefetch only the next (zero.py blocks_prefetch_alone:
# Llama-3.1-70B's 856 M-element blocks against the 50 M-element bucket). Not: DDP and ZeRO-1 (gradient buckets
# partition all the model's parameters by size: the Reducer's first allocation grows with the blocks), ZeRO-3
# prefetching several units (as many as there are, up to the bucket), whose 3-block traces composed to 4 differ from
# the 4-block ones (the check would refuse them after tracing both), and pipelines (the stages split the blocks).
COMPOSABLE = (Strategy.FSDP, Strategy.ZERO2, Strategy.FSDP1, Strategy.HSDP, Strategy.TP)


def composable(layout: Any, model: Any = None, setup: Any = None) -> bool:
    if layout.pp != 1:
        return False
    if layout.strategy == Strategy.ZERO3 and model is not None:
        from trainmem.parallel.zero import blocks_prefetch_alone
        from trainmem.trace.block_variants import repeated_blocks

        found = repeated_blocks(model)
        return found is not None and blocks_prefetch_alone(model, list(model.get_submodule(found.path)), layout, setup)
    return layout.strategy in COMPOSABLE


def _traced(source, setup, model, make_batch, loss_fn, ctx, checkpointed, facts, notes, kernel_ops, semantics):
    fake_mode = tracing_fake_mode()  # trace/fake_cache.py
    fake_log_level, FAKE_TENSOR_LOG.level = FAKE_TENSOR_LOG.level, logging.CRITICAL
    tracker = ModuleTracker(model)
    recorder = TraceRecorder(tracker, kernel_ops)
    recorder.distributed = True
    observer = _RankObserver(recorder, model)
    try:
        switched = semantics.switched_in() if semantics is not None else contextlib.nullcontext()
        quiet_while_muted = SameDtypeKernels(quiet=lambda: recorder.muted)  # DTensor's global-shape ops
        with fake_mode, quiet_while_muted, tracker, recorder, switched as target_notes, \
                storage_resizes_reported(recorder.storage_resized), dtensor_shape_propagation_muted(recorder):
            prepared, parallel, resolved = _steps(source, setup, model, make_batch, loss_fn, ctx, checkpointed,
                                                  recorder, observer)
    except TrainmemError:
        raise
    except Exception as error:  # noqa: BLE001 - the model or a strategy failed: one line, where it failed
        raise recorder.fail(error) from error
    finally:
        recorder.closed = True
        FAKE_TENSOR_LOG.setLevel(fake_log_level)
    parameters, trainable, per_module, trainable_shapes = facts
    owners, leaves = module_sets(model)
    warnings = (list(source.notes) + notes + ctx.notes + parallel.notes + recorder.rules.warnings()
                + (target_notes.summary() if target_notes is not None else []))
    return TraceResult(
        trace=recorder.trace, parameters=parameters, trainable_parameters=trainable, module_parameters=per_module,
        op_counts=recorder.op_counts, warnings=list(dict.fromkeys(warnings)), checkpointed=checkpointed,
        model_name=type(getattr(model, "module", model)).__name__, output_elements=tracker.output_elements,
        parameter_modules=owners, trainable_shapes=trainable_shapes, leaf_modules=leaves,
        buffer_bytes=sum(local.numel() * local.element_size() for b in model.buffers() for local in storage_tensors(b)),
        input_bytes=sum(r.nbytes for r in recorder.trace.storages.values() if r.phase == Phase.INPUTS and r.step == 0),
        code_libraries=code_libraries(model), resolved=resolved,
        parallel_notes=list(dict.fromkeys(ctx.notes + parallel.notes)))


def _materialize(model: Any) -> None:
    """Fake CPU tensors for the meta ones: `to_empty` where a strategy made DTensors (it keeps their layout),
    else the single-process path's materialize_fake (which keeps tied weights tied)."""
    if any(is_wrapper_subclass(t) for t in model.parameters()):
        model.to_empty(device="cpu")
    else:
        materialize_fake(model)


def _steps(source, setup, model, make_batch, loss_fn, ctx, checkpointed, recorder, observer):
    from trainmem.trace.resolved import BatchProbe, resolved_setup

    _materialize(model)
    observer.model = model
    recorder.set_category(recorder.storage_ids_of(list(model.parameters())), Category.PARAMETERS)
    recorder.set_category(recorder.storage_ids_of(list(model.buffers())), Category.BUFFERS)
    recorder.set_owner(dict((n, [t]) for n, t in [*model.named_parameters(), *model.named_buffers()]))
    before = len(recorder.trace.storages)
    built = recorder.storage_ids_of([*model.parameters(), *model.buffers()])
    parallel = observer.parallel = apply_on_fake(model, ctx)
    _label_wrapper_allocations(recorder, parallel, before, built)
    if parallel.host_from_wrap:
        observer.place_host_tensors()
    # FSDP1 freezes before it flattens (fsdp1.py): its flat parameters no longer carry the names --freeze matches
    prepare_setup = dataclasses.replace(setup, freeze=()) if parallel.wraps_parameters else setup
    prepared = training.prepare(parallel.model, make_batch, loss_fn, prepare_setup, source, cuda_semantics=ctx.cuda_semantics,
                                optimizer_factory=parallel.make_optimizer or _grouped_optimizer(ctx.cuda_semantics),
                                checkpointed=checkpointed)
    prepared.autocast = not _fsdp_casts(ctx)
    prepared.make_batch = probe = BatchProbe(prepared.make_batch, recorder)
    (parallel.run_steps or training.run_steps)(prepared, setup, observer)
    if ctx.layout.offload != Offload.NONE:  # the optimizer step runs on the host: its allocations are host RAM
        observer.offload({r.sid for r in recorder.trace.storages.values() if r.phase == Phase.OPTIMIZER})
    from trainmem.trace import finetune

    resolved = resolved_setup(setup, source, probe, make_batch is not None, loss_fn is not None,
                              prepared.optimizer, finetune.lora_used(model))
    return prepared, parallel, resolved


def _label_wrapper_allocations(recorder: TraceRecorder, parallel: Parallelized, before: int, built: set[int]) -> None:
    """What the wrappers allocate when they are built (DDP's Reducer: its gradient buckets) is theirs; FSDP1's
    wrapper makes the parameters themselves (its flat parameters), and on a GPU the model it wrapped was the user's
    host copy."""
    made = {sid for sid in range(before, len(recorder.trace.storages))
            if recorder.trace.storages[sid].category == Category.PARAMETERS}
    if not parallel.wraps_parameters:
        recorder.set_category(made, Category.COMMUNICATION)
    if parallel.built_on_host:
        recorder.trace.host_storages |= built


def _fsdp_casts(ctx: ParallelContext) -> bool:
    """FSDP2 with a MixedPrecisionPolicy casts parameters itself; torchtitan then runs without autocast."""
    from trainmem.setup.layout import Strategy

    sharded = ctx.layout.data_parallel in (Strategy.FSDP, Strategy.HSDP, Strategy.ZERO2, Strategy.ZERO3)
    return sharded and ctx.setup.precision in (Precision.BF16_MIXED, Precision.FP16_MIXED)


class _RankObserver(RecordingObserver):
    """The recording observer, plus what the strategy names after each backward and optimizer step: DDP's
    buckets of that backward (rebuilt between steps, so asked each time) and the tensors in host RAM (gradients
    die at zero_grad, so asked while they live)."""

    parallel: Parallelized | None = None

    def after_backward(self, model: Any) -> None:
        super().after_backward(model)
        if self.parallel is not None and self.parallel.communication_tensors is not None:
            ids = self.recorder.storage_ids_of(self.parallel.communication_tensors())
            self.recorder.set_category(ids, Category.COMMUNICATION)
        self.place_host_tensors()

    def after_optimizer(self, optimizer: Any, scaler: Any) -> None:
        super().after_optimizer(optimizer, scaler)
        self.place_host_tensors()

    def place_host_tensors(self) -> None:
        if self.parallel is not None and self.parallel.host_tensors is not None:
            self.offload(self.recorder.storage_ids_of(self.parallel.host_tensors()))

    def offload(self, sids: set[int]) -> None:
        trace = self.recorder.trace
        trace.offloaded_storages |= sids
        trace.host_storages |= sids


def _grouped_optimizer(cuda_semantics: bool):
    """The setup's optimizer over parameter groups by tensor kind (parallel/optimizer_groups.py: DTensors beside
    plain tensors, or of two meshes, need groups of their own under foreach, as the user's code needs them)."""
    from trainmem.parallel.optimizer_groups import by_tensor_kind

    return lambda params, setup: training.make_optimizer(by_tensor_kind(params), setup, cuda_semantics)
