"""The training step of Keras 3 on the torch backend, as `model.fit` runs it, for the trace and real run alike.

On the torch backend a Keras layer is a torch.nn.Module (keras/src/backend/torch/layer.py TorchLayer) and
each Keras variable holds a torch.nn.Parameter (backend/torch/core.py Variable._initialize), so the torch
engine's recorder sees every op of Keras's own step: TorchTrainer.train_step (backend/torch/trainer.py)
runs the forward with training=True, `self.zero_grad()` (torch's set_to_none, *after* the forward: the
previous step's gradients live through it), compute_loss, the loss tracker's update, `loss.backward()`,
then the Keras optimizer's `apply` under no_grad (backend/torch/optimizers/torch_adam.py and siblings:
torch._foreach_* over the variables' values). Nothing of torch.optim is used.

fit (TorchTrainer.fit) builds the optimizer's variables before the first step (Trainer._symbolic_build)
and loops `for begin, end, data in epoch_iterator: logs = self.train_function(data)`: the next batch is
made while `data` still holds the previous one, and `logs` (the metric results) is rebound after the next
step returns. `run_steps` is that loop; the phases the recorder labels events with are announced from
thin wrappers around the model's zero_grad, the optimizer's scale_loss (called just before backward) and
apply, put on the instances only while the steps run.

No keras import at module import: a model is recognised by the keras module already imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from typing import Any

import torch

from trainmem.errors import SetupError
from trainmem.setup import Loss, Optimizer, OptimizerImpl, Precision, TrainingSetup, ZeroGrad
from trainmem.trace.events import Phase


def _private() -> Any:
    """Keras's private APIs (trace/tf/private.py), imported when a Keras model is traced, never by a PyTorch one."""
    from trainmem.trace.tf import private
    return private


def is_keras_model(model: Any) -> bool:
    """A Keras model on the torch backend (Keras imported already: a model cannot exist otherwise)."""
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(model, keras.Model) and isinstance(model, torch.nn.Module)


# setup.py's optimizer → the Keras optimizer with trainmem's learning rates (trace/step.py make_optimizer);
# the rest are Keras's defaults (keras/src/optimizers/*.py), which decide no memory.
def keras_optimizer(setup: TrainingSetup) -> Any:
    from trainmem.frontends.keras.imports import import_keras

    keras = import_keras("torch")
    opt = keras.optimizers
    table = {
        Optimizer.SGD: (opt.SGD, {"learning_rate": 0.01}),
        Optimizer.MOMENTUM: (opt.SGD, {"learning_rate": 0.01, "momentum": 0.9}),
        Optimizer.ADAM: (opt.Adam, {"learning_rate": 1e-3}),
        Optimizer.ADAMW: (opt.AdamW, {"learning_rate": 1e-3}),
        Optimizer.RMSPROP: (opt.RMSprop, {"learning_rate": 1e-3}),
        Optimizer.ADAGRAD: (opt.Adagrad, {"learning_rate": 0.01}),
        Optimizer.ADAFACTOR: (opt.Adafactor, {"learning_rate": 0.01}),
        Optimizer.LION: (opt.Lion, {"learning_rate": 1e-4}),
    }
    if setup.optimizer not in table:
        raise SetupError(f"expected an optimizer Keras has ({', '.join(table)}), got {setup.optimizer}",
                         where="--optimizer")
    kind, kwargs = table[setup.optimizer]
    if setup.max_grad_norm is not None:  # clip_grad_norm_'s counterpart: one norm over all gradients
        kwargs = {**kwargs, "global_clipnorm": float(setup.max_grad_norm)}
    return kind(**kwargs)


