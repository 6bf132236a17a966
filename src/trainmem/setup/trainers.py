"""`--trainer`: whose code runs the user's step, as far as memory goes. Each is read from its source (versions
installed here: lightning 2.6, accelerate 1.16, transformers 5.x), and benchmarks/truth_loops.py runs the real
library on the CPU against the estimate (tests/test_trainers.py):

- `plain`: the user's own PyTorch loop (the tutorial's, `--loop inline`); `torch.autocast` around forward and loss
  under mixed precision, as PyTorch's AMP recipe writes it.
- `lightning`: `lightning.Trainer` with automatic optimization: `--loop lightning` (trace/loops.py: zero_grad
  between the forward and backward of each step, inside the closure). Its MixedPrecision plugin
  (pytorch/plugins/precision/amp.py) wraps the whole training_step, forward and loss, in autocast and converts
  nothing; without a clipping value it clips nothing.
- `fabric`: `lightning.Fabric`: the user's loop as Fabric's guide writes it (the inline loop, `fabric.backward`).
  `fabric.setup(model)` wraps the model in `_FabricModule` (fabric/wrappers.py), whose forward is
  `precision.convert_input(args)`, then the module under `precision.forward_context()`, then
  `precision.convert_output(output)`. Under bf16-mixed/16-mixed (fabric/plugins/precision/amp.py) convert_input casts
  every floating input to the low dtype before the forward, autocast covers the forward only (not the loss), and
  convert_output casts every floating output to torch's default dtype: an fp32 copy of a low-precision output
  (`_convert_fp_tensor`: `tensor.to(dst_type)`, a no-op for a tensor already fp32). bf16-true (HalfPrecision,
  half.py) converts the same way around a forward under the low default dtype.
- `accelerate`: `accelerate.Accelerator`: the inline loop (`accelerator.backward`). Under mixed precision
  `prepare(model)` (accelerator.py prepare_model) replaces the forward by
  `convert_outputs_to_fp32(autocast(forward))`: autocast covers the forward only, and every fp16/bf16 output
  tensor gets an fp32 copy (utils/operations.py).
- `hf`: transformers' Trainer, which runs Accelerate's prepared model: the `--hf-trainer` preset
  (setup/presets.py HF_TRAINER_DEFAULTS).

A trainer fills in its loop (and `hf` the Trainer's optimizer and clipping) unless the user gave them; the
wrapping of the forward is the trainer's own (trace/trainer_forward.py).
"""

from __future__ import annotations

import enum
from typing import Any

from trainmem.errors import SetupError


class Trainer(enum.StrEnum):
    PLAIN = "plain"
    LIGHTNING = "lightning"
    FABRIC = "fabric"
    ACCELERATE = "accelerate"
    HF = "hf"


# the loop each trainer runs (setup.Loop's values); the HF Trainer's comes with its preset
TRAINER_LOOPS = {"plain": "inline", "lightning": "lightning", "fabric": "inline", "accelerate": "inline"}


def reconcile(given: dict[str, Any]) -> None:
    """`--trainer hf` is `--hf-trainer`: each sets the other. Any other trainer beside --hf-trainer is a
    contradiction, said in one line."""
    trainer, hf_trainer = given.get("trainer"), given.get("hf_trainer")
    if trainer is None:
        return
    if str(trainer) == Trainer.HF:
        if hf_trainer is False:
            raise SetupError("expected --trainer hf without --no-hf-trainer (they say opposite things), got both",
                             where="--trainer")
        given["hf_trainer"] = True
    elif hf_trainer:
        raise SetupError(f"expected one trainer, got --trainer {trainer} and --hf-trainer (--trainer hf is "
                         "--hf-trainer)", where="--trainer")


def loop_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """The loop the given trainer runs, as a preset: {} for the HF Trainer (its preset has it) and no trainer."""
    loop = TRAINER_LOOPS.get(str(given.get("trainer")))
    return {} if loop is None else {"loop": loop}

