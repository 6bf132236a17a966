"""A Keras 3 model on the torch backend as a ModelSource the torch engine traces (trace/run.py) and
measures (measure/child.py).

On the torch backend a Keras model *is* a torch.nn.Module whose variables hold torch Parameters
(keras/src/backend/torch/layer.py, core.py), so the engine's recorder sees its step; what differs from a
torch model is the step itself, Keras's own train_step and optimizer (trace/keras_torch_step.py), which
the engine picks for a Keras model.

The model is built on the meta device when estimating: Keras places each new variable on
`backend.torch.core.get_device()`, which `keras.device("meta")` (device_scope) sets for the build, so
Variable._initialize runs the initializer on meta and nothing is allocated (checked: a Dense(16000) layer
built so holds meta Parameters). When measuring, the same build runs on the CPU for real.

    resolve_keras_torch(model_object | factory | "file.py:factory" | "module:factory" | other Keras
                        references kfront's frontends/keras/reference.py resolves, setup) -> ModelSource
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainmem.errors import ModelRefError, one_line, short
from trainmem.frontends import ModelSource
from trainmem.setup import InputSpec, TrainingSetup


KERAS_TORCH_NOTE = ("Keras on the torch backend: the step traced is TorchTrainer.train_step as model.fit runs it, "
                    "with Keras's optimizer")
# Measured here: a 40-step fit of the seed MLP at batch 2048 (weak references to each batch, counted at each
# step's end) had 1,1,1,2,3,1,1,2,3,4,… batches alive — a generation-0 collection every 5 steps; its tensor
# peak with the collector on was 45,537,856 B (measure/child.py, steps 40, "gc": "on") against 23,061,632 B
# estimated for 2 steps and 55,829,632 B for 6 (benchmarks/results/keras_torch.md).
CYCLES_NOTE = ("Keras's tree utilities (keras/src/tree/torchtree_impl.py) hand closures over the batch and the "
               "outputs to torch.utils._pytree.tree_flatten, whose recursive helper is a reference cycle: each "
               "step's batch stays alive until Python's cyclic garbage collector runs. The estimate assumes no "
               "collection during the traced steps, so --steps N keeps N-1 earlier batches: a long fit holds as "
               "many as fall between two collections (the seed MLP: 4 earlier batches, every 5 steps; a 40-step "
               "fit peaked at twice the 2-step estimate), so estimate a long run with --steps 6")


def _on_meta_while_estimating(factory: Callable[[], Any], where: str) -> Callable[[], Any]:
    """build(): under the engine's meta build (trace/meta_build.py, torch's default device is meta) the
    Keras variables go to meta too; otherwise (a measured run) where Keras puts them."""
    def build() -> Any:
        import torch

        from trainmem.frontends.keras.imports import import_keras

        keras = import_keras("torch", where=where)
        on_meta = torch.get_default_device().type == "meta"
        try:
            if on_meta:
                with keras.device("meta"):
                    model = factory()
            else:
                model = factory()
        except ModelRefError:
            raise
        except Exception as error:  # noqa: BLE001 - the user's factory: one line, where
            raise ModelRefError(f"building the Keras model raised {type(error).__name__}: {one_line(error)}",
                                where=where) from error
        if not isinstance(model, keras.Model):
            raise ModelRefError(f"expected a Keras model (keras.Model), got {type(model).__name__}", where=where)
        return model
    return build


def _clone_factory(model: Any) -> Callable[[], Any]:
    """A model object already holds real weights and must stay untouched: the estimate builds a clone of
    its architecture (keras.models.clone_model: Sequential and Functional models, and subclassed ones
    with get_config/from_config), on meta."""
    def factory() -> Any:
        from trainmem.frontends.keras.imports import import_keras

        return import_keras("torch").models.clone_model(model)
    return factory


def _model_inputs(model: Any) -> tuple[InputSpec, ...]:
    """The input shapes a Functional or Sequential model declares (keras.Input), without the batch dim."""
    inputs = getattr(model, "inputs", None) or []
    specs = []
    for tensor in inputs:
        shape = tuple(tensor.shape)[1:]
        if any(dim is None for dim in shape):
            return ()  # a free dimension: the user gives --input-shape
        dtype = str(tensor.dtype)
        specs.append(InputSpec(shape=shape, dtype=dtype if dtype in ("int32", "int64") else "float32"))
    return tuple(specs)


def _factory_for(ref_or_model: Any, setup: TrainingSetup) -> tuple[str, str, Callable[[], Any], Any]:
    """(ref re-resolvable in a fresh process or "", name, factory, the Keras reference's KerasSource or None)."""
    from trainmem.frontends import Kind, reference_kind
    from trainmem.frontends.keras.imports import import_keras

    keras = import_keras("torch")
    if isinstance(ref_or_model, keras.Model):
        return "", type(ref_or_model).__name__, _clone_factory(ref_or_model), None
    if callable(ref_or_model) and not isinstance(ref_or_model, str):
        return "", getattr(ref_or_model, "__name__", "model"), ref_or_model, None
    if not isinstance(ref_or_model, str):
        raise ModelRefError(f"expected a Keras model, a factory or a model reference, got "
                            f"{type(ref_or_model).__name__}", where="MODEL")
    ref = ref_or_model.strip()
    if reference_kind(ref) == Kind.PYTHON:
        from trainmem.frontends.python_ref import load_factory

        return ref, ref.rpartition(":")[2], load_factory(ref), None
    # model.keras, mlp: and layer specs: frontends/keras/reference.py's builders, which are backend-neutral. Its
    # resolve_keras sends a torch-backend call back here, so it is asked for the builder with the
    # TensorFlow backend named: for these kinds that name only stops the dispatch (a SavedModel, which
    # only TensorFlow can run, is refused first).
    from trainmem.frontends.keras.reference import resolve_keras
    from trainmem.frontends.framework import saved_model_dir

    if saved_model_dir(ref) is not None:
        raise ModelRefError("expected a Keras model the torch backend can build (model.keras, file.py:factory, "
                            "mlp:, a layer spec), got a TensorFlow SavedModel; use --keras-backend tensorflow",
                            where=short(ref))
    source = resolve_keras(ref, setup, "keras", keras_backend="tensorflow")
    return ref, source.name, source.build, source


def resolve_keras_torch(ref_or_model: Any, setup: TrainingSetup) -> ModelSource:
    """A Keras model on the torch backend, for the torch engine. Imports Keras on the torch backend
    (an error if this process imported it on another: Keras fixes its backend at first import)."""
    ref, name, factory, keras_source = _factory_for(ref_or_model, setup)
    where = short(ref) if ref else "model"
    build = _on_meta_while_estimating(factory, where)
    declared = keras_source.default_inputs if keras_source is not None else ()
    inputs = declared or (() if setup.inputs else build_probe(build))
    notes = tuple(keras_source.notes) if keras_source is not None else ()
    return ModelSource(ref=ref, name=name, build=build, default_inputs=inputs,
                       default_loss=keras_source.default_loss if keras_source is not None else None,
                       notes=notes + (KERAS_TORCH_NOTE, CYCLES_NOTE),
                       libraries=("keras",), resolved={"framework": "keras", "keras_backend": "torch"})


def build_probe(build: Callable[[], Any]) -> tuple[InputSpec, ...]:
    """The model's declared inputs, from one build on meta (nothing allocated)."""
    from trainmem.trace.meta_build import building_on_meta

    with building_on_meta():
        return _model_inputs(build())

