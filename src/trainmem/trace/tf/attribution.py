"""Which Keras layer made each op of the step, where the step's phases begin, which tensors are the
gradients, which variable is what, and the Keras-style per-layer table. Hooks are set on the instances
(layer.call, optimizer.scale_loss, optimizer.apply_gradients) and removed on exit."""

from __future__ import annotations

import functools
from typing import Any

from trainmem.trace.events import Category, Phase, Trace
from trainmem.trace.tf.keras_facts import LayerRow
from trainmem.trace.tf.private import flatten_layers
from trainmem.trace.tf.ops import VariableInfo


def layer_paths(model: Any) -> dict[int, str]:
    """id(layer) -> its path under the model: 'dense' for a top-level layer, 'block.conv' below one."""
    paths: dict[int, str] = {}

    def walk(layer: Any, prefix: str) -> None:
        for child in flatten_layers(layer, include_self=False, recursive=False):
            if id(child) in paths:
                continue
            path = f"{prefix}.{child.name}" if prefix else child.name
            paths[id(child)] = path
            walk(child, path)

    walk(model, "")
    return paths


class LayerHooks:
    """Records, by graph op count, where each layer call, the loss scaling and the optimizer apply begin
    and end while train_step builds the step."""

    def __init__(self, model: Any, graph: Any) -> None:
        self.model, self.graph = model, graph
        self.paths = layer_paths(model)
        self.start = len(graph.get_operations())
        self.marks: list[tuple[int, str, str]] = []  # (op index within the step, "enter"/"exit", path)
        self.phase_marks: dict[str, int] = {}
        self.gradients: list[tuple[str, int]] = []
        self.output_shapes: dict[str, tuple] = {}
        self._undo: list[tuple[Any, str]] = []

    def _count(self) -> int:
        return len(self.graph.get_operations()) - self.start

    def __enter__(self) -> LayerHooks:
        layers = [self.model] + list(flatten_layers(self.model, include_self=False))
        for layer in layers:
            self._wrap(layer, "call", self._layer_call(layer, self.paths.get(id(layer), "")))
        optimizer = self.model.optimizer
        self._wrap(optimizer, "scale_loss", self._marked(optimizer.scale_loss, "scale_loss"))
        self._wrap(optimizer, "apply_gradients", self._apply(optimizer.apply_gradients))
        return self

    def __exit__(self, *exc: Any) -> None:
        for obj, name in reversed(self._undo):
            try:
                object.__delattr__(obj, name)
            except AttributeError:
                pass
        self._undo.clear()

    def _wrap(self, obj: Any, name: str, wrapper: Any) -> None:
        object.__setattr__(obj, name, wrapper)  # past Keras's attribute tracking: an instance attribute only
        self._undo.append((obj, name))

    def _layer_call(self, layer: Any, path: str) -> Any:
        original = layer.call

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            self.marks.append((self._count(), "enter", path))
            try:
                out = original(*args, **kwargs)
            finally:
                self.marks.append((self._count(), "exit", path))
            if path and path not in self.output_shapes:
                self.output_shapes[path] = _shapes(out)
            if layer is self.model:
                self.phase_marks.setdefault("forward_end", self._count())
            return out

        return call

    def _marked(self, original: Any, label: str) -> Any:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            self.phase_marks.setdefault(label, self._count())
            return out

        return wrapper

    def _apply(self, original: Any) -> Any:
        @functools.wraps(original)
        def apply(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            pairs = list(grads_and_vars)
            for grad, _ in pairs:
                for tensor in (getattr(grad, "values", None), grad):
                    if tensor is not None and hasattr(tensor, "op") and hasattr(tensor, "value_index"):
                        self.gradients.append((tensor.op.name, tensor.value_index))
                        break
            self.phase_marks.setdefault("apply", self._count())
            out = original(pairs, *args, **kwargs)
            self.phase_marks.setdefault("apply_end", self._count())
            return out

        return apply

    def modules_by_index(self, count: int) -> list[str]:
        """The innermost layer whose call was running when each op was made ("" outside every layer)."""
        modules: list[str] = []
        stack: list[str] = []
        position, ordered = 0, self.marks  # in time order; counts never decrease
        for index in range(count):
            while position < len(ordered) and ordered[position][0] <= index:
                _, kind, path = ordered[position]
                if kind == "enter":
                    stack.append(path)
                elif stack:
                    stack.pop()
                position += 1
            modules.append(next((p for p in reversed(stack) if p), ""))
        return modules

    def phases_by_index(self, ops: list) -> list[Phase]:
        forward_end = self.phase_marks.get("forward_end", 0)
        backward = self.phase_marks.get("scale_loss", forward_end)
        apply = self.phase_marks.get("apply", len(ops))
        apply_end = self.phase_marks.get("apply_end", len(ops))
        phases = []
        for index, op in enumerate(ops):
            if op.type == "Placeholder":
                phases.append(Phase.INPUTS)
            elif index < forward_end:
                phases.append(Phase.FORWARD)
            elif index < backward:
                phases.append(Phase.LOSS)
            elif index < apply:
                phases.append(Phase.BACKWARD)
            elif index < apply_end:
                phases.append(Phase.OPTIMIZER)
            else:
                phases.append(Phase.LOSS)  # the metrics fit returns (compute_metrics): the loss's mean
        return phases


def _shapes(out: Any) -> tuple:
    if hasattr(out, "shape"):
        return tuple(out.shape.as_list()) if hasattr(out.shape, "as_list") else tuple(out.shape)
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return tuple(_shapes(o) for o in out)
    return ()


def _handle_name(variable: Any) -> str | None:
    value = getattr(variable, "value", variable)
    handle = getattr(value, "handle", None)
    op = getattr(handle, "op", None)
    return op.name if op is not None else None


def variables_of(model: Any, ops: list) -> dict:
    """Every variable the step touches, by VarHandleOp name, with its category and owning layer."""
    paths = layer_paths(model)
    owner: dict[int, str] = {}
    for layer in flatten_layers(model, include_self=False):
        for weight in list(getattr(layer, "_trainable_variables", [])) + list(getattr(layer, "_non_trainable_variables", [])):
            owner.setdefault(id(weight), paths.get(id(layer), ""))
    table: dict[str, VariableInfo] = {}

    def add(variable: Any, category: Category, module: str) -> None:
        name = _handle_name(variable)
        if name is not None and name not in table:
            shape = tuple(int(d) for d in variable.shape)
            table[name] = VariableInfo(name, shape, str(variable.dtype), category, module)

    trainable = {id(w) for w in model.trainable_weights}
    for weight in model.weights:
        add(weight, Category.PARAMETERS if id(weight) in trainable else Category.BUFFERS, owner.get(id(weight), ""))
    optimizer = model.optimizer
    slot_owner = _slot_owners(optimizer, owner)
    for variable in optimizer.variables:
        category = Category.OPTIMIZER_STATE if len(variable.shape) > 0 else Category.OPTIMIZER_SCALARS
        add(variable, category, slot_owner.get(id(variable), ""))
    for variable in model.metrics_variables:
        add(variable, Category.BUFFERS, "")
    handles = {op.inputs[0].op.name for op in ops if op.inputs and op.inputs[0].dtype.name == "resource"}
    return {name: info for name, info in table.items() if name in handles}


def _slot_owners(optimizer: Any, owner: dict[int, str]) -> dict[int, str]:
    """Optimizer slot variable -> the layer of its parameter: Keras optimizers keep each slot kind in a
    list aligned with `_trainable_variables` (adam.py: self._momentums, self._velocities)."""
    params = list(getattr(optimizer, "_trainable_variables", []))
    out: dict[int, str] = {}
    for value in vars(optimizer).values():
        if isinstance(value, list) and len(value) == len(params) and value and value is not params:
            for slot, param in zip(value, params):
                if hasattr(slot, "shape") and slot is not None:
                    out.setdefault(id(slot), owner.get(id(param), ""))
    return out


def layer_rows(model: Any, hooks: LayerHooks, trace: Trace) -> tuple[LayerRow, ...]:
    """One row per top-level layer, as model.summary() lists them; activation bytes of the first step."""
    kept: dict[str, int] = {}
    for record in trace.storages.values():
        if record.step == 0 and record.category == Category.ACTIVATIONS:
            top = record.module.split(".")[0]
            kept[top] = kept.get(top, 0) + record.nbytes
    rows = []
    for layer in flatten_layers(model, include_self=False, recursive=False):
        name = hooks.paths.get(id(layer), layer.name)
        rows.append(LayerRow(name, type(layer).__name__, hooks.output_shapes.get(name, ()), int(layer.count_params()),
                             kept.get(name, 0)))
    return tuple(rows)
