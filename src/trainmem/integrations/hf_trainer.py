"""Hugging Face's Trainer: `MemoryCheckCallback`, a TrainerCallback that estimates the run as the Trainer is about
to execute it and stops it, with one line, before the first step when it does not fit.

`on_train_begin` runs inside Trainer._inner_training_loop after the model was moved to its device, gradient
checkpointing was turned on in the model (gradient_checkpointing_enable: the model's own layers checkpoint, so the
estimate adds no checkpointing of its own) and the optimizer was created (create_optimizer_and_scheduler), and
before the first batch is loaded: so the run is read off the live objects (integrations/live.py) and the
TrainingArguments:
- per_device_train_batch_size, gradient_accumulation_steps, max_grad_norm;
- bf16 / fp16 → bf16-mixed / fp16-mixed (a model whose weights are all bf16 trains in pure bf16);
- the Trainer's loop and its defaults (--hf-trainer: outputs to fp32 under mixed precision, the loss kept
  detached, model.zero_grad after the step);
- one batch: the train dataloader's collate_fn over its dataset's first samples (live.first_batch: no iterator is
  made, so the sampler's random state is left as it was).
A run on several processes without DeepSpeed or FSDP is the Trainer's DistributedDataParallel: --strategy ddp over
args.world_size ranks, with ddp_bucket_cap_mb; every rank checks its own device, so that no rank goes on alone.
DeepSpeed and FSDP runs are refused in one line (their sharding is not read from the arguments yet; the Trainer's
FSDP is FSDP1, which trainmem does not model).
"""

from __future__ import annotations

import logging
from typing import Any

from trainmem.errors import SetupError
from trainmem.install_hints import require

transformers = require("transformers", "hf")

LOG = logging.getLogger("trainmem")


class MemoryCheckCallback(transformers.TrainerCallback):
    """Estimate the training run at its start; raise DoesNotFit (a MemoryError) when it does not fit the memory the
    device has now. `device`: plan for another device instead (a catalog name such as "a100-80gb", whose whole
    capacity is then the room); `margin`: as trainmem fit's; `raise_if_not_fit=False` only logs. The last
    Check is kept in `self.check`."""

    def __init__(self, device: Any = None, margin: float | None = None, raise_if_not_fit: bool = True,
                 **setup_values: Any) -> None:
        self.device, self.margin, self.raise_if_not_fit = device, margin, raise_if_not_fit
        self.setup_values = setup_values
        self.check: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        from trainmem.integrations.guard import DoesNotFit, check
        from trainmem.integrations.live import first_batch

        if train_dataloader is None:
            raise SetupError("expected the Trainer's train dataloader, got none", where="MemoryCheckCallback")
        self.check = check(model, optimizer, first_batch(train_dataloader), libraries=trainer_libraries(),
                           device=self.device, margin=self.margin, **{**trainer_values(args), **self.setup_values})
        if state.is_world_process_zero:
            LOG.info("trainmem: %s", self.check.reason)
        if not self.check.fits and self.raise_if_not_fit:
            raise DoesNotFit(self.check)


def trainer_libraries() -> tuple[str, ...]:
    """transformers' Trainer imports peft where it is installed (trainer.py: is_peft_available), so the training
    process holds peft whether or not the model uses it."""
    import sys

    return ("transformers", "peft") if "peft" in sys.modules else ("transformers",)


def trainer_values(args: Any) -> dict[str, Any]:
    """The setup values TrainingArguments decide (module docstring)."""
    if getattr(args, "deepspeed", None) or getattr(args, "fsdp", None):
        raise SetupError("expected a single-device Trainer run (DeepSpeed and FSDP settings are not read yet), got "
                         f"{'deepspeed' if args.deepspeed else 'fsdp=' + repr(args.fsdp)}", where="TrainingArguments")
    values: dict[str, Any] = {"hf_trainer": True, "grad_accum": args.gradient_accumulation_steps,
                              "max_grad_norm": args.max_grad_norm if args.max_grad_norm else "none"}
    if args.world_size > 1:  # several processes, neither DeepSpeed nor FSDP: the Trainer wraps the model in DDP
        values.update(strategy="ddp", world_size=args.world_size)
        if getattr(args, "ddp_bucket_cap_mb", None):
            values["ddp_bucket_mb"] = float(args.ddp_bucket_cap_mb)
    if args.bf16:
        values["precision"] = "bf16-mixed"
    elif args.fp16:
        values["precision"] = "fp16-mixed"
    return values
