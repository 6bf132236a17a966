"""A model reference's own batch under precision bf16. Training code that converts the model with
model.to(torch.bfloat16) converts its batch too (an fp32 input to a bf16 Linear fails in torch): the loop does
`x = x.to(device, torch.bfloat16)` on what the data loader yields. trainmem's own batch (--input-shape, a model's
default input: step.default_make_batch) is made in bfloat16 outright; a factory's make_batch is wrapped here, so
that its floating-point tensors reach the step in bfloat16 while integer and bool tensors (token ids, labels,
masks) keep their dtype. Under bf16-mixed (autocast) nothing is cast: the inputs stay fp32, as autocast wants them.

What make_batch returns is the loader's batch, in host memory: on a GPU only the cast copies are the device's. The
trace marks the originals as host storages (`host`, set by trace/resolved.py's BatchProbe), and a real run on a GPU
makes them on the CPU and copies them over, cast, as the loop does. A frontend's own maker (hf:) is not wrapped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class CastBatch:
    """make_batch with its floating-point tensors cast to bfloat16 (and, for a real run on `device_type` other
    than the CPU, made on the CPU and copied to it). `cast` names the tensors cast in the first batch."""

    def __init__(self, make_batch: Callable[[int], Any], device_type: str = "cpu") -> None:
        self.make_batch, self.device_type = make_batch, device_type
        self.host: Callable[[list[torch.Tensor]], None] | None = None  # told of the originals while they live
        self.cast: list[str] | None = None

    def __call__(self, batch_size: int) -> Any:
        if self.device_type == "cpu":
            batch = self.make_batch(batch_size)
        else:
            with torch.device("cpu"):
                batch = self.make_batch(batch_size)
        originals: list[torch.Tensor] = []
        names: list[str] = []
        converted = self._converted(batch, "", originals, names)
        if self.host is not None and originals:
            self.host(originals)
        if self.cast is None:
            self.cast = names
        return converted

    def _converted(self, value: Any, name: str, originals: list[torch.Tensor], names: list[str]) -> Any:
        if isinstance(value, torch.Tensor):
            device = None if self.device_type == "cpu" else self.device_type
            if value.is_floating_point() and value.dtype != torch.bfloat16:
                originals.append(value)
                names.append(name or "0")
                return value.to(device=device, dtype=torch.bfloat16)
            return value if device is None else value.to(device=device)
        prefix = f"{name}." if name else ""
        if isinstance(value, dict):
            return {key: self._converted(item, f"{prefix}{key}", originals, names) for key, item in value.items()}
        if isinstance(value, (tuple, list)):
            keys = getattr(value, "_fields", None) or range(len(value))  # a namedtuple's field names
            items = [self._converted(item, f"{prefix}{key}", originals, names) for key, item in zip(keys, value)]
            if hasattr(value, "_fields"):
                return type(value)(*items)
            return list(items) if isinstance(value, list) else tuple(items)
        return value


def cast_note(make_batch: Any) -> str:
    """What the resolved inputs' `from` adds when a factory's batch was cast ("" when nothing was)."""
    cast = getattr(make_batch, "cast", None)
    if not cast:
        return ""
    return f"; float tensor{'s' if len(cast) > 1 else ''} {', '.join(cast)} cast to bfloat16 for precision bf16"
