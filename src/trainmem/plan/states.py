"""A lower bound of each layout's per-rank memory from the parameter count alone, to leave out layouts that
cannot fit before anything is traced. No torch.

During the second step's `optimizer.step()` every rank holds its parameters, their gradients and the optimizer's
state at once (trace/step.py runs two steps; gradients are freed only by the zero_grad after the step). Each is
at least the mean rank's share: N / (tp · pp) elements (TP replicates norms, so a TP rank holds at least 1/tp;
the heaviest pipeline stage at least the mean), divided by the degree that shards it:
  parameters   fsdp, zero3: dp; hsdp: its shard degree; ddp, zero1, zero2: 1      (4 bytes: fp32 master weights)
  gradients    fsdp, zero2, zero3: dp; hsdp: its shard degree; ddp, zero1: 1      (4 bytes, fp32 as the weights)
  optimizer    every sharded kind: dp (hsdp: shard degree); ddp: 1                (bytes per element: STATE_BYTES)
Offload moves the optimizer state (and with `params`, parameters and gradients too) to host RAM: 0 on the GPU.
Frozen parameters have neither gradients nor state; with --freeze, --lora or --qlora only parameters count.
"""

from __future__ import annotations

import math

from trainmem.setup.layout import Offload, ParallelLayout, Strategy
from trainmem.setup import Optimizer, Precision, TrainingSetup

# Bytes of optimizer state per trainable element (torch.optim's state dicts; trace/optimizers.py for the rest):
# Adam/AdamW exp_avg + exp_avg_sq (2 × fp32); SGD with momentum, RMSprop square_avg, Adagrad sum, Lion exp_avg
# (1 × fp32); plain SGD none; Adafactor's factored rows and columns and 8-bit AdamW's 2 × 1 byte rounded down to
# what is certain (0 and 2) — a lower bound may only err low.
STATE_BYTES = {Optimizer.ADAM: 8, Optimizer.ADAMW: 8, Optimizer.MOMENTUM: 4, Optimizer.RMSPROP: 4,
               Optimizer.ADAGRAD: 4, Optimizer.LION: 4, Optimizer.SGD: 0, Optimizer.ADAFACTOR: 0,
               Optimizer.ADAMW_8BIT: 2, Optimizer.PAGED_ADAMW_8BIT: 0,
               Optimizer.PAGED_ADAMW: 0}  # paged: managed memory, may page out
SHARD_PARAMS = (Strategy.FSDP, Strategy.HSDP, Strategy.ZERO3)
SHARD_GRADS = (Strategy.FSDP, Strategy.HSDP, Strategy.ZERO2, Strategy.ZERO3)
SHARD_STATE = (Strategy.FSDP, Strategy.HSDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3)


def _shard(layout: ParallelLayout, kinds: tuple[Strategy, ...]) -> int:
    if layout.strategy not in kinds:
        return 1
    return layout.hsdp_shard if layout.strategy == Strategy.HSDP else layout.dp


def model_state_floor(parameters: int, layout: ParallelLayout, setup: TrainingSetup) -> int:
    """Bytes every layout's most loaded rank holds at least (module docstring)."""
    local = math.ceil(parameters / (layout.tp * layout.pp))
    weight_bytes = 2 if setup.precision == Precision.BF16 else 4
    on_gpu_params = layout.offload != Offload.PARAMS
    on_gpu_state = layout.offload == Offload.NONE
    total = math.ceil(local / _shard(layout, SHARD_PARAMS)) * weight_bytes if on_gpu_params else 0
    if setup.freeze or setup.lora or setup.qlora:
        return total
    if on_gpu_params:
        total += math.ceil(local / _shard(layout, SHARD_GRADS)) * weight_bytes
    if on_gpu_state:
        state = STATE_BYTES.get(setup.optimizer, 0) // (2 if setup.precision == Precision.BF16 else 1)
        total += math.ceil(local / _shard(layout, SHARD_STATE)) * state
    return total
