"""Keras model references in, a KerasSource out (or, on Keras's torch backend, the torch engine's ModelSource).

    model.keras | a directory save(zipped=False) wrote    config.json only, safe_mode (frontends/keras/keras_file.py)
    a SavedModel directory (saved_model.pb + variables/)  its signature, restored in a graph (frontends/keras/saved_model.py)
    path/to/file.py:factory | package.module:factory      a factory returning a keras.Model
    mlp:1000-100-10 | net.yaml | net.json                 with --framework keras (frontends/keras/builders.py)
    a keras.Model object                                  (Python API) rebuilt from its config

`build()` is called by the trace inside a fresh tf.Graph (trace/tf/keras_graph.py): the model's variables are
graph variables whose initializers never run, so no weight is allocated. Which framework a reference is:
`.keras` files and SavedModel directories are Keras; a factory is Keras when its module refers to Keras or
TensorFlow and not to torch; mlp: and specs are torch unless --framework keras. Every Keras and TensorFlow
import goes through frontends/keras/imports.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError, SetupError, one_line, quote, short
from trainmem.frontends.framework import from_factory, is_keras_file, is_keras_object, saved_model_dir
from trainmem.setup import InputSpec, Loss, TrainingSetup

@dataclasses.dataclass(frozen=True)
class KerasSource:
    """How to build a Keras model: `build()` inside the trace's tf.Graph returns a keras.Model."""

    ref: str  # re-resolvable in a fresh process ("" for a model object)
    name: str
    build: Callable[[], Any]
    kind: str  # keras-file | saved-model | factory | mlp | spec | model-object
    default_inputs: tuple[InputSpec, ...] = ()  # () : the model's own Input shapes
    default_loss: Loss | None = None
    notes: tuple[str, ...] = ()  # what the reference says or cannot tell (the file's own optimizer …)


def resolve_keras(ref: Any, setup: TrainingSetup, framework: str = "keras", keras_backend: str | None = None):
    """A KerasSource for a Keras reference on TensorFlow; the torch backend goes to frontends/keras/torch_backend.py."""
    from trainmem.frontends import Kind, reference_kind

    if keras_backend == "torch" or (keras_backend is None and backend_in_use() == "torch"):
        return on_torch_backend(ref, setup)
    if is_keras_object(ref):
        return _from_object(ref)
    ref = ref.strip()
    kind = reference_kind(ref)
    if is_keras_file(ref):
        return _from_keras_file(ref)
    if (directory := saved_model_dir(ref)) is not None:
        return _from_saved_model(directory, ref)
    if kind == Kind.MLP:
        return _from_mlp(ref, setup)
    if kind == Kind.SPEC:
        return _from_spec(ref)
    if kind == Kind.PYTHON:
        return from_factory(ref, setup, "keras", keras_backend)
    raise ModelRefError("expected a Keras model reference (model.keras, a SavedModel directory, file.py:factory, "
                        f"mlp:…, a layer spec), got {quote(ref)}", where="MODEL")


def backend_in_use() -> str | None:
    from trainmem.frontends.keras.imports import keras_backend_in_use

    return keras_backend_in_use()


def on_torch_backend(model: Any, setup: TrainingSetup):
    try:
        from trainmem.frontends.keras.torch_backend import resolve_keras_torch
    except ImportError:
        raise SetupError("expected a trainmem with Keras on the torch backend (frontends/keras/torch_backend.py), got one "
                         "without it; use --keras-backend tensorflow", where="--keras-backend") from None
    return resolve_keras_torch(model, setup)


