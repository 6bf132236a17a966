"""How the model's weights arrive before training: `--load`, `--resume`, `--checkpoint-dtype`. No torch here.

A run that starts from a checkpoint holds the checkpoint's tensors beside the model's own while it copies them in,
and a run that resumes also reads the optimizer's state from it. trace/checkpoint_load.py runs the code each choice
stands for on the fake tensors, so its allocations are part of the traced run (phase "load").
"""

from __future__ import annotations

import enum
from typing import Any

from trainmem.errors import SetupError

CHECKPOINT_DTYPES = ("fp32", "bf16", "fp16")


class Load(enum.StrEnum):
    NONE = "none"  # the model is built where it trains: no checkpoint is read
    # state = torch.load(path, map_location=<the device>); model.load_state_dict(state); del state
    STATE_DICT = "state-dict"
    # state = torch.load(path, map_location="cpu"); model.load_state_dict(state): copies onto the device
    STATE_DICT_CPU = "state-dict-cpu"


CODE = {
    Load.STATE_DICT: "checkpoint = torch.load(path, map_location=<the device>); model.load_state_dict(...)",
    Load.STATE_DICT_CPU: "checkpoint = torch.load(path, map_location=\"cpu\"); model.load_state_dict(...)",
}


def check_loading(setup: Any) -> None:
    """One line for a combination the load is not modelled for (SetupError, exit 2)."""
    if setup.load == Load.NONE:
        for name, flag in (("resume", "--resume"), ("checkpoint_dtype", "--checkpoint-dtype")):
            if getattr(setup, name):
                raise SetupError(f"expected --load state-dict|state-dict-cpu with {flag}, got --load none", where=flag)
        return
    if setup.checkpoint_dtype is not None and setup.checkpoint_dtype not in CHECKPOINT_DTYPES:
        raise SetupError(f"expected {'|'.join(CHECKPOINT_DTYPES)}, got {setup.checkpoint_dtype!r}",
                         where="--checkpoint-dtype")
    if setup.parallel.distributed:
        raise SetupError("expected one process with --load (a checkpoint loaded by many ranks is not modelled), "
                         f"got --strategy {setup.parallel.strategy}", where="--load")
    if setup.resume and str(setup.optimizer) in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw"):
        raise SetupError("expected a torch.optim optimizer with --resume (bitsandbytes' 8-bit and paged states are "
                         f"not read back from a checkpoint here), got --optimizer {setup.optimizer}", where="--resume")
    if setup.qlora:
        raise SetupError("expected --load none with --qlora (4-bit weights are quantized while from_pretrained "
                         "loads them, not read from a state dict), got --load " + str(setup.load), where="--load")


def load_words(setup: Any) -> str:
    """What the traced load stands for, in the user's code."""
    dtype = f", floating tensors stored as {setup.checkpoint_dtype}" if setup.checkpoint_dtype else ""
    what = "the model's and the optimizer's state" if setup.resume else "the model's state dict"
    then = "; optimizer.load_state_dict(...)" if setup.resume else ""
    return f"{CODE[setup.load]}{then}; the checkpoint holds {what}{dtype}; then `del checkpoint`"