def keras_loss(setup: TrainingSetup, default: Loss | None) -> Any:
    """cross-entropy → SparseCategoricalCrossentropy(from_logits=True) (integer class ids, as the torch
    step's F.cross_entropy takes), mse → MeanSquaredError."""
    from trainmem.frontends.keras.imports import import_keras

    keras = import_keras("torch")
    loss = setup.loss or default or Loss.CROSS_ENTROPY
    if loss == Loss.CROSS_ENTROPY:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if loss == Loss.MSE:
        return keras.losses.MeanSquaredError()
    raise SetupError(f"expected --loss cross-entropy or mse for a Keras model, got {loss}", where="--loss")


def check_setup(setup: TrainingSetup) -> None:
    """What `model.fit` on the torch backend has no counterpart for, refused rather than ignored."""
    refused = [
        (setup.precision != Precision.FP32, f"--precision {setup.precision} (Keras sets mixed precision by its "
                                            "dtype policy; only fp32 is traced for Keras on torch)"),
        (setup.grad_accum > 1, "--grad-accum (Keras accumulates in the optimizer; not traced yet)"),
        (setup.checkpointing, "--checkpointing"),
        (bool(setup.freeze), "--freeze (set layer.trainable = False in the model instead)"),
        (setup.lora is not None or setup.qlora, "--lora/--qlora"),
        (setup.trainer is not None, f"--trainer {setup.trainer} (model.fit is the trainer)"), (setup.hf_trainer, "--hf-trainer"),
        *[(getattr(setup, k.replace("-", "_")) is not None, f"--{k}") for k in ("torch-version", "seq-lengths")],
        (setup.optimizer_impl != OptimizerImpl.DEFAULT, "--optimizer-impl (Keras's torch optimizers are "
                                                         "torch._foreach_* only)"),
        (setup.zero_grad != ZeroGrad.NONE, "--zero-grad zeros (Keras's train_step calls Module.zero_grad(), "
                                           "set_to_none)"),
    ]
    for bad, what in refused:
        if bad:
            raise SetupError(f"expected a setup that model.fit on Keras's torch backend runs, got {what}",
                             where="Keras model")


def keras_variables(model: Any) -> list[Any]:
    """Every variable the model holds (weights, BatchNormalization's moving statistics, seed generators'
    states), each once."""
    seen: dict[int, Any] = {}
    for variable in model.variables:
        seen.setdefault(id(variable), variable)
    return list(seen.values())


def materialize_fake(model: Any) -> None:
    """Give every variable built on meta a fake CPU Parameter of its shape and dtype, then re-track
    each layer's torch parameters (TorchLayer._track_variables makes the ParameterDict that
    model.parameters() and zero_grad() walk, from `variable.value`)."""
    for variable in keras_variables(model):
        _private().swap_torch_value(variable, lambda old: torch.nn.Parameter(torch.empty_like(old, device="cpu"),
                                                                  requires_grad=old.requires_grad))
    for module in model.modules():
        _private().retrack_torch_parameters(module)


def model_output_shape(model: Any, batch: tuple[int, ...]) -> tuple[int, ...]:
    """The first output's shape for a batch of `batch` (whole-batch input shape): a Functional or
    Sequential model knows it from its graph; another model is run symbolically (on meta, as fit's
    _symbolic_build does)."""
    outputs = getattr(model, "outputs", None)
    if outputs:
        shape = tuple(outputs[0].shape)
        return (batch[0], *shape[1:])
    from trainmem.frontends.keras.imports import import_keras

    keras = import_keras("torch")
    spec = model.compute_output_spec(keras.KerasTensor(batch))
    first = spec[0] if isinstance(spec, (list, tuple)) else next(iter(spec.values())) if isinstance(spec, dict) else spec
    return tuple(first.shape)


@dataclasses.dataclass
class KerasPrepared:
    model: Any
    optimizer: Any  # the model's compiled Keras optimizer
    make_data: Any  # batch_size -> (x, y) as fit's data loader yields it
    loss: Loss
    checkpointed: list[str] = dataclasses.field(default_factory=list)  # none: Keras has no such flag here


