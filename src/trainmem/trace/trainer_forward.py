"""The model's forward as the trainer wraps it (`--trainer`, setup/trainers.py has each one's source):

- plain and lightning: the user's autocast region covers forward and loss (trace/step.py autocast_region);
  the forward is the model's own. Lightning's Trainer opens that region with autocast's cache off (a parameter
  is cast at each use, not kept until the region closes);
- fabric: `_FabricModule.forward`: convert_input, the module under the precision's forward context, then
  convert_output. Under mixed precision (bf16-mixed, 16-mixed) every floating input is cast to the low dtype
  first, autocast covers the module only, and every floating output is cast to fp32; under bf16-true every
  floating output is cast to fp32 too;
- accelerate and hf: the prepared model's forward, `convert_outputs_to_fp32(autocast(forward))` under mixed
  precision: autocast covers the module only, and each fp16/bf16 output gets an fp32 copy. The HF Trainer
  keeps trainmem's earlier rule (autocast over forward and loss, the conversion after the forward): its loss is
  computed by the model or in compute_loss, and estimates published with it stay as they were.

A converted input is a new tensor held by the wrapper's arguments until the forward returns; the original stays
with the loop's batch. A converted output replaces the module's output: the low-precision one dies unless
autograd saved it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainmem.setup import Loop, Precision, TrainingSetup, Trainer

MIXED = (Precision.FP16_MIXED, Precision.BF16_MIXED)
LIGHTNING_LOOPS = (Loop.LIGHTNING, Loop.LIGHTNING_ITERABLE)
LOW_DTYPES = {Precision.FP16_MIXED: torch.float16, Precision.BF16_MIXED: torch.bfloat16, Precision.BF16: torch.bfloat16}


def autocast_covers_loss(setup: TrainingSetup) -> bool:
    """Whether the loop's autocast region spans forward and loss (False: the trainer's wrapper opens it around
    the module alone)."""
    return not (setup.trainer in (Trainer.FABRIC, Trainer.ACCELERATE) and setup.precision in MIXED)


def autocast_caches(setup: TrainingSetup) -> bool:
    """Whether the autocast region keeps each parameter's low-precision copy until it closes (torch.autocast's
    default) or casts at each use: Lightning's Trainer opens it with cache_enabled=False (pytorch/plugins/
    precision/amp.py MixedPrecision.autocast_context_manager), its loops whether or not --trainer names it."""
    lightning = setup.trainer == Trainer.LIGHTNING or (setup.trainer is None and setup.loop in LIGHTNING_LOOPS)
    return not lightning


def wrapped_forward(call: Callable[[Any], Any], setup: TrainingSetup, autocast: Callable[[], Any], inputs: Any) -> Any:
    """The output as the loop gets it from `call(inputs)` (the module), wrapped as the setup's trainer wraps it;
    `autocast()` opens the target's autocast region (trace/step.py)."""
    trainer, precision = setup.trainer, setup.precision
    if trainer == Trainer.FABRIC and precision in (*MIXED, Precision.BF16):
        inputs = _cast_floating(inputs, LOW_DTYPES[precision], every_float=True)  # held here until we return
        if precision in MIXED:
            with autocast():
                output = call(inputs)
        else:
            output = call(inputs)
        return _cast_floating(output, torch.get_default_dtype(), every_float=True)
    if trainer == Trainer.ACCELERATE and precision in MIXED:
        with autocast():
            output = call(inputs)
        return _cast_floating(output, torch.float32, every_float=False)
    output = call(inputs)
    if setup.hf_trainer and precision in MIXED:
        output = _cast_floating(output, torch.float32, every_float=False)
    return output


def _cast_floating(value: Any, dtype: torch.dtype, every_float: bool) -> Any:
    """Fabric's apply_to_collection(_convert_fp_tensor) (`every_float`: any floating tensor, `.to(dtype)`, which
    returns the tensor itself when it has that dtype) or accelerate's convert_to_fp32 (fp16/bf16 tensors only,
    `.float()`), through tuples, lists and mappings. A plain dict (a batch) comes back as a new dict, so the
    loop's batch keeps its own tensors; another mapping (a ModelOutput) is converted in place."""
    if isinstance(value, torch.Tensor):
        if every_float:
            return value.to(dtype) if value.is_floating_point() else value
        return value.float() if value.dtype in (torch.float16, torch.bfloat16) else value
    if type(value) is dict:
        return {key: _cast_floating(item, dtype, every_float) for key, item in value.items()}
    if hasattr(value, "keys") and hasattr(value, "__setitem__"):
        for key in list(value.keys()):
            value[key] = _cast_floating(value[key], dtype, every_float)
        return value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_cast_floating(item, dtype, every_float) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_cast_floating(item, dtype, every_float) for item in value)
    return value
