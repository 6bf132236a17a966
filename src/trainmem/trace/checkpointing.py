"""Activation checkpointing per block with torch.utils.checkpoint (non-reentrant).

Blocks are, in this order of preference: the elements of the model's outermost nn.ModuleLists
(transformer layers); else the parameter-holding children of a top-level nn.Sequential; else the
parameter-holding direct children of the model. Each block's forward is replaced by one that runs it
under checkpoint(), so only the block's inputs are saved and its inside is recomputed in backward.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint


def _has_parameters(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters())


def find_blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    outermost = [(name, m) for name, m in lists
                 if not any(name.startswith(other + ".") for other, _ in lists if other != name)]
    if outermost:
        return [(f"{name}.{i}", block) for name, module_list in outermost for i, block in enumerate(module_list)]
    return [(name, child) for name, child in model.named_children() if _has_parameters(child)]


def _checkpointed_forward(original, *args, **kwargs):
    return checkpoint(original, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: torch.nn.Module) -> list[str]:
    names = []
    for name, block in find_blocks(model):
        block.forward = functools.partial(_checkpointed_forward, block.forward)
        names.append(name)
    return names
