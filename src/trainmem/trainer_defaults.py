"""The optimizer transformers' Trainer builds when TrainingArguments.optim is not given: it depends on torch.

transformers/training_args.py (5.x, TrainingArguments.optim): ``default_optim = "adamw_torch"``, and
``"adamw_torch_fused"`` when ``pytorch_utils.is_torch_greater_or_equal_than_2_8``, which is
``is_torch_greater_or_equal("2.8", accept_dev=True)``: the base version of the installed torch (read from
its package metadata, so 2.8.0.dev20250601 counts as 2.8) against 2.8. trainer_optimizer.py
``_get_adamw_torch`` builds ``torch.optim.AdamW`` for both, adding ``fused=True`` only for the fused
name; plain ``adamw_torch`` passes no implementation, so torch picks (foreach on CUDA tensors).
So under torch 2.6 or 2.7 the Trainer's default AdamW is torch's default implementation, not fused.
"""

from __future__ import annotations

import importlib.metadata
import re

# training_args.py: the fused AdamW is the default from torch 2.8 on
FUSED_DEFAULT_SINCE = (2, 8)


# a torch version: major.minor, an optional patch, and a local or pre-release tail (+cu124, .dev20250601)
_VERSION = re.compile(r"(\d+)\.(\d+)(\.\d+)?([+.\w-]*)")


def release_of(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string ("2.6.0+cu124", "2.8.0.dev20250601", "1.13"); None for other text."""
    match = _VERSION.fullmatch(version.strip())
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def _base_release(version: str) -> tuple[int, int]:
    release = release_of(version)
    if release is None:
        raise ValueError(f"expected a torch version like 2.6.0, got {version!r}")
    return release


def installed_torch_version() -> str | None:
    """The installed torch's version as transformers reads it (package metadata, no import of torch); None
    where torch is not installed (a Keras-on-TensorFlow environment: setup.py asks at import)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a torch built from source, not installed as a package
        try:
            import torch
        except ImportError:
            return None
        return torch.__version__


def trainer_optimizer_impl(torch_version: str | None = None) -> str:
    """The AdamW implementation (a setup.OptimizerImpl value) the Trainer's default optim asks for; without
    torch, the one for the torch `pip install 'trainmem[torch]'` would bring (2.8 or newer: fused)."""
    version = installed_torch_version() if torch_version is None else torch_version
    if version is None:
        return "fused"
    return "fused" if _base_release(version) >= FUSED_DEFAULT_SINCE else "default"


def trainer_optim_name(torch_version: str | None = None) -> str:
    """The TrainingArguments.optim default, as transformers names it."""
    return "adamw_torch_fused" if trainer_optimizer_impl(torch_version) == "fused" else "adamw_torch"
