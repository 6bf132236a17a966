"""The rules of thumb people use instead of a trace, computed for the same run and set beside the
estimate with how far each lands and why. No torch."""

from __future__ import annotations

from typing import Any

from trainmem.setup import ADAM_FAMILY, Precision, TrainingSetup



def baselines(traced, setup: TrainingSetup, reference_bytes: int, reference_name: str) -> list[dict[str, Any]]:
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
    return [{"rule": name, "bytes": int(nbytes), "vs": reference_name,
             "relative_to_estimate": (nbytes / reference_bytes - 1) if reference_bytes else None, "why": why}
            for name, nbytes, why in rows]
