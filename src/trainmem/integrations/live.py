"""The objects of a training script, as an estimate's setup: the model, the optimizer and one batch the script
already has, described without copying a byte of them.

Inside a training script the question is not "this reference with these flags" but "this model, this optimizer,
this batch". Each is read for what decides memory and nothing else:
- the model: its parameters' shapes, dtypes and requires_grad, by the meta copy `trainmem estimate(module)` makes
  (frontends/module_object.py), so the model is never copied and its weights never read;
- the optimizer: its class and implementation (foreach/fused), which decide its state and temporaries
  (setup.Optimizer); options that add state trainmem does not model (Adam's amsgrad, RMSprop's momentum or
  centered) and a parameter set other than the trainable parameters are refused in one line, never dropped;
- the batch: shapes and dtypes of its tensors, with the first dimension as the batch, re-made at any batch size
  on fake tensors (a tensor whose first dimension is not the batch's is kept at its shape). A dict batch is passed
  as keywords (model(**batch)), as Hugging Face models take it; a model that returns a loss (HF with `labels`)
  trains on that loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from trainmem.errors import SetupError
from trainmem.integrations.trainer_wrappers import trainer_of, without_accelerate_forward

# torch.optim class → trainmem's optimizer; bitsandbytes' and lion-pytorch's by class name (never imported here)
_TORCH_OPTIMIZERS = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw", "RMSprop": "rmsprop", "Adagrad": "adagrad",
                     "Adafactor": "adafactor"}
_BY_NAME = {"AdamW8bit": "adamw-8bit", "PagedAdamW8bit": "paged-adamw-8bit", "Lion": "lion"}


@dataclasses.dataclass(frozen=True)
class LiveRun:
    """What an integration estimates: the model as a ModelSource, its batch size and the setup values read off the
    live objects (optimizer, implementation, precision), and the device the model is on."""

    source: Any  # frontends.ModelSource
    batch_size: int
    values: dict[str, Any]
    device: str  # "cpu" or "cuda:N": where the model's parameters are


def live_run(model: Any, optimizer: Any, batch: Any, loss_fn: Callable | None = None,
             libraries: tuple[str, ...] = ()) -> LiveRun:
    """The LiveRun of a script's model, optimizer (None: the setup's own, adam unless given) and one batch;
    `libraries`: what the training framework imports beside the model's own (model_libraries)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise SetupError(f"expected a torch.nn.Module as the model, got {type(model).__name__}", where="model")
    # a model Fabric or Accelerate prepared: the module it wraps, run as that trainer runs it (trainer_wrappers.py)
    model, trainer = trainer_of(model)
    compiled = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule around the user's module
    model = compiled if isinstance(compiled, torch.nn.Module) else model
    size = batch_size_of(batch)
    values = {**(optimizer_values(optimizer, model) if optimizer is not None else {}), **precision_values(model),
              **trainer}
    # the model's own libraries are found by the trace (frontends/libraries.py); a framework's are given here
    source = dataclasses.replace(source_of(model, batch, loss_fn), libraries=tuple(libraries))
    if trainer.get("trainer") == "accelerate":
        build = source.build
        source = dataclasses.replace(source, build=lambda: without_accelerate_forward(build()))
    device = device_of(model)
    if compiled is not None:
        values, source = _compiled(values, source, device)
    return LiveRun(source, size, values, device)


# torch.compile'd models: on the CPU the step is traced as Inductor compiles it (--compile, trace/compiled.py); a
# CUDA run's plan is Triton's, not made here, so there the wrapped module is traced eagerly and the estimate says so
COMPILED_NOTE = ("the model is torch.compile'd: on {device} it is estimated as the eager module it wraps ({why}); the "
                 "compiled graph's saved activations and buffers are not modelled")


def _compiled(values: dict[str, Any], source: Any, device: str) -> tuple[dict[str, Any], Any]:
    from trainmem.trace.compiled import MIN_TORCH, traceable_here

    if device == "cpu" and traceable_here():
        return {**values, "compile": True}, source
    why = "Inductor's CUDA plan is Triton's" if device != "cpu" else f"--compile needs torch >= {MIN_TORCH}"
    return values, dataclasses.replace(source, notes=(*source.notes, COMPILED_NOTE.format(device=device, why=why)))


def source_of(model: Any, batch: Any, loss_fn: Callable | None = None) -> Any:
    """A ModelSource: the model's meta copy, batches shaped like `batch`, and `loss_fn(output, inputs)` or, for a
    model that returns its own loss, that loss."""
    from trainmem.frontends.module_object import from_module

    source = from_module(model)
    return dataclasses.replace(source, make_batch=batch_maker(batch), loss_fn=loss_fn or _own_loss_or_none(model))


def _own_loss_or_none(model: Any) -> Callable | None:
    """Hugging Face's models return a `loss` when the batch has labels; others leave the loss to the setup."""
    if not any(cls.__name__ in ("PreTrainedModel", "PeftModel") for cls in type(model).__mro__):
        return None

    def model_loss(output: Any, inputs: Any) -> Any:
        loss = getattr(output, "loss", None) if not isinstance(output, Mapping) else output.get("loss")
        if loss is None:
            raise SetupError("expected the model to return a loss (a batch with `labels`), it returned none",
                             where="batch")
        return loss
    return model_loss


