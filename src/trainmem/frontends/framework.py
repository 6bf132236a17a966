"""Which framework a model reference is, decided from its text, a stat or the names a factory's module uses
(nothing is imported or run to decide), and the one resolver across frameworks: a torch ModelSource
(frontends/__init__.py resolve) or a KerasSource (frontends/keras/reference.py). A PyTorch reference never passes
through the Keras modules; a factory's file is loaded once, here, whichever framework it turns out to be.

`.keras` files and SavedModel directories are Keras; a factory is Keras when its module refers to Keras or
TensorFlow and not to torch; mlp: and specs are torch unless --framework keras."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trainmem.errors import SetupError, quote, short
from trainmem.setup import TrainingSetup

SAVED_MODEL_PB = "saved_model.pb"


FRAMEWORKS = ("auto", "torch", "keras")
KERAS_ROOTS = frozenset({"keras", "tensorflow", "tf_keras"})
KERAS_BACKENDS = ("tensorflow", "torch")




def is_keras_file(ref: str) -> bool:
    return ref.lower().rstrip("/").endswith(".keras")


def is_keras_reference(ref: Any, framework: str = "auto") -> bool:
    """Whether `ref` is estimated as Keras, from its text and a stat (nothing is read, imported or run).
    A factory's framework under "auto" is decided when its file is loaded (resolve_model)."""
    if is_keras_object(ref):
        return True
    if not isinstance(ref, str) or framework == "torch":
        return False
    if framework == "keras":
        return True
    return is_keras_file(ref.strip()) or saved_model_dir(ref.strip()) is not None


def keras_by_text(framework: str, kind: Any) -> bool:
    """Whether a reference of `kind` (frontends.Kind) is a Keras model under --framework, from its text alone (a
    factory's file decides under auto, when it is loaded)."""
    from trainmem.frontends import Kind

    return framework == "keras" or (framework == "auto" and kind in (Kind.KERAS, Kind.SAVED_MODEL))


def may_be_keras_on_tensorflow(framework: str, kind: Any, keras_backend: str) -> bool:
    """Whether the run may be Keras on TensorFlow: a Keras reference, or a factory under auto (decided when loaded),
    unless --keras-backend torch."""
    from trainmem.frontends import Kind

    return keras_backend != "torch" and (keras_by_text(framework, kind) or (framework == "auto" and kind == Kind.PYTHON))


def check_framework(framework: str, keras_backend: str | None, where: str = "--framework") -> None:
    if framework not in FRAMEWORKS:
        raise SetupError(f"expected {'|'.join(FRAMEWORKS)}, got {quote(framework)}", where=where)
    if keras_backend is not None and keras_backend not in KERAS_BACKENDS:
        raise SetupError(f"expected {'|'.join(KERAS_BACKENDS)}, got {quote(keras_backend)}", where="--keras-backend")


def resolve_model(model: Any, setup: TrainingSetup, framework: str = "auto", keras_backend: str | None = None):
    """The one resolver across frameworks: a torch ModelSource or a KerasSource. A factory's file is loaded
    once, here, whichever framework it turns out to be."""
    from trainmem.frontends import Kind, reference_kind, resolve

    check_framework(framework, keras_backend)
    if keras_backend == "torch" or is_keras_reference(model, framework):
        from trainmem.frontends.keras.reference import on_torch_backend, resolve_keras
    if keras_backend == "torch":
        return on_torch_backend(model, setup)
    if isinstance(model, str) and framework != "torch" and reference_kind(model) == Kind.PYTHON:
        return from_factory(model.strip(), setup, framework, keras_backend)
    if is_keras_reference(model, framework):
        return resolve_keras(model, setup, framework, keras_backend)
    return resolve(model, setup)


def is_keras_object(model: Any) -> bool:
    import sys

    keras = sys.modules.get("keras")
    return keras is not None and not isinstance(model, str) and isinstance(model, getattr(keras, "Model", ()))


def from_factory(ref: str, setup: TrainingSetup, framework: str, keras_backend: str | None):
    """Load the file once; Keras when --framework keras or its module refers to Keras/TensorFlow, not torch."""
    from trainmem.frontends.python_ref import load_factory

    if framework == "keras" and keras_backend is not None:  # Keras fixes its backend at its first import
        from trainmem.frontends.keras.imports import import_keras

        import_keras(backend=keras_backend, where=short(ref))
    factory = load_factory(ref)
    if framework == "auto" and not _refers_to_keras(factory):
        from trainmem.frontends import torch_source_of_factory

        return torch_source_of_factory(ref, factory)
    from trainmem.frontends.keras.reference import KerasSource, backend_in_use, call_keras_factory, on_torch_backend

    if backend_in_use() == "torch":
        return on_torch_backend(ref, setup)
    return KerasSource(ref, ref.rpartition(":")[2], lambda: call_keras_factory(factory, ref), "factory")


def _refers_to_keras(factory: Any) -> bool:
    roots = {_root(value) for value in getattr(factory, "__globals__", {}).values()}
    return bool(roots & KERAS_ROOTS) and "torch" not in roots


def _root(value: Any) -> str:
    name = getattr(value, "__name__", "") if isinstance(value, type(dataclasses)) else getattr(value, "__module__", "")
    return (name or "").split(".")[0] if isinstance(name, str) else ""


def framework_of(source: Any) -> str:
    """The framework that trains a resolved source: "tensorflow" for a KerasSource (Keras on TensorFlow, traced by
    trace/tf/), "torch" for every source the torch engine traces (Keras on the torch backend included). A
    KerasSource exists only once frontends/keras/reference.py was imported, so a PyTorch source never imports it."""
    import sys

    reference = sys.modules.get("trainmem.frontends.keras.reference")
    return "tensorflow" if reference is not None and isinstance(source, reference.KerasSource) else "torch"


def saved_model_dir(ref: str) -> Path | None:
    """The SavedModel directory `ref` names (the directory, or its saved_model.pb), else None; only stats."""
    path = Path(ref)
    try:
        if path.name == SAVED_MODEL_PB and path.is_file():
            return path.parent
        if path.is_dir() and ((path / SAVED_MODEL_PB).exists() or (path / "saved_model.pbtxt").exists()):
            return path
    except OSError:  # a name too long, a loop of links: not a SavedModel; the resolver's error names it
        return None
    return None