def batch_maker(model: Any, setup: TrainingSetup, source: Any) -> Any:
    """(x, y) for one step: the inputs as trace/step.py default_make_batch makes them, and targets the
    loss takes: class ids on all but the output's last dim for cross-entropy, values of the output's
    shape for mse; with --target-shape, that shape."""
    from trainmem.trace.step import default_make_batch

    make_inputs = default_make_batch(setup, source)
    loss = setup.loss or source.default_loss or Loss.CROSS_ENTROPY
    specs = setup.inputs or source.default_inputs

    def make_data(batch_size: int) -> tuple[Any, torch.Tensor]:
        inputs = make_inputs(batch_size)
        if setup.target_shape is not None:
            shape = (batch_size, *setup.target_shape)
        else:
            shape = model_output_shape(model, (batch_size, *specs[0].shape))
            shape = shape[:-1] if loss == Loss.CROSS_ENTROPY else shape
        if loss == Loss.CROSS_ENTROPY:
            target = torch.zeros(shape, dtype=torch.int64)  # class ids: 0 is valid for any number of classes
        else:
            target = torch.randn(shape)
        return (inputs[0] if len(inputs) == 1 else list(inputs)), target
    return make_data


def prepare(model: Any, setup: TrainingSetup, source: Any) -> KerasPrepared:
    """compile as a user does, and build the optimizer's variables as fit does before its first step
    (Trainer._symbolic_build: optimizer.build(trainable_variables))."""
    check_setup(setup)
    loss = setup.loss or source.default_loss or Loss.CROSS_ENTROPY
    model.compile(optimizer=keras_optimizer(setup), loss=keras_loss(setup, source.default_loss))
    if not model.trainable_variables:
        raise SetupError("expected a Keras model with trainable weights, got none", where=source.ref or source.name)
    model.optimizer.build(model.trainable_variables)
    return KerasPrepared(model, model.optimizer, batch_maker(model, setup, source), loss)


@contextlib.contextmanager
def _instance_wrapper(obj: Any, name: str, wrapper: Any) -> Iterator[None]:
    """obj.name = wrapper(original) on the instance only (object.__setattr__: neither Keras's attribute
    tracking nor torch's Module.__setattr__ sees it), removed afterwards."""
    original = getattr(obj, name)
    object.__setattr__(obj, name, wrapper(original))
    try:
        yield
    finally:
        obj.__dict__.pop(name, None)


def _announced(prepared: KerasPrepared, observer: Any, step: list[int]) -> contextlib.ExitStack:
    """Phase announcements from inside TorchTrainer.train_step: zero_grad comes after the forward,
    scale_loss right before loss.backward(), apply after it."""
    def zero_grad(original):
        def call(*args, **kwargs):
            observer.phase(Phase.ZERO_GRAD, step[0])
            original(*args, **kwargs)
            observer.phase(Phase.LOSS, step[0])
        return call

    def scale_loss(original):
        def call(loss):
            observer.phase(Phase.BACKWARD, step[0])
            return original(loss)
        return call

    def apply(original):
        def call(*args, **kwargs):
            observer.after_backward(prepared.model)
            observer.phase(Phase.OPTIMIZER, step[0])
            result = original(*args, **kwargs)
            observer.after_keras_optimizer(prepared.optimizer)
            return result
        return call

    stack = contextlib.ExitStack()
    stack.enter_context(_instance_wrapper(prepared.model, "zero_grad", zero_grad))
    stack.enter_context(_instance_wrapper(prepared.optimizer, "scale_loss", scale_loss))
    stack.enter_context(_instance_wrapper(prepared.optimizer, "apply", apply))
    return stack


