"""`mlp:1000-100-100-100-100-10`: Linear layers of those widths, an activation (and optional
Dropout) between them, none after the last. The first number is the input size."""

from __future__ import annotations

from trainmem.errors import ModelRefError
from trainmem.setup import InputSpec, Loss, TrainingSetup


def parse_widths(ref: str) -> list[int]:
    body = ref.split(":", 1)[1]
    try:
        widths = [int(part) for part in body.split("-")]
    except ValueError:
        widths = []
    if len(widths) < 2 or any(w <= 0 for w in widths):
        raise ModelRefError(f"expected mlp:IN-HIDDEN-…-OUT with at least two positive widths, got {ref!r}",
                            where="MODEL")
    return widths


def build_mlp(widths: list[int], activation: str = "relu", dropout: float = 0.0):
    import torch.nn as nn

    activations = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}
    layers: list[nn.Module] = []
    for index, (width_in, width_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(width_in, width_out))
        if index < len(widths) - 2:
            layers.append(activations[activation]())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def from_mlp_ref(ref: str, setup: TrainingSetup):
    from trainmem.frontends import ModelSource

    widths = parse_widths(ref)
    activation, dropout = str(setup.activation), setup.dropout
    return ModelSource(ref=ref, name=ref, build=lambda: build_mlp(widths, activation, dropout),
                       default_inputs=(InputSpec((widths[0],)),), default_loss=Loss.CROSS_ENTROPY)
