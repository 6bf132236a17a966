"""The setup values a trace actually used, beside what was typed: the batch the step made (names, shapes,
dtypes), the loss, the sequence length and task a frontend chose, the LoRA settings after peft resolved
them, and the optimizer implementation torch picks. `setup.resolved` in the JSON."""

from __future__ import annotations

from typing import Any

import torch

from trainmem.frontends import ModelSource
from trainmem.setup import Loss, TrainingSetup
from trainmem.trace.cast_batch import CastBatch, cast_note


class BatchProbe:
    """Wraps a batch maker and notes the first batch's tensors (name, shape, dtype): what the step
    really trained on. Only their metadata is kept: holding the tensors would keep the batch alive
    for the whole trace and add it to the peak."""

    def __init__(self, make_batch: Any, recorder: Any = None) -> None:
        self.make_batch = make_batch
        self.first: list[tuple[str, torch.Size, torch.dtype]] | None = None
        if recorder is not None and isinstance(make_batch, CastBatch):  # the loader's originals stay on the host
            make_batch.host = lambda tensors: recorder.trace.host_storages.update(recorder.storage_ids_of(tensors))

    def __call__(self, batch_size: int) -> Any:
        batch = self.make_batch(batch_size)
        if self.first is None:
            self.first = [(name, t.shape, t.dtype) for name, t in _tensors(batch)]
        return batch


def _tensors(batch: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(batch, torch.Tensor):
        return [("0", batch)]
    items = batch.items() if isinstance(batch, dict) else enumerate(batch if isinstance(batch, (tuple, list)) else ())
    return [(str(name), t) for name, t in items if isinstance(t, torch.Tensor)]


def inputs_used(batch: Any, setup: TrainingSetup, source: ModelSource, own_maker: bool) -> dict[str, Any]:
    """Each tensor of the first batch (whole-batch shape) and who chose it."""
    specs = () if own_maker else (setup.inputs or source.default_inputs)
    origin = ("the model reference's batch maker" if own_maker else
              "--input-shape" if setup.inputs else "the model's default input")
    tensors = []
    for i, (name, shape, dtype) in enumerate(batch or []):
        row = {"name": name, "shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
        if i < len(specs) and specs[i].is_integer:
            row["max_value"] = specs[i].max_value
        tensors.append(row)
    return {"from": origin, "tensors": tensors}


def loss_used(setup: TrainingSetup, source: ModelSource, own_loss: bool) -> dict[str, str]:
    """The loss the step computed; the rule is step.prepare's (typed, else the model's, else cross-entropy)."""
    if own_loss:
        return {"loss": "the model's own", "from": "the model reference's loss function"}
    if setup.loss is not None:
        return {"loss": str(setup.loss), "from": "--loss"}
    if source.default_loss is not None:
        return {"loss": str(source.default_loss), "from": "the model's default loss"}
    return {"loss": str(Loss.CROSS_ENTROPY), "from": "trainmem's default"}


def optimizer_impl_used(optimizer: torch.optim.Optimizer) -> str:
    """torch's choice for optimizer_impl 'default' (foreach: None resolves to the for-loop for CPU tensors,
    torch/optim/optimizer.py _default_to_fused_or_foreach; a trace of a CUDA run asks for foreach)."""
    group = optimizer.param_groups[0]
    if "foreach" not in group and "fused" not in group:
        return f"{type(optimizer).__name__}'s own"
    return "fused" if group.get("fused") else "foreach" if group.get("foreach") else "for-loop"


def resolved_setup(setup: TrainingSetup, source: ModelSource, probe: BatchProbe, own_maker: bool,
                   own_loss: bool, optimizer: torch.optim.Optimizer, lora: dict | None) -> dict[str, Any]:
    out: dict[str, Any] = dict(source.resolved)
    out["inputs"] = inputs_used(probe.first, setup, source, own_maker)
    out["inputs"]["from"] += cast_note(probe.make_batch)
    out["loss"] = loss_used(setup, source, own_loss)
    out["optimizer_impl"] = optimizer_impl_used(optimizer)
    if lora is not None:
        out["lora"] = lora
    return out
