"""A model's repeated blocks, and the same model with fewer of them (for the planner, plan/blocks.py, and for
composing a trace from a few blocks, trace/block_reuse.py).

The repeated blocks are the model's outermost nn.ModuleList, when it is the only outermost one and every block
has the type and parameter shapes of the first. A variant with k blocks is a deep copy of the model (on the meta
device: nothing allocated) made while that list is cut to its first k blocks, so the embeddings, the head and
every other module stay as they are. A Hugging Face model also reads its block count from its config
(`num_hidden_layers`: LlamaModel.forward iterates `self.layers[: config.num_hidden_layers]`), which the copy's
config is told.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

# config attributes that count the blocks (transformers' names; frontends/hf.py lists the same family)
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# plain values a block keeps about itself; a block's index under these names is not a difference between blocks
_PLAIN = (bool, int, float, str, type(None))
INDEX_NAMES = frozenset({"layer_idx", "layer_id", "layer_index", "block_idx", "idx", "index", "layer_number"})


@dataclasses.dataclass(frozen=True)
class RepeatedBlocks:
    path: str  # the ModuleList's qualified name
    count: int


def shapes(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(type(module).__name__, "")] + [(n, tuple(p.shape)) for n, p in module.named_parameters()]


def repeated_blocks(model: torch.nn.Module) -> RepeatedBlocks | None:
    """The outermost ModuleList of blocks alike in type and parameter shapes (at least 2), or None."""
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    outer = [(n, m) for n, m in lists if not any(n.startswith(o + ".") for o, _ in lists if o != n)]
    if len(outer) != 1 or len(outer[0][1]) < 2 or not outer[0][0]:
        return None
    path, blocks = outer[0]
    first = shapes(blocks[0])
    if any(shapes(block) != first for block in blocks):
        return None
    return RepeatedBlocks(path, len(blocks))


def settings(block: torch.nn.Module, index: int) -> list[tuple[str, str, object]]:
    """Every plain attribute of the block's modules (a sliding window, an attention type, a flag), except the
    block's own index under an index's name."""
    out = []
    for name, module in block.named_modules():
        out.append((name, "type", type(module).__name__))
        for key, value in vars(module).items():
            if isinstance(value, _PLAIN) and not key.startswith("_") and not (key in INDEX_NAMES and value == index):
                out.append((name, key, value))
    return out


MAX_PERIOD = 8  # the longest pattern of unlike blocks composed (Gemma-3: five sliding layers, then a global one)


def block_period(model: torch.nn.Module, found: RepeatedBlocks, groups: int) -> tuple[int, str | None]:
    """(p, None) for the shortest p after which the blocks repeat — block i alike block i mod p in every setting and
    every per-block entry of the config (Gemma-2 alternates sliding and global layers: p = 2) — with `groups` runs
    of p blocks at least and the count a multiple of p; (1, why the blocks are not interchangeable) when none."""
    why = differing_settings(model, found)
    if why is None:
        return 1, None
    blocks = model.get_submodule(found.path)
    every = [settings(block, index) for index, block in enumerate(blocks)]
    lists = [value for value in _config_values(model) if isinstance(value, (list, tuple)) and len(value) == found.count]
    for period in range(2, min(MAX_PERIOD, found.count // groups) + 1):
        if found.count % period == 0 and all(every[i] == every[i % period] for i in range(found.count)) and \
                all(repr(value[i]) == repr(value[i % period]) for value in lists for i in range(found.count)):
            return period, None
    return 1, why


def _config_values(model: torch.nn.Module) -> list:
    config = getattr(model, "config", None)
    return list(vars(config).values()) if config is not None and hasattr(config, "__dict__") else []


def differing_settings(model: torch.nn.Module, found: RepeatedBlocks) -> str | None:
    """Why the blocks are not interchangeable, or None: a setting that differs between blocks (Gemma's sliding
    and global layers, a GPT-Neo's local attention), or a list in the config with one entry per block that are
    not all equal (`layer_types`: a forward that reads its layer's entry by index)."""
    blocks = model.get_submodule(found.path)
    first = settings(blocks[0], 0)
    for index, block in enumerate(blocks):
        mine = settings(block, index)
        if mine != first:
            name, key, value = next(d for d in mine if d not in first)
            return f"block {index} differs from block 0 in {name + '.' if name else ''}{key} = {value!r}"
    config = getattr(model, "config", None)
    for key, value in (vars(config).items() if config is not None and hasattr(config, "__dict__") else ()):
        if isinstance(value, (list, tuple)) and len(value) == found.count and len({repr(v) for v in value}) > 1:
            return f"the config's {key} differs between blocks"
    return None


def with_blocks(model: torch.nn.Module, path: str, k: int) -> torch.nn.Module:
    """A deep copy of `model` with the first k blocks of the list at `path` (its config told k, and its lists of one
    entry per block cut to their first k: Gemma-2's `layer_types`, which its cache and masks follow)."""
    parent_name, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_name)
    whole = getattr(parent, attr)
    setattr(parent, attr, torch.nn.ModuleList(list(whole)[:k]))
    try:
        variant = copy.deepcopy(model)
    finally:
        setattr(parent, attr, whole)
    config = getattr(variant, "config", None)
    for key in LAYER_COUNT_KEYS:
        if config is not None and isinstance(getattr(config, key, None), int):
            setattr(config, key, k)
    for key, value in list(vars(config).items()) if config is not None and hasattr(config, "__dict__") else ():
        if isinstance(value, list) and len(value) == len(whole):
            setattr(config, key, value[:k])
    return variant
