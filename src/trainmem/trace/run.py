"""Trace a training run on fake tensors: build on meta, materialize fake parameters inside one
FakeTensorMode, run the shared training step, and settle each storage's category.

Building on the meta device and materializing inside one mode avoids the 'Mixing fake modes' failure
of building under FakeTensorMode (modules that deepcopy a layer give each copy its own fake mode).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections import Counter
from typing import Any, Protocol

import torch

from trainmem.errors import TraceError, TrainmemError, one_line
from trainmem.frontends import ModelSource
from trainmem.frontends.libraries import code_libraries, model_libraries
from trainmem.setup import Precision, TrainingSetup
from trainmem.setup.count_limits import batch_overflow
from trainmem.trace import keras_torch_step
from trainmem.trace import cache_store
from trainmem.trace.autocast_cache import cast_cache_freed_in_order
from trainmem.trace.cache_codec import NotCacheable
from trainmem.trace.cache_store import CacheUse
from trainmem.trace import step as training
from trainmem.trace.compiled import NOTE as COMPILED_NOTE, check_traceable, compiled_on_fake
from trainmem.trace.dtype_checks import SameDtypeKernels
from trainmem.trace.events import Category, Phase
from trainmem.trace.fake_cache import tracing_fake_mode
from trainmem.trace.meta_build import building_on_meta
from trainmem.trace.modules import ModuleTracker
from trainmem.trace.packed_sequences import PaddedUnpacking
from trainmem.trace.rng_state import checkpoint_rng_states
from trainmem.trace.recorder import TraceRecorder
from trainmem.trace.torch_private import FAKE_TENSOR_LOG, module_tensor_tables
from trainmem.trace.traced import TraceResult


class TraceNotes(Protocol):
    def summary(self) -> list[str]: ...


class TraceSemantics(Protocol):
    """What a target switches into the trace beyond the CPU's own kernels (the CUDA target: its autocast
    lists, attention backend and dropout; trace/cuda_composites.py CudaFacts)."""

    cuda_semantics: bool  # trace.step.prepare: CUDA's optimizer default and autocast regions

    def switched_in(self) -> contextlib.AbstractContextManager[TraceNotes]:
        """Entered around the trace; what it yields says, after the trace, what it chose."""
        ...


def materialize_fake(model: torch.nn.Module, float_dtype: torch.dtype | None = None) -> None:
    """Replace meta parameters and buffers with fake CPU ones; shared (tied) tensors stay shared.
    With `float_dtype` (pure bf16 training) floating tensors are made in that dtype directly: a later
    `model.to()` would try to swap fake tensors in place, which fails for tied weights. A module's `keeps_dtype`
    names the tensors no cast reaches in the real run (trace/finetune.py NF4Linear's quantization statistics)."""
    replaced: dict[int, torch.Tensor] = {}
    for module in model.modules():
        kept = getattr(module, "keeps_dtype", ())
        for table in module_tensor_tables(module):
            for name, tensor in table.items():
                if tensor is None:
                    continue
                if id(tensor) not in replaced:
                    cast = float_dtype is not None and tensor.is_floating_point() and name not in kept
                    dtype = float_dtype if cast else tensor.dtype
                    new = torch.empty_like(tensor, device="cpu", dtype=dtype)
                    if isinstance(tensor, torch.nn.Parameter):
                        new = torch.nn.Parameter(new, requires_grad=tensor.requires_grad)
                    replaced[id(tensor)] = new
                table[name] = replaced[id(tensor)]


class RecordingObserver(training.Observer):
    def __init__(self, recorder: TraceRecorder, model: torch.nn.Module) -> None:
        self.recorder = recorder
        self.forward_start = 0
        self.model = model  # its parameters are replaced by materialize_fake: look them up when needed

    def phase(self, phase: Phase, step: int) -> None:
        rec = self.recorder
        if phase == Phase.FORWARD:
            self.forward_start = len(rec.trace.events)
        if phase == Phase.BACKWARD:
            demoted = rec.settle_forward(self.forward_start)
            if self.marking:  # the lean loop: what it made temporaries by dropping them (trace/loop_twin.py)
                self.loop_mark("settled", sids=demoted)
        rec.phase, rec.step = phase, step

    marking = False  # set by the lean loop's first mark

    def loop_mark(self, kind: str, tensors: Any = None, sids: Any = None) -> None:
        """The lean loop's marks (trace/loops.py lean_loop): kind, where in the events, the recorder's labels
        there, and the storages a dropped name held."""
        if kind == "lean":
            self.marking = True
        if not self.marking:
            return
        rec = self.recorder
        counted = Counter(rec.op_counts)  # asking fake tensors for their storages dispatches prim.device: not the loop's
        leaves = _tensor_leaves_of(tensors) if sids is None else []
        if leaves is None:  # too much to walk: the inline loop is traced, not derived (loop_twin.py)
            kind = "incomplete"
        held = sorted(sids if sids is not None else rec.storage_ids_of(leaves or []))
        rec.op_counts.clear()
        rec.op_counts.update(counted)
        if kind in ("lean", "stepped"):
            self._counts = Counter(rec.op_counts)
        elif kind in ("zero_grad probed", "end"):  # the ops since: a zero_grad's, as [op, count] pairs
            delta = Counter(rec.op_counts)
            delta.subtract(self._counts)
            held = sorted([op, n] for op, n in delta.items() if n)
            if kind == "zero_grad probed":  # the probe is not part of the lean loop's own run
                rec.op_counts.subtract(delta)
                for op in [op for op, n in rec.op_counts.items() if not n]:
                    del rec.op_counts[op]
        rec.trace.loop_marks.append([kind, len(rec.trace.events), str(rec.phase), rec.modules.current(), rec.step,
                                     held])

    def after_backward(self, model: torch.nn.Module) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        self.recorder.set_category(self.recorder.storage_ids_of(grads), Category.GRADIENTS)
        if keras_torch_step.is_keras_model(model):
            self.recorder.set_owner(keras_torch_step.gradient_owners(model))
            return
        self.recorder.set_owner({name: [p.grad] for name, p in model.named_parameters() if p.grad is not None})

    def after_keras_optimizer(self, optimizer: Any) -> None:
        slots, scalars, owners = keras_torch_step.optimizer_tensors(optimizer)
        self.recorder.set_category(self.recorder.storage_ids_of(slots), Category.OPTIMIZER_STATE)
        self.recorder.set_category(self.recorder.storage_ids_of(scalars), Category.OPTIMIZER_SCALARS)
        self.recorder.set_owner(owners)

    def after_optimizer(self, optimizer: torch.optim.Optimizer, scaler: Any) -> None:
        names = {id(p): name for name, p in self.model.named_parameters()}
        self.recorder.set_owner({names[id(p)]: [t for t in state.values() if isinstance(t, torch.Tensor)]
                                 for p, state in optimizer.state.items() if id(p) in names})
        state = [t for per_param in optimizer.state.values() for t in per_param.values()
                 if isinstance(t, torch.Tensor)]
        if scaler is not None:
            state += [getattr(scaler, "_scale", None), getattr(scaler, "_growth_tracker", None)]
        buffers = [t for t in state if isinstance(t, torch.Tensor) and t.dim() > 0]
        scalars = [t for t in state if isinstance(t, torch.Tensor) and t.dim() == 0]
        self.recorder.set_category(self.recorder.storage_ids_of(buffers), Category.OPTIMIZER_STATE)
        self.recorder.set_category(self.recorder.storage_ids_of(scalars), Category.OPTIMIZER_SCALARS)
        paged = getattr(optimizer, "paged_tensors", None)
        if paged:
            self.recorder.trace.managed_storages |= set(self.recorder.storage_ids_of(paged))
        # torch/optim/adam.py _init_group (likewise adamw, adagrad, rmsprop): `step` is a CPU tensor
        # unless the optimizer is fused or capturable, so a CUDA run keeps it in host memory
        if not any(group.get("fused") or group.get("capturable") for group in optimizer.param_groups):
            steps = [state["step"] for state in optimizer.state.values() if isinstance(state.get("step"), torch.Tensor)]
            self.recorder.trace.host_storages |= set(self.recorder.storage_ids_of(steps))


def _tensor_leaves_of(value: Any, limit: int = 100_000) -> list[torch.Tensor] | None:
    """The tensors a loop's name keeps alive: every tensor reachable from what it holds through Python references
    (a batch's dicts and tuples; a model's output, with what it carries, as a ModelOutput's key/value cache objects),
    not through modules, classes or functions, nor into a tensor's own attributes. None past `limit` objects: a walk
    cut short could miss a tensor, and the derived trace would free it too early."""
    import gc
    import types

    found, seen, queue = [], set(), [value]
    while queue and len(seen) < limit:
        item = queue.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif not isinstance(item, (torch.nn.Module, type, types.ModuleType, types.FunctionType, types.MethodType,
                                   str, bytes, int, float)):
            queue.extend(gc.get_referents(item))
    return None if queue else found


def traced_model_facts(model: torch.nn.Module) -> tuple[int, int, dict[str, int], list[tuple[int, ...]]]:
    """Parameter counts as the model's authors count them: a 4-bit packed weight counts the values it
    holds, not its uint8 storage elements (finetune.quantized_facts)."""
    from trainmem.trace.finetune import quantized_facts

    packed = quantized_facts(model)
    count = lambda p: packed.get(id(p), p.numel())  # noqa: E731
    unique = {id(p): p for p in model.parameters()}.values()
    per_module: dict[str, int] = {}
    owned: set[int] = set()  # a tied parameter belongs to the first module that holds it
    for name, module in model.named_modules():
        mine = [p for p in module.parameters(recurse=False) if id(p) not in owned]
        owned.update(id(p) for p in mine)
        per_module[name] = sum(count(p) for p in mine)
    return (sum(count(p) for p in unique), sum(p.numel() for p in unique if p.requires_grad), per_module,
            [tuple(p.shape) for p in unique if p.requires_grad])


def _failure(recorder: TraceRecorder, error: Exception, setup: TrainingSetup, model: torch.nn.Module,
             made_from_inputs: bool) -> TrainmemError:
    """The one line for a training step that failed: a batch too large for int64 sizes blames --batch-size, a
    forward on a batch made from --input-shape blames the inputs, anything else names the module."""
    failure = recorder.fail(error)
    overflow = batch_overflow(error, setup.batch_size, f"module {failure.where}'s {recorder.phase}")
    if overflow is not None:
        return overflow
    # torch's own checks of shapes and dtypes raise RuntimeError; anything else is the model's code
    if recorder.phase == Phase.FORWARD and made_from_inputs and setup.inputs and isinstance(error, RuntimeError):
        return _forward_failed_on_inputs(failure, error, setup, model)
    return failure


def _forward_failed_on_inputs(failure: TraceError, error: Exception, setup: TrainingSetup,
                              model: torch.nn.Module) -> TraceError:
    """The forward failed on a batch made from the user's input shapes and dtypes (no make_batch of the
    model's own): the likeliest cause is an input the model cannot take, so the error names the flag
    that made the batch, with the module and torch's message as the evidence."""
    shapes = " ".join(f"--input-shape {','.join(map(str, spec.shape))}" for spec in setup.inputs)
    dtypes = [spec.dtype for spec in setup.inputs]
    given_dtype = any(dtype != "float32" for dtype in dtypes)
    made_from = shapes + (f" --input-dtype {','.join(dtypes)}" if given_dtype else "")
    module = failure.where if failure.where != "model" else ""
    try:
        kind = type(model.get_submodule(module)).__name__
    except AttributeError:
        kind = ""
    in_module = f"module {module or 'model'}" + (f" ({kind})" if kind else "")
    about_dtypes = given_dtype and "type" in str(error).lower()
    return TraceError(f"expected an input the model can take, got {made_from}: its forward failed in {in_module} "
                      f"with {type(error).__name__}: {one_line(error)}",
                      where="--input-dtype" if about_dtypes else "--input-shape")


def _torch_steps(model: torch.nn.Module, make_batch: Any, loss_fn: Any, setup: TrainingSetup, source: ModelSource,
                 semantics: TraceSemantics | None, recorder: TraceRecorder, observer: RecordingObserver):
    """A torch model's steps, inside the fake mode and recorder: fake parameters, torch.optim, the loop."""
    from trainmem.trace import finetune
    from trainmem.trace.checkpoint_load import load_checkpoint
    from trainmem.trace.resolved import BatchProbe, resolved_setup

    materialize_fake(model, torch.bfloat16 if setup.precision == Precision.BF16 else None)
    prepared = training.prepare(model, make_batch, loss_fn, setup, source,
                                cuda_semantics=semantics is not None and semantics.cuda_semantics)
    prepared.make_batch = probe = BatchProbe(prepared.make_batch, recorder)
    recorder.set_category(recorder.storage_ids_of(list(model.parameters())), Category.PARAMETERS)
    recorder.set_category(recorder.storage_ids_of(list(model.buffers())), Category.BUFFERS)
    recorder.set_owner(dict((n, [t]) for n, t in [*model.named_parameters(), *model.named_buffers()]))
    recorder.rules.sequence_lengths = setup.seq_lengths
    load_checkpoint(prepared, setup, recorder)  # --load: phase "load", before the first step
    with compiled_on_fake() if setup.compile else contextlib.nullcontext():
        training.run_steps(prepared, setup, observer)
    facts = traced_model_facts(model)
    resolved = resolved_setup(setup, source, probe, make_batch is not None, loss_fn is not None,
                              prepared.optimizer, finetune.lora_used(model))
    counts = {"quantized_parameters": sum(finetune.quantized_facts(model).values()),
              "adapter_parameters": finetune.adapter_parameters(model),
              "quantized_storage_bytes": finetune.quantized_storage_bytes(model), "libraries": model_libraries(model),
              "code_libraries": code_libraries(model)}
    return prepared, facts, resolved, counts


def trace_training(source: ModelSource, setup: TrainingSetup, kernel_ops: frozenset[str] = frozenset(),
                   semantics: TraceSemantics | None = None) -> TraceResult:
    """Trace two training steps, recording the calls of `kernel_ops` for the target's kernel rules. With
    `semantics` (the target's), the trace follows what that device's run does differently; for CUDA
    (autocast lists, attention backend, optimizer default) see trace/cuda_autocast.py, cuda_composites.py."""
    from trainmem.trace import early_key, finetune

    known = early_key.trace_key(source, setup, kernel_ops, semantics)  # a run traced before: no build (early_key.py)
    if (hit := cache_store.lookup(known) if known is not None else None) is not None:
        return dataclasses.replace(hit[0], cache_use=hit[1])
    with building_on_meta():
        model, make_batch, loss_fn = training.unpack_built(source.build(), source)
        keras = keras_torch_step.is_keras_model(model)  # Keras's own train_step and optimizer
        model, finetune_notes = (model, []) if keras else finetune.apply(model, setup)
    if setup.compile:
        check_traceable(setup, semantics is not None and semantics.cuda_semantics)
        finetune_notes.append(COMPILED_NOTE)
    key, use = _cache_key(model, make_batch, loss_fn, source, setup, kernel_ops, semantics, keras)
    hit = cache_store.lookup(key) if key is not None else None
    if hit is not None:  # the same run traced before (trace/cache_store.py): its trace, not a second one
        traced, use = hit
    else:
        traced = _by_blocks(model, make_batch, loss_fn, source, setup, kernel_ops, semantics, finetune_notes) \
            if not keras else None
        if traced is None:
            traced = _traced(model, make_batch, loss_fn, source, setup, kernel_ops, semantics, keras, finetune_notes)
        use = cache_store.store(key, traced) if key is not None else use
    if use is not None and use.used in ("reused", "stored"):
        early_key.remember(source, setup, kernel_ops, semantics, key)
    return dataclasses.replace(traced, cache_use=use)


def _by_blocks(model: torch.nn.Module, make_batch: Any, loss_fn: Any, source: ModelSource, setup: TrainingSetup,
               kernel_ops: frozenset[str], semantics: TraceSemantics | None,
               finetune_notes: list[str]) -> TraceResult | None:
    """The trace composed from a few of the model's repeated blocks (trace/block_reuse.py), with the whole model's
    own facts; None to trace it whole (a note says why, when it has such blocks)."""
    from trainmem.trace.block_reuse import traced_by_blocks

    reuse = traced_by_blocks(model, setup, lambda variant: _traced(variant, make_batch, loss_fn, source, setup,
                                                                    kernel_ops, semantics, False, finetune_notes))
    if reuse.traced is None:
        finetune_notes.extend([reuse.note] if reuse.note else [])
        return None
    return dataclasses.replace(reuse.traced, **_whole_model_facts(model))


def _whole_model_facts(model: torch.nn.Module) -> dict[str, Any]:
    """What a composed trace takes from the whole model (on meta) rather than from the variant it was traced as.
    Not its buffers: counted on meta, a buffer that materializing ties to another counts twice (Llama's rotary
    frequencies), so they are the traced variants' extrapolated (block_reuse.py)."""
    from trainmem.trace import finetune

    parameters, trainable, per_module, trainable_shapes = traced_model_facts(model)
    owners, leaves = module_sets(model)
    return {"parameters": parameters, "trainable_parameters": trainable, "module_parameters": per_module,
            "trainable_shapes": trainable_shapes, "parameter_modules": owners, "leaf_modules": leaves,
            "adapter_parameters": finetune.adapter_parameters(model),
            "quantized_storage_bytes": finetune.quantized_storage_bytes(model), "libraries": model_libraries(model),
            "code_libraries": code_libraries(model)}


def module_sets(model: torch.nn.Module) -> tuple[set[str], set[str]]:
    """(modules that own parameters, modules without children)."""
    owners = {name for name, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))}
    leaves = {name for name, m in model.named_modules() if not any(True for _ in m.children())}
    return owners, leaves