def run_steps(prepared: KerasPrepared, setup: TrainingSetup, observer: Any,
              layers: torch.nn.Module | None = None) -> None:
    """TorchTrainer.fit's loop over `setup.steps` batches:

        for begin_step, end_step, data in epoch_iterator:   # data = [(x, y)], the loader's next batch
            logs = self.train_function(data)                 # train_step(data[0])

    `data` is rebound only once the next batch exists, `logs` once the next step returned. Python's cyclic
    collector is paused meanwhile: what Keras's tree utilities leave in reference cycles (the batch and
    outputs, frontends/keras/torch_backend.py CYCLES_NOTE) then lives to the trace's end, as in a real fit where
    no collection falls within the steps, rather than to wherever the trace's own allocations happen to
    start one."""
    from trainmem.alloc.gc_paused import gc_paused

    step = [0]
    held: dict[str, Any] = {}
    prepared.model.train()  # fit: self.train() before each epoch
    named = layer_calls_named(layers) if layers is not None else contextlib.nullcontext()
    with _announced(prepared, observer, step), gc_paused(), named:
        for step[0] in range(setup.steps):
            observer.phase(Phase.INPUTS, step[0])
            held["data"] = [prepared.make_data(setup.batch_size)]
            observer.phase(Phase.FORWARD, step[0])
            held["logs"] = prepared.model.train_step(held["data"][0])
            check_trainable(prepared, setup)


def check_trainable(prepared: KerasPrepared, setup: TrainingSetup) -> None:
    if not any(p.grad is not None for p in prepared.model.parameters()):
        raise SetupError("expected at least one trainable weight that the loss depends on, found none",
                         where="Keras model")


def optimizer_tensors(optimizer: Any) -> tuple[list[torch.Tensor], list[torch.Tensor], dict[str, list]]:
    """The Keras optimizer's variables: per-weight slots (momentums, velocities …) and its 0-dim
    bookkeeping (iterations, learning_rate), with the slots keyed by the variable's path."""
    slots, scalars, owners = [], [], {}
    for variable in optimizer.variables:
        value = variable.value
        (slots if value.dim() > 0 else scalars).append(value)
        if value.dim() > 0:
            owners[variable.path] = [value]
    return slots, scalars, owners


def non_trainable_tensors(model: Any) -> list[torch.Tensor]:
    """What the model holds but does not train (BatchNormalization's moving statistics, seed generators'
    state) and its metrics' accumulators (the loss tracker's total and count)."""
    held = [v.value for v in keras_variables(model) if not v.trainable]
    for metric in getattr(model, "metrics", []):
        held += [v.value for v in metric.variables]
    return held


def layer_path(layer: Any) -> str:
    """The layer's Keras path ('sequential/dense'; its name where Keras gave it none)."""
    return layer.path or layer.name


def model_facts(model: Any) -> tuple[int, int, dict[str, int], list[tuple[int, ...]]]:
    """Parameters as Keras counts them (count_params(): trainable and non-trainable weights), per layer
    (its own weights, by layer path), and each trainable weight's shape."""
    per_layer: dict[str, int] = {}
    flatten = _private().flatten_layers
    for layer in flatten(model, include_self=False):
        own = [w for w in layer.weights if not any(w is v for sub in flatten(layer, include_self=False) for v in sub.weights)]
        per_layer[layer_path(layer)] = sum(int(w.value.numel()) for w in own)
    trainable = sum(int(w.value.numel()) for w in model.trainable_weights)
    return (int(model.count_params()), trainable, per_layer,
            [tuple(w.value.shape) for w in model.trainable_weights])



def _owned(variables: list[Any]) -> dict[str, list[torch.Tensor]]:
    """Owner names the recorder takes ('layer.weight' -> 'layer'): a Keras variable's path is
    'sequential/dense/kernel', its layer's path 'sequential/dense'."""
    return {f"{v.path.rpartition('/')[0]}.{v.name}": [v.value] for v in variables}


def gradient_owners(model: Any) -> dict[str, list[torch.Tensor]]:
    return {name: [t.grad for t in values if t.grad is not None] for name, values in
            _owned(model.trainable_variables).items()}


