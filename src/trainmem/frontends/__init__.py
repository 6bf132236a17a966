"""Model references in, a ModelSource out: one resolver, one clear error per bad reference.

    mlp:1000-100-100-100-100-10      a fully connected net (frontends/mlp.py)
    net.yaml | net.json              a layer spec (frontends/spec.py)
    path/to/file.py:factory          a factory in a file the user points at as code
    package.module:factory           a factory in an importable module
    torchvision:NAME | timm:NAME[?k=v&…]    a vision model by name (frontends/vision.py)
    hf:NAME | hf:owner/name[@rev] | hf:DIR | hf:config.json
                                     a Hugging Face model from its config.json, bundled, from the hub
                                     or local (frontends/hf.py, hf_hub.py)
    model.onnx                              an ONNX graph converted to torch (frontends/onnx_ref.py)
    model.pt | .pth | .bin | .safetensors   a checkpoint (frontends/checkpoint.py), never unpickled freely
    an nn.Module object              (Python API only)
    model.keras | a SavedModel directory    Keras models (frontends/keras/reference.py: resolve_model picks the
                                     framework; factories returning a keras.Model and, with --framework
                                     keras, mlp: and specs too)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from trainmem.errors import ModelRefError, quote
from trainmem.setup import InputSpec, Loss, TrainingSetup


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """How to build a model and its batches. `build()` is called under `torch.device('meta')`
    when estimating (nothing allocated) and on the CPU when measuring."""

    ref: str  # re-resolvable in a fresh process; "" for a module object
    name: str
    build: Callable[[], Any]
    make_batch: Callable[[int], Any] | None = None  # batch_size -> tensor or tuple of tensors
    loss_fn: Callable[[Any, Any], Any] | None = None  # (output, inputs) -> scalar tensor
    default_inputs: tuple[InputSpec, ...] = ()
    default_loss: Loss | None = None
    notes: tuple[str, ...] = ()  # what the reference cannot tell (a state dict has no forward …)
    libraries: tuple[str, ...] = ()  # libraries the training process imports for this model (transformers …)
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)  # settings the frontend filled in (seq_len …)
    prekey: str | None = None  # what build() builds, named without building it (trace/early_key.py), where known


class Kind:
    """What a model reference is, from its text alone (nothing is read or imported): resolve() and
    the CLI's flag rules (trainmem/flag_rules.py) decide by the same function."""

    MLP, VISION, HF, ONNX, CHECKPOINT, SPEC, PYTHON, MODULE, UNKNOWN = (
        "mlp", "vision", "hf", "onnx", "checkpoint", "spec", "python", "module", "unknown")
    KERAS, SAVED_MODEL = "keras", "saved-model"  # a .keras file; a SavedModel directory (found by a stat)


def reference_kind(model: Any) -> str:
    if not isinstance(model, str):
        return Kind.MODULE
    ref = model.strip()
    lowered = ref.lower()
    if ref.startswith("mlp:"):
        return Kind.MLP
    if ref.startswith(("torchvision:", "timm:")):
        return Kind.VISION
    if ref.startswith("hf:"):
        return Kind.HF
    if lowered.endswith(".onnx"):
        return Kind.ONNX
    if lowered.rstrip("/").endswith(".keras"):
        return Kind.KERAS
    from trainmem.frontends.checkpoint import is_checkpoint

    if is_checkpoint(ref):
        return Kind.CHECKPOINT
    if lowered.endswith((".yaml", ".yml", ".json")):
        return Kind.SPEC
    if ":" in ref:
        return Kind.PYTHON
    from trainmem.frontends.framework import saved_model_dir

    if saved_model_dir(ref) is not None:
        return Kind.SAVED_MODEL
    return Kind.UNKNOWN


def resolve(model: Any, setup: TrainingSetup) -> ModelSource:
    """The torch resolver (frontends/keras/reference.py resolve_model is the one across frameworks). A ModelSource
    already resolved passes through."""
    if isinstance(model, ModelSource):
        return model
    kind = reference_kind(model)
    if kind == Kind.MODULE:
        from trainmem.frontends.module_object import from_module

        return from_module(model)
    ref = model.strip()
    if kind == Kind.MLP:
        from trainmem.frontends.mlp import from_mlp_ref

        return from_mlp_ref(ref, setup)
    if kind == Kind.VISION:
        from trainmem.frontends.vision import from_vision_ref

        return from_vision_ref(ref)
    if kind == Kind.HF:
        from trainmem.frontends.hf import from_hf_ref

        return from_hf_ref(ref, setup)
    if kind == Kind.ONNX:
        from trainmem.frontends.onnx_ref import from_onnx

        return from_onnx(ref)
    if kind == Kind.CHECKPOINT:
        from trainmem.frontends.checkpoint import from_checkpoint

        return from_checkpoint(ref)
    if kind == Kind.SPEC:
        from trainmem.frontends.spec import from_spec_file

        return from_spec_file(ref)
    if kind == Kind.PYTHON:
        from trainmem.frontends.python_ref import load_factory

        return torch_source_of_factory(ref, load_factory(ref))
    if kind in (Kind.KERAS, Kind.SAVED_MODEL):
        raise ModelRefError(f"expected a PyTorch model with --framework torch, got a Keras model {quote(ref)} "
                            "(--framework auto or keras estimates it)", where="MODEL")
    raise ModelRefError(
        "expected a model reference such as mlp:1000-100-10, net.yaml, path/file.py:factory, "
        f"package.module:factory, torchvision:NAME, hf:NAME, model.onnx, a checkpoint file, model.keras or a "
        f"SavedModel directory, got {quote(ref)}", where="MODEL")


def torch_source_of_factory(ref: str, factory: Callable[[], Any]) -> ModelSource:
    """A loaded `file.py:factory` for the torch engine (frontends/python_ref.py says what it may return). A
    factory that returns a Keras model is told to use Keras's path, not traced as an nn.Module."""
    from trainmem.errors import one_line, short

    def build() -> Any:
        try:
            result = factory()
        except SystemExit as stop:  # a script's habit; here it would end trainmem with the factory's code
            raise ModelRefError(f"expected the factory to return an nn.Module, it called sys.exit({quote(stop.code)})",
                                where=short(ref)) from None
        except Exception as error:  # noqa: BLE001
            raise ModelRefError(f"the factory raised {type(error).__name__}: {one_line(error)}", where=short(ref)) from error
        if type(result).__module__.split(".")[0] == "keras":
            raise ModelRefError(f"expected an nn.Module, got a Keras {type(result).__name__}: estimate it with "
                                "--framework keras", where=short(ref))
        return result

    return ModelSource(ref=ref, name=ref.rpartition(":")[2], build=build)