def _cache_key(model: torch.nn.Module, make_batch: Any, loss_fn: Any, source: ModelSource, setup: TrainingSetup,
               kernel_ops: frozenset[str], semantics: Any, keras: bool) -> tuple[str | None, CacheUse | None]:
    """The run's key in the trace cache, or None and why not (off, a Keras model, a model it cannot describe)."""
    if not cache_store.enabled():
        return None, CacheUse("off")
    if keras:
        return None, CacheUse("not cached", "a Keras model's step is traced each time")
    from trainmem.trace.cache_key import trace_key

    try:
        return trace_key(model, make_batch, loss_fn, source, setup, kernel_ops, semantics), None
    except NotCacheable as why:
        return None, CacheUse("not cached", str(why))


def _traced(model: torch.nn.Module, make_batch: Any, loss_fn: Any, source: ModelSource, setup: TrainingSetup,
            kernel_ops: frozenset[str], semantics: TraceSemantics | None, keras: bool,
            finetune_notes: list[str]) -> TraceResult:
    """The two traced steps of a model built on meta: fake parameters, the recorder, the loop."""
    fake_mode = tracing_fake_mode()  # its dispatch cache serves only outputs a hit rebuilds the same (fake_cache.py)
    # FakeTensorMode logs every failed meta kernel at ERROR level; we report failures ourselves
    fake_log_level, FAKE_TENSOR_LOG.level = FAKE_TENSOR_LOG.level, logging.CRITICAL
    layers = keras_torch_step.named_layers(model) if keras else None  # Keras layers by path, for the tracker
    tracker = ModuleTracker(layers if keras else model)
    recorder = TraceRecorder(tracker, kernel_ops)
    observer = RecordingObserver(recorder, model)
    try:
        switched = semantics.switched_in() if semantics is not None else contextlib.nullcontext()
        # SameDtypeKernels sits right above fake_mode, so it sees each op as its kernel would (dtype_checks.py)
        with fake_mode, SameDtypeKernels(), tracker, recorder, checkpoint_rng_states(recorder), \
                cast_cache_freed_in_order(recorder), PaddedUnpacking(recorder), switched as notes:
            if keras:
                prepared = keras_torch_step.trace_run(model, setup, source, recorder, observer, layers)
                facts = keras_torch_step.model_facts(model)
                resolved = keras_torch_step.resolved_setup(setup, source, prepared)
                counts = {}
            else:
                prepared, facts, resolved, counts = _torch_steps(model, make_batch, loss_fn, setup, source,
                                                                 semantics, recorder, observer)
    except TrainmemError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's model failed: one line, where it failed
        raise _failure(recorder, error, setup, model, made_from_inputs=make_batch is None) from error
    finally:
        recorder.closed = True
        FAKE_TENSOR_LOG.setLevel(fake_log_level)
    parameters, trainable, per_module, trainable_shapes = facts
    if keras:
        owners, leaves = keras_torch_step.layer_sets(model, per_module)
    else:
        owners, leaves = module_sets(model)
    return TraceResult(
        trace=recorder.trace, parameters=parameters, trainable_parameters=trainable, module_parameters=per_module,
        op_counts=recorder.op_counts,
        warnings=(list(source.notes) + finetune_notes + recorder.rules.warnings()
                  + (notes.summary() if notes is not None else [])),
        checkpointed=prepared.checkpointed, model_name=type(model).__name__,
        output_elements=tracker.output_elements, parameter_modules=owners, trainable_shapes=trainable_shapes,
        leaf_modules=leaves,
        buffer_bytes=(keras_torch_step.non_trainable_bytes(model) if keras
                      else sum(b.numel() * b.element_size() for b in model.buffers())),
        input_bytes=sum(r.nbytes for r in recorder.trace.storages.values() if r.phase == Phase.INPUTS and r.step == 0),
        resolved=resolved, **counts)
