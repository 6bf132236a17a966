"""Activation checkpointing per block with torch.utils.checkpoint (non-reentrant).

Blocks are, in this order of preference: the elements of the model's outermost nn.ModuleLists
(transformer layers); else the parameter-holding direct children of the model, where a plain
nn.Sequential child of containers (torchvision's `features`, ResNet's `layer1`…) stands for its own
parameter-holding children, recursively: CNN stages become their residual/inverted-residual blocks, the
granularity timm's set_grad_checkpointing uses. A head such as Sequential(Dropout(inplace=True), Linear)
is checkpointed at its Linear, leaving the in-place dropout outside (checkpointing a block that modifies
its input in place fails in PyTorch too: recomputation meets the modified input).
Each block's forward is replaced by one that runs it under checkpoint(), so only the block's inputs are
saved and its inside is recomputed in backward.
"""

from __future__ import annotations

import contextlib
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
    return [block for name, child in model.named_children() if _has_parameters(child)
            for block in _blocks_within(name, child)]


def _blocks_within(name: str, module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """A plain nn.Sequential of containers (a stage of blocks) is split into its blocks; one of leaf layers
    (conv, norm, activation) is a block itself, unless its first layer works in place on the block's
    input (Dropout(inplace=True) before a Linear), which a checkpointed block may not do."""
    if type(module) is not torch.nn.Sequential:  # a subclass may have its own forward: keep it whole
        return [(name, module)]
    children = list(module.named_children())
    stage = any(any(True for _ in child.children()) for _, child in children)
    modifies_input = bool(children) and getattr(children[0][1], "inplace", False)
    if not stage and not modifies_input:
        return [(name, module)]
    return [block for child_name, child in children if _has_parameters(child)
            for block in _blocks_within(f"{name}.{child_name}", child)]


def _checkpointed_forward(block, original, *args, **kwargs):
    return checkpoint(original, *args, use_reentrant=False, context_fn=functools.partial(_contexts, block), **kwargs)


def _contexts(block: torch.nn.Module):
    """(forward, recomputation) contexts: checkpoint() recomputes with the block's forward itself, not through
    the module's call, so the trace's module tracker is told the block runs (else the recomputed ops outside its
    submodules would keep the module that ran before: the next block's)."""
    from trainmem.trace.modules import ModuleTracker

    tracker = ModuleTracker.active
    return contextlib.nullcontext(), (tracker.running(block) if tracker is not None else contextlib.nullcontext())


def checkpoint_blocks(model: torch.nn.Module) -> list[str]:
    names = []
    for name, block in find_blocks(model):
        block.forward = functools.partial(_checkpointed_forward, block, block.forward)
        names.append(name)
    return names
