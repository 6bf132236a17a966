"""`mlp:1000-100-100-100-100-10`: Linear layers of those widths, an activation (and optional
Dropout) between them, none after the last. The first number is the input size."""

from __future__ import annotations

from trainmem.errors import ModelRefError
from trainmem.setup import InputSpec, Loss, TrainingSetup

# A tensor's element count is an int64 in c10 (TensorImpl::numel_): a Linear whose weight has more
# elements than that cannot be built, and torch fails in C++ with pages of frames. Each layer's
# in × out must fit.
MAX_ELEMENTS = 2**63 - 1
# Python recursion and autograd's C stack grow with the graph's depth: 1,000 Linear layers estimate in
# 47 s and 460 MiB here (2 cores), while 20,000 crashed the process after minutes. No trained MLP is
# near 1,000 layers.
MAX_LAYERS = 1000


def parse_widths(ref: str) -> list[int]:
    body = ref.split(":", 1)[1]
    try:
        widths = [int(part) for part in body.split("-")]
    except ValueError:
        widths = []
    if len(widths) < 2 or any(w <= 0 for w in widths):
        raise ModelRefError(f"expected mlp:IN-HIDDEN-…-OUT with at least two positive widths, got {_short(ref)}",
                            where="MODEL")
    if len(widths) - 1 > MAX_LAYERS:
        raise ModelRefError(f"expected at most {MAX_LAYERS:,} layers in an mlp: reference, got {len(widths) - 1:,}",
                            where="MODEL")
    for width_in, width_out in zip(widths, widths[1:]):
        if width_in * width_out > MAX_ELEMENTS:
            raise ModelRefError(f"expected each layer's in × out within a tensor's int64 element count "
                                f"({MAX_ELEMENTS:,}), got {width_in:,} × {width_out:,}", where="MODEL")
    return widths


def _short(ref: str, limit: int = 80) -> str:
    return repr(ref) if len(ref) <= limit else repr(ref[:limit]) + f" … ({len(ref):,} characters)"


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
