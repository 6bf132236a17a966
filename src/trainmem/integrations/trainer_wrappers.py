"""A model a trainer has already prepared, read as the module it wraps and the trainer that runs it.

Inside a Fabric or Accelerate script the model the user holds is not their module:
- Lightning Fabric's `fabric.setup(model)` returns a `_FabricModule` (lightning/fabric/wrappers.py): its forward
  casts the inputs, runs the module under the precision plugin's autocast, casts the outputs, and registers a hook
  that refuses a plain `loss.backward()`. The module itself is `.module`; the precision is the strategy's plugin's
  `precision` string ("32-true", "bf16-mixed", "16-mixed", "bf16-true", ...).
- Accelerate's `accelerator.prepare(model)` returns the module itself, with an instance `forward` that runs
  `convert_outputs_to_fp32(autocast(forward))` when mixed precision is on (accelerator.py prepare_model: it keeps
  the class's forward in `_original_forward`); the precision is the AcceleratorState's `mixed_precision`.
Each is estimated as `--trainer fabric` / `--trainer accelerate` with that precision (trace/trainer_forward.py wraps
the traced forward as the library does), on the plain module: Accelerate's instance forward is dropped from the
meta copy, so the wrapper is not applied twice.
"""

from __future__ import annotations

import sys
from typing import Any

from trainmem.errors import SetupError

# Fabric's precision strings → trainmem's precision (lightning/fabric/connector.py _PRECISION_INPUT); those missing
# (16-true, 64-true, transformer-engine, bitsandbytes) are refused in one line
FABRIC_PRECISIONS = {"32-true": "fp32", "32": "fp32", "bf16-mixed": "bf16-mixed", "16-mixed": "fp16-mixed",
                     "bf16-true": "bf16"}
# Accelerate's mixed_precision → trainmem's ("fp8" is refused)
ACCELERATE_PRECISIONS = {"no": "fp32", "bf16": "bf16-mixed", "fp16": "fp16-mixed"}


def is_fabric_module(model: Any) -> bool:
    kind = type(model)
    return kind.__name__ == "_FabricModule" and kind.__module__.startswith(("lightning.fabric", "lightning_fabric"))


def is_accelerate_prepared(model: Any) -> bool:
    """An instance forward written by Accelerate's prepare_model beside the `_original_forward` it kept."""
    forward = getattr(model, "__dict__", {}).get("forward")
    if forward is None or "_original_forward" not in model.__dict__:
        return False
    return str(getattr(getattr(forward, "__func__", forward), "__module__", "")).startswith("accelerate")


def trainer_of(model: Any) -> tuple[Any, dict[str, Any]]:
    """The module to trace and the setup values ({trainer, precision}) of a trainer-prepared model; the model itself
    and {} for any other."""
    if is_fabric_module(model):
        plugin = getattr(getattr(model, "_strategy", None), "precision", None)
        said = str(getattr(plugin, "precision", "32-true"))
        if said not in FABRIC_PRECISIONS:
            raise SetupError(f"expected a Fabric precision trainmem models ({', '.join(FABRIC_PRECISIONS)}), got "
                             f"{said!r}", where="model")
        return model.module, {"trainer": "fabric", "precision": FABRIC_PRECISIONS[said]}
    if is_accelerate_prepared(model):
        state = sys.modules.get("accelerate.state")
        said = str(state.AcceleratorState().mixed_precision) if state is not None else "no"
        if said not in ACCELERATE_PRECISIONS:
            raise SetupError(f"expected an Accelerate mixed_precision trainmem models "
                             f"({', '.join(ACCELERATE_PRECISIONS)}), got {said!r}", where="model")
        return model, {"trainer": "accelerate", "precision": ACCELERATE_PRECISIONS[said]}
    return model, {}


def without_accelerate_forward(copy: Any) -> Any:
    """The meta copy of an Accelerate-prepared module with its class's forward back: the copied instance forward is
    Accelerate's wrapper, which `--trainer accelerate` applies itself."""
    for name in ("forward", "_original_forward"):
        copy.__dict__.pop(name, None)
    return copy