def trace_run(model: Any, setup: TrainingSetup, source: Any, recorder: Any, observer: Any,
              layers: torch.nn.Module | None = None) -> KerasPrepared:
    """Inside the engine's fake mode and recorder (trace/run.py): fake variables, compile, the
    optimizer's variables, the categories of what exists before the first step, then fit's steps."""
    from trainmem.trace.events import Category
    from trainmem.trace.resolved import BatchProbe

    materialize_fake(model)
    prepared = prepare(model, setup, source)
    prepared.make_data = BatchProbe(prepared.make_data)
    recorder.set_category(recorder.storage_ids_of([v.value for v in model.trainable_variables]), Category.PARAMETERS)
    recorder.set_category(recorder.storage_ids_of(non_trainable_tensors(model)), Category.BUFFERS)
    observer.after_keras_optimizer(prepared.optimizer)
    recorder.set_owner(_owned(keras_variables(model)))
    run_steps(prepared, setup, observer, layers)
    return prepared


def resolved_setup(setup: TrainingSetup, source: Any, prepared: KerasPrepared) -> dict[str, Any]:
    from trainmem.trace.resolved import inputs_used

    out: dict[str, Any] = dict(source.resolved)
    out["inputs"] = inputs_used(prepared.make_data.first, setup, source, False)
    out["loss"] = {"loss": str(prepared.loss), "from": "--loss" if setup.loss else "trainmem's default",
                   "keras": type(prepared.model.loss).__name__}
    out["optimizer_impl"] = f"Keras {type(prepared.optimizer).__name__} (torch._foreach_*)"
    # --loop does not apply: model.fit runs its own loop (run_steps); the estimate's lean-loop comparison
    # traces the same steps again
    out["loop"] = "model.fit's (TorchTrainer.fit): the batch is rebound once the next exists, outputs die with train_step"
    return out


def non_trainable_bytes(model: Any) -> int:
    return sum(t.numel() * t.element_size() for t in non_trainable_tensors(model))


def layer_sets(model: Any, per_layer: dict[str, int]) -> tuple[set[str], set[str]]:
    """(layers that own weights, layers without sublayers), by layer path: the report's module rows."""
    owners = {path for path, count in per_layer.items() if count}
    leaves = {layer_path(layer) for layer in _private().flatten_layers(model, include_self=False)
              if not any(True for _ in _private().flatten_layers(layer, include_self=False))}
    return owners, leaves


class _CallProxy(torch.nn.Module):
    """Runs a Keras layer's `call` through torch's Module.__call__, so that the global forward hooks the
    engine's ModuleTracker listens to (trace/modules.py) fire for the layer. Keras layers are not torch
    submodules of the model (a model keeps them in a Python list), and Keras's Layer.__call__ is its own,
    so without this every op would be the model's."""

    def __init__(self, call: Any) -> None:
        super().__init__()
        object.__setattr__(self, "_keras_call", call)  # not a submodule: the layer stays Keras's

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._keras_call(*args, **kwargs)


def named_layers(model: Any) -> torch.nn.Module:
    """A torch container whose named_modules() are the model's layers by Keras path (one proxy each),
    for ModuleTracker(container); `layer_calls_named(container)` routes the calls through them."""
    container = torch.nn.Module()
    for layer in _private().flatten_layers(model, include_self=False):
        path = layer_path(layer)
        if path not in container._modules:
            container._modules[path] = _CallProxy(None)
            object.__setattr__(container._modules[path], "_layer", layer)
    return container


@contextlib.contextmanager
def layer_calls_named(container: torch.nn.Module) -> Iterator[None]:
    """While the steps run, each layer's `call` (Operation.__call__ looks it up on the instance,
    keras/src/ops/operation.py) goes through its proxy."""
    with contextlib.ExitStack() as stack:
        for proxy in container._modules.values():
            def through(original, proxy=proxy):
                object.__setattr__(proxy, "_keras_call", original)
                return lambda *args, **kwargs: proxy(*args, **kwargs)
            stack.enter_context(_instance_wrapper(proxy._layer, "call", through))
        yield