def _from_object(model: Any) -> KerasSource:
    def build() -> Any:
        from trainmem.frontends.keras.imports import import_keras

        keras = import_keras()
        # clone_model compiles the clone as the model was (compile_from_config), which rebuilds the optimizer and
        # reads its variables' values: impossible inside the graph the trace builds in ("numpy() is only available
        # when eager execution is enabled"). The trace compiles the clone itself, so the clone is made as from an
        # uncompiled model and given the model's loss, which the trace uses when --loss is not given
        # (trace/tf/fit_setup.py make_loss)
        compiled = getattr(model, "compiled", False)
        try:  # Sequential and functional models rebuild from their config; a subclass needs get_config
            model.compiled = False
            clone = keras.models.clone_model(model)
        except Exception as error:  # noqa: BLE001 - the user's model class: one line
            raise ModelRefError(f"expected a Keras model that clone_model can rebuild without weights, got "
                                f"{type(error).__name__}: {one_line(error)}", where=type(model).__name__) from None
        finally:
            model.compiled = compiled
        if compiled and getattr(model, "loss", None) is not None:
            clone.loss = model.loss
        return clone

    return KerasSource("", getattr(model, "name", type(model).__name__), build, "model-object")


def _from_keras_file(ref: str) -> KerasSource:
    from trainmem.frontends.keras.keras_file import read_keras_config, rebuild, saved_compile

    config = read_keras_config(ref)
    optimizer, loss = saved_compile(config)
    notes = (f"{Path(ref).name} was compiled with optimizer {optimizer} and loss {loss}; the estimate uses "
             "the setup's (--optimizer, --loss)",) if optimizer or loss else ()
    return KerasSource(ref, Path(ref.rstrip("/")).stem, lambda: rebuild(config, ref), "keras-file", notes=notes)


def _from_saved_model(directory: Path, ref: str) -> KerasSource:
    from trainmem.frontends.keras.saved_model import build_from_saved_model, read_signature

    signature = read_signature(directory, ref)
    inputs = (InputSpec(signature.shape, signature.dtype),)
    note = (f"the SavedModel's signature {signature.name!r} is the forward: its ops run inside function calls "
            "(StatefulPartitionedCall), and the SavedModel holds no Keras layers, so the per-layer table has one row")
    return KerasSource(ref, directory.resolve().name, lambda: build_from_saved_model(directory, signature, ref),
                       "saved-model", default_inputs=inputs, notes=(note,))


def _from_mlp(ref: str, setup: TrainingSetup) -> KerasSource:
    from trainmem.frontends.keras.builders import build_keras_mlp
    from trainmem.frontends.mlp import parse_widths

    widths = parse_widths(ref)
    activation, dropout = str(setup.activation), setup.dropout
    return KerasSource(ref, ref, lambda: build_keras_mlp(widths, activation, dropout), "mlp",
                       default_inputs=(InputSpec((widths[0],)),), default_loss=Loss.CROSS_ENTROPY)


def _from_spec(ref: str) -> KerasSource:
    from trainmem.frontends import spec
    from trainmem.frontends.keras.builders import build_keras_spec, keras_input_shape

    data = spec.read_spec(ref)
    plan = spec._plan_layers(data, ref)  # noqa: SLF001 - the spec's one planner, torch's sizes inferred on meta
    default = spec._default_input(data, plan)  # noqa: SLF001
    shape = keras_input_shape(default.shape, plan)
    notes = (f"the spec's input {list(default.shape)} is channels-first; Keras takes it as {list(shape)}",
             ) if shape != default.shape else ()
    return KerasSource(ref, data.get("name", Path(ref).stem),
                       lambda: build_keras_spec(plan, default.shape, default.dtype, ref), "spec",
                       default_inputs=(InputSpec(shape, default.dtype, default.max_value),),
                       default_loss=spec._spec_loss(data.get("loss", "cross-entropy"), ref), notes=notes)  # noqa: SLF001


def call_keras_factory(factory: Callable[[], Any], ref: str) -> Any:
    """The factory's keras.Model (called inside the trace's graph); anything else is one line."""
    from trainmem.frontends.keras.imports import import_keras

    try:
        model = factory()
    except SystemExit as stop:
        raise ModelRefError(f"expected the factory to return a keras.Model, it called sys.exit({quote(stop.code)})",
                            where=short(ref)) from None
    except Exception as error:  # noqa: BLE001 - the user's code: one line
        raise ModelRefError(f"the factory raised {type(error).__name__}: {one_line(error)}", where=short(ref)) from error
    keras = import_keras(where=short(ref))
    if not isinstance(model, keras.Model):
        raise ModelRefError(f"expected the factory to return a keras.Model, got {type(model).__name__}",
                            where=short(ref))
    return model
