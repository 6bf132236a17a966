"""The rules of thumb people use instead of a trace, computed for the same run and set beside the
estimate with how far each lands and why. No torch."""

from __future__ import annotations

import dataclasses

from trainmem.setup import ADAM_FAMILY, Precision, TrainingSetup


@dataclasses.dataclass(frozen=True)
class Baseline:
    rule: str
    bytes: int  # what the rule predicts
    vs: str  # the figure of ours it is compared with
    relative_to_estimate: float | None  # bytes / that figure - 1 (None when ours is 0)
    why: str  # what the rule leaves out


def baselines(traced, setup: TrainingSetup, reference_bytes: int, reference_name: str) -> tuple[Baseline, ...]:
    """Each rule: its name, the bytes it predicts, the relative gap to `reference_bytes` (our figure
    named `reference_name`), and what the rule leaves out."""
    value_bytes = 2 if setup.precision == Precision.BF16 else 4
    disk = traced.parameters * value_bytes + traced.buffer_bytes
    rows = [("checkpoint size × 2", 2 * disk,
             "a weights-only rule: ignores optimizer state, activations and the allocator")]
    if setup.optimizer in ADAM_FAMILY:
        rows.append(("16 bytes per parameter (mixed-precision Adam)", 16 * traced.trainable_parameters
                     + value_bytes * (traced.parameters - traced.trainable_parameters),
                     "weights, gradients and Adam state only: no activations, temporaries or workspaces"))
    outputs = sum(n for m, n in traced.output_elements.items() if m in traced.leaf_modules)
    torchinfo = traced.input_bytes + 2 * outputs * value_bytes + traced.parameters * value_bytes
    rows.append(("torchinfo-style (input + 2 × layer outputs + parameters)", torchinfo,
                 "counts every layer output twice and no optimizer state, gradients or saved-for-backward detail"))
    return tuple(Baseline(name, int(nbytes), reference_name,
                          (nbytes / reference_bytes - 1) if reference_bytes else None, why)
                 for name, nbytes, why in rows)