def first_batch(loader: Any) -> Any:
    """The loader's first batch, made from its dataset and collate_fn where it can be, without an iterator: a
    sampler's iterator would draw from the random state the run is about to use. A loader over an IterableDataset
    (or with its own batch_sampler) gives the first batch of a fresh iterator."""
    import torch

    dataset, collate, size = loader.dataset, loader.collate_fn, loader.batch_size
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        return next(iter(loader))
    if size is None and loader.batch_sampler is None:  # batch_size=None: each item is a batch
        return collate(dataset[0])
    if size is None:
        return next(iter(loader))
    return collate([dataset[index] for index in range(min(size, len(dataset)))])


def batch_size_of(batch: Any) -> int:
    tensors = _tensors(batch)
    if not tensors or tensors[0].dim() == 0:
        raise SetupError(f"expected a batch of tensors whose first dimension is the batch (a tensor, a tuple or a "
                         f"dict of them), got {_described(batch)}", where="batch")
    return int(tensors[0].shape[0])


def batch_maker(batch: Any) -> Callable[[int], Any]:
    """make_batch(n): `batch` with every tensor whose first dimension is the batch's made at n (fake tensors while
    tracing: shapes and dtypes only); class ids and masks are zeros, floats standard normal."""
    import torch

    size = batch_size_of(batch)
    layout = _layout(batch, size)

    def make(spec: Any, n: int) -> Any:
        if not isinstance(spec, tuple) or len(spec) != 3 or spec[0] != "tensor":
            return spec
        _, (scaled, shape), dtype = spec
        full = (n, *shape) if scaled else shape
        return torch.randn(full, dtype=dtype) if dtype.is_floating_point else torch.zeros(full, dtype=dtype)

    def make_batch(n: int) -> Any:
        if isinstance(layout, dict):
            return {key: make(spec, n) for key, spec in layout.items()}
        if isinstance(layout, list):
            return tuple(make(spec, n) for spec in layout)
        return make(layout, n)
    return make_batch


def _layout(batch: Any, size: int) -> Any:
    import torch

    def spec(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        scaled = value.dim() > 0 and value.shape[0] == size
        return ("tensor", (scaled, tuple(value.shape[1:]) if scaled else tuple(value.shape)), value.dtype)

    if isinstance(batch, Mapping):
        return {key: spec(value) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return [spec(value) for value in batch]
    return spec(batch)


def _tensors(batch: Any) -> list[Any]:
    import torch

    values = list(batch.values()) if isinstance(batch, Mapping) else list(batch) if isinstance(
        batch, (tuple, list)) else [batch]
    return [value for value in values if isinstance(value, torch.Tensor)]


def _described(batch: Any) -> str:
    if isinstance(batch, Mapping):
        return f"a dict of {', '.join(f'{k}: {type(v).__name__}' for k, v in list(batch.items())[:4]) or 'nothing'}"
    return type(batch).__name__


def optimizer_values(optimizer: Any, model: Any) -> dict[str, Any]:
    """{optimizer, optimizer_impl} of a live optimizer, after checking that it covers the trainable parameters."""
    optimizer = unwrapped(optimizer)
    name = type(optimizer).__name__
    kind = _TORCH_OPTIMIZERS.get(name) if type(optimizer).__module__.startswith("torch.optim") else _BY_NAME.get(name)
    if kind is None:
        known = ", ".join([*(f"torch.optim.{n}" for n in _TORCH_OPTIMIZERS), *_BY_NAME])
        raise SetupError(f"expected an optimizer trainmem models ({known}), got {type(optimizer).__module__}.{name}",
                         where="optimizer")
    defaults = getattr(optimizer, "defaults", {})
    unmodelled = [option for option in ("amsgrad", "centered", "maximize") if defaults.get(option)]
    if kind == "rmsprop" and defaults.get("momentum"):
        unmodelled.append("momentum")
    if unmodelled:
        raise SetupError(f"expected {name} without {', '.join(unmodelled)} (state trainmem does not model yet), "
                         f"got {', '.join(f'{o}={defaults[o]!r}' for o in unmodelled)}", where="optimizer")
    if kind == "sgd" and defaults.get("momentum"):
        kind = "momentum"
    _check_covers(optimizer, model)
    if name not in _TORCH_OPTIMIZERS:  # bitsandbytes' and Lion have one implementation
        return {"optimizer": kind}
    impl = "fused" if defaults.get("fused") else {True: "foreach", False: "for-loop"}.get(defaults.get("foreach"))
    return {"optimizer": kind, **({"optimizer_impl": impl} if impl else {})}


def unwrapped(optimizer: Any) -> Any:
    """The torch optimizer inside the wrappers trainers put around it: accelerate's AcceleratedOptimizer
    (`.optimizer`), Lightning's LightningOptimizer (`._optimizer`)."""
    for _ in range(4):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            return optimizer
        optimizer = inner
    return optimizer


def _check_covers(optimizer: Any, model: Any) -> None:
    """The optimizer steps exactly the parameters that train (requires_grad): trainmem gives every trainable
    parameter optimizer state, so another set would be estimated wrong, silently."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"] if p.requires_grad}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    if stepped != trainable:
        raise SetupError(f"expected the optimizer to step the model's trainable parameters, got {len(stepped):,} "
                         f"of them against {len(trainable):,} trainable (freeze the others with "
                         "requires_grad_(False) first)", where="optimizer")


def precision_values(model: Any) -> dict[str, Any]:
    """A model whose floating parameters are all bfloat16 trains in pure bf16 (--precision bf16); autocast is the
    script's and is given as `precision=` (it cannot be read off the model)."""
    import torch

    floats = [p.dtype for p in model.parameters() if p.is_floating_point()]
    return {"precision": "bf16"} if floats and all(dtype == torch.bfloat16 for dtype in floats) else {}


def device_of(model: Any) -> str:
    for parameter in model.parameters():
        return str(parameter.device)
    return "cpu"
