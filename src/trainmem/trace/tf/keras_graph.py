"""Trace the step Keras's `model.fit` runs on TensorFlow, from shapes alone, without allocating a weight.

The model is built inside a fresh tf.Graph: its variables are graph variables (VarHandleOp + an
initializer that never runs), so no weight memory is allocated. There `model.train_step((x, y))` on
placeholders builds the same ops as fit's step (keras/src/backend/tensorflow/trainer.py train_step:
forward under GradientTape, compute_loss, loss tracker, tape.gradient, optimizer.apply_gradients).
Only the ops made by that call are the step. trace/tf/lifetimes.py then replays them as TensorFlow's
executor holds tensors.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

from trainmem.errors import ModelRefError, TraceError, TrainmemError, one_line
from trainmem.setup import Loss, TrainingSetup
from trainmem.setup.count_limits import batch_overflow
from trainmem.trace.tf import fit_setup
from trainmem.trace.events import Category, Phase
from trainmem.trace.tf.attribution import LayerHooks, layer_rows, variables_of
from trainmem.trace.tf.keras_facts import KerasFacts
from trainmem.trace.tf.extract import gradient_owner, graph_ops, scope_owners, tensor_info
from trainmem.trace.tf.while_loops import LOOP_OPS, function_ops, loop_sizes
from trainmem.trace.tf.grappler import optimized_step, stateful
from trainmem.trace.tf.lifetimes import ready_order, replay, tensor_peak
from trainmem.trace.tf.ops import StepGraph
from trainmem.trace.tf.private import flatten_layers
from trainmem.trace.traced import TraceResult

ORDER = ("the ops in the order the step's graph was built (forward, loss, gradients from the loss back, "
         "optimizer updates layer by layer): a topological order TensorFlow's executor may follow; the "
         "executor runs ready ops as their inputs complete, cheap ones inline, expensive ones on its "
         "inter-op threads (executor.cc ExecutorState::ScheduleReady), so branches that are independent may "
         "interleave differently in a real run")


READY_ORDER = ("each op as soon as its inputs are ready, first ready first (executor.cc ExecutorState::"
               "ScheduleReady): variable reads and the previous slots' optimizer ops early, branches in turns; "
               "chosen because it holds more tensors at its peak than the creation order of the step's graph "
               "(forward, loss, gradients, optimizer); the real executor's threads run between the two")


def trace_keras(build: Callable[[], Any], setup: TrainingSetup, *, name: str, grappler: bool = True) -> TraceResult:
    """Trace one Keras model's fit step; `build` is called inside a fresh tf.Graph and returns the model.
    With `grappler` the replayed graph is the one Grappler makes of the step for the CPU (trace/tf/grappler.py)."""
    from trainmem.frontends.keras.imports import import_keras, import_tensorflow

    fit_setup.check_supported(setup)
    keras = import_keras("tensorflow", where=name)
    tf = import_tensorflow(where=name)
    graph = tf.Graph()
    try:
        with graph.as_default(), fit_setup.dtype_policy(keras, setup.precision):
            model = _build(build, keras, name)
            ops, hooks, inputs, outputs = _build_step(model, keras, tf, graph, setup)
        labels = _labels(ops, hooks)
        shapes = {op.name: tuple(tensor_info(t) for t in op.outputs) for op in ops}
        # loops sized on the graph Keras built, where the body's shapes are all static
        shapes.update({("loop", op.name): loop_sizes(tf, graph, op) for op in ops if op.type in LOOP_OPS})
        runtime, notes = graph, []
        if grappler:
            optimized = optimized_step(tf, graph, ops, [op for op in ops if stateful(op)] + outputs)
            if isinstance(optimized, str):
                notes.append(f"Grappler could not optimize the step ({optimized}); the unoptimized graph is "
                             "traced, without the remapper's fusions and the pruned IdentityN")
            else:
                runtime, ops = optimized
        step_graph = _step_graph(model, ops, labels, hooks, inputs, tf, runtime, shapes)
        in_functions = function_ops(runtime.as_graph_def().library, ops)
    except TrainmemError:
        raise
    except Exception as error:  # noqa: BLE001 - the model's code failed while its step was built
        raise batch_overflow(error, setup.batch_size, "the Keras step's graph") or TraceError(
            f"expected a Keras model whose fit step can be built, got {type(error).__name__}: {one_line(error)}",
            where=name) from error
    result, order = _replay_higher(step_graph, setup.steps)
    traced = _traced(model, step_graph, hooks, result, notes, setup, keras)
    facts = dataclasses.replace(traced.framework, order=order, function_ops=in_functions,
                                runtime_graph="grappler" if grappler and not notes else "unoptimized")
    return dataclasses.replace(traced, framework=facts)


def _replay_higher(step_graph: StepGraph, steps: int) -> tuple[Any, str]:
    """The replay in creation order or in ready order (lifetimes.ready_order), whichever holds more
    tensors at its peak: the executor's order lies between the two and changes with its threads, and an
    estimate must not be low (creation order alone missed 12.8 MB on embedding_bag, tf_tensor_peak.md)."""
    created = replay(step_graph, steps=steps)
    ready = replay(dataclasses.replace(step_graph, ops=ready_order(step_graph.ops, set(step_graph.variables))), steps=steps)
    if tensor_peak(ready.trace) > tensor_peak(created.trace):
        return ready, READY_ORDER
    return created, ORDER


def _build(build: Callable[[], Any], keras: Any, name: str) -> Any:
    model = build()
    if not isinstance(model, keras.Model):
        raise ModelRefError(f"expected a Keras Model, got {type(model).__name__}", where=name)
    return model


def _build_step(model: Any, keras: Any, tf: Any, graph: Any, setup: TrainingSetup) -> tuple[list, LayerHooks, dict, list]:
    """The step's ops in creation order, the hooks that watched them being made, the batch's
    placeholders and the ops whose outputs the step returns."""
    loss, loss_kind = fit_setup.make_loss(keras, setup, model)
    model.compile(optimizer=fit_setup.make_optimizer(keras, setup), loss=loss, jit_compile=False)
    _freeze(model, setup.freeze)
    model.optimizer.build(model.trainable_variables)
    spec = fit_setup.batch_spec(setup, model, _output_shape(model, setup, tf), loss_kind)
    xs = [tf.compat.v1.placeholder(dtype, shape, name=f"x{i}") for i, (shape, dtype) in enumerate(zip(spec.shapes, spec.dtypes))]
    y = tf.compat.v1.placeholder(spec.target_dtype, spec.target_shape, name="y") if spec.target_shape is not None else None
    start = len(graph.get_operations())
    hooks = LayerHooks(model, graph)
    with hooks:
        logs = model.train_step((xs[0] if len(xs) == 1 else xs, y))
    ops = graph.get_operations()[start:]
    inputs = {t.op.name: tensor_info(t) for t in xs + ([y] if y is not None else [])}
    outputs = [t.op for t in tf.nest.flatten(logs) if hasattr(t, "op")]
    return ops, hooks, inputs, outputs


def _labels(ops: list, hooks: LayerHooks) -> tuple[dict[str, Phase], dict[str, str]]:
    """Phase and layer of each op of the step, by name (Grappler keeps the names of the ops it keeps and
    gives a fused op the name of the last op it fuses)."""
    modules = hooks.modules_by_index(len(ops))
    phases = hooks.phases_by_index(ops)
    forward = [(op.name, modules[i]) for i, op in enumerate(ops) if phases[i] == Phase.FORWARD and modules[i]]
    owners = scope_owners(forward)
    module_by = {}
    for index, op in enumerate(ops):
        module_by[op.name] = gradient_owner(op.name, owners) if phases[index] == Phase.BACKWARD else modules[index]
    return {op.name: phases[i] for i, op in enumerate(ops)}, module_by


def _output_shape(model: Any, setup: TrainingSetup, tf: Any) -> tuple:
    """The model's output shape for this batch, from one call on placeholders made before the step (its
    ops are not part of the step)."""
    spec = fit_setup.batch_spec(setup, model, (), Loss.SUM)  # x alone: the sum loss needs no target
    xs = [tf.compat.v1.placeholder(dtype, shape) for shape, dtype in zip(spec.shapes, spec.dtypes)]
    out = model(xs[0] if len(xs) == 1 else xs, training=False)
    first = out[0] if isinstance(out, (list, tuple)) else (next(iter(out.values())) if isinstance(out, dict) else out)
    return tuple(first.shape.as_list())


def _freeze(model: Any, patterns: tuple[str, ...]) -> None:
    import fnmatch

    from trainmem.errors import SetupError

    for pattern in patterns:
        layers = [layer for layer in flatten_layers(model, include_self=False) if fnmatch.fnmatchcase(layer.name, pattern)]
        if not layers:
            raise SetupError(f"expected --freeze {pattern!r} to match Keras layer names such as "
                             f"{', '.join(l.name for l in model.layers[:4])}, it matched none", where="--freeze")
        for layer in layers:
            layer.trainable = False


def _sized(tf: Any, graph: Any, op: Any, before: tuple | None = None) -> tuple[tuple, int] | None:
    """Outputs a shape does not size: while loops' TensorLists (trace/tf/while_loops.py) and the list a tensor is
    split into (TensorListFromTensor: one element per leading index, the tensor's bytes in all)."""
    if op.type in LOOP_OPS:
        if before is not None and len(before[0]) == len(op.outputs):
            return before
        return loop_sizes(tf, graph, op)
    if op.type == "TensorListFromTensor":
        source = tensor_info(op.inputs[0])
        return ((source.nbytes if source.known else None),), 0
    if op.type in ("TensorListReserve", "EmptyTensorList"):
        return (0,), 0  # empty until elements are set; the elements are counted where they are made
    return None


def _step_graph(model: Any, ops: list, labels: tuple[dict, dict], hooks: LayerHooks, inputs: dict, tf: Any,
                graph: Any, shapes: dict) -> StepGraph:
    phase_by, module_by = labels

    def inherited(op: Any, table: dict, default: Any) -> Any:
        """An op Grappler made takes the label of its last labelled input."""
        for tensor in reversed(list(op.inputs)):
            if tensor.op.name in table:
                return table[tensor.op.name]
        return default

    records = graph_ops(ops, lambda i, op: phase_by.get(op.name) or inherited(op, phase_by, Phase.OPTIMIZER),
                        lambda i, op: module_by[op.name] if op.name in module_by else inherited(op, module_by, ""),
                        lambda op: _sized(tf, graph, op, shapes.get(("loop", op.name))))
    records = [_known_shapes(record, shapes.get(record.name)) for record in records]  # type: ignore[arg-type]
    constants = {op.name: tensor_info(op.outputs[0]) for op in ops if op.type == "Const"}
    variables = variables_of(model, ops)
    step = StepGraph(records, variables, inputs, constants, gradients=set(hooks.gradients))
    known = {r.name for r in records} | set(variables) | set(inputs)
    step.external = {ref[0] for r in records for ref in r.inputs if ref[0] not in known}
    return step


def _known_shapes(record: Any, before: tuple | None) -> Any:
    """An output Grappler's graph lost the static shape of (a Fill fed by VariableShape) takes the shape
    the same op had when Keras built it."""
    if before is None or len(before) != len(record.outputs) or all(o.known for o in record.outputs):
        return record
    outputs = tuple(o if o.known or not b.known or b.dtype != o.dtype else b for o, b in zip(record.outputs, before))
    return dataclasses.replace(record, outputs=outputs)


def _traced(model: Any, step: StepGraph, hooks: LayerHooks, result: Any, warnings: list[str],
            setup: TrainingSetup, keras: Any) -> TraceResult:
    trace = result.trace
    counts: dict[str, int] = {}
    for op in step.ops:
        counts[op.type] = counts.get(op.type, 0) + 1
    notes = list(warnings)
    if result.unsupported:
        notes.append("TensorFlow ops without a memory rule, traced by their outputs' sizes: "
                     + ", ".join(f"{k} ×{v}" for k, v in sorted(result.unsupported.items())))
    if result.unknown_sizes:
        notes.append("op outputs of unknown size counted as 0 bytes: "
                     + ", ".join(f"{k} ×{v}" for k, v in sorted(result.unknown_sizes.items())))
    slot_bytes = sum(v.nbytes for v in step.variables.values()
                     if v.category in (Category.OPTIMIZER_STATE, Category.OPTIMIZER_SCALARS))
    trainable = sum(int(_numel(w)) for w in model.trainable_weights)
    first_inputs = sum(r.nbytes for r in trace.storages.values() if r.phase == Phase.INPUTS and r.step == 0)
    buffers = sum(v.nbytes for v in step.variables.values() if v.category == Category.BUFFERS)
    layers = layer_rows(model, hooks, trace)
    facts = KerasFacts(optimizer_slot_bytes=slot_bytes, layers=layers, unsupported_ops=dict(result.unsupported),
                       order=ORDER, jit_compile_on_gpu=_jit_on_gpu(model))
    # the torch-shaped facts (module outputs, leaf modules, trainable shapes) are the torch report's: a Keras
    # model's layers and their weights are in `facts.layers`
    return TraceResult(
        trace=trace, parameters=int(model.count_params()), trainable_parameters=trainable,
        module_parameters={row.name: row.parameters for row in layers}, op_counts=Counter(counts), warnings=notes,
        checkpointed=[], model_name=model.name, output_elements={}, parameter_modules=set(), trainable_shapes=[],
        leaf_modules=set(), buffer_bytes=buffers, input_bytes=first_inputs, framework=facts)


def _numel(weight: Any) -> int:
    count = 1
    for d in weight.shape:
        count *= int(d)
    return count


def _jit_on_gpu(model: Any) -> bool:
    """Keras's jit_compile="auto" on a machine with a GPU: XLA when every layer supports it
    (keras/src/trainers/trainer.py _resolve_auto_jit_compile, model_supports_jit)."""
    try:
        return all(layer.supports_jit for layer in flatten_layers(model))
    except AttributeError:
        return False

