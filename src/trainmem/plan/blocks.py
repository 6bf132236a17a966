"""The model's repeated blocks, and the same model with fewer of them (reuse.py, 1.).

The model is built once on the meta device (nothing allocated); a variant with k blocks is a deep copy made
while its outermost nn.ModuleList (trace/checkpointing.py find_blocks) is cut to its first k blocks, so the
embeddings, the head and every other module stay as they are. A Hugging Face model also reads its block count
from its config (`num_hidden_layers`: LlamaModel.forward iterates `self.layers[: config.num_hidden_layers]`),
which the copy's config is told. Blocks are alike when each has the same type and parameter shapes as the
first; models without such a list (an MLP, a CNN of unlike stages) are traced whole.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from trainmem.frontends import ModelSource
from trainmem.trace import step as training
from trainmem.trace.meta_build import building_on_meta

# config attributes that count the blocks (transformers' names; frontends/hf.py lists the same family)
LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


@dataclasses.dataclass
class ModelFacts:
    parameters: int
    blocks: int  # repeated identical blocks (0: none found, the model is traced whole)
    list_path: str  # the ModuleList's qualified name
    row_elements: int  # one dim-0 row of every parameter tensor: what padding can add per rank (reuse.py, 3.)
    model: torch.nn.Module  # the full model on meta
    extras: tuple = ()  # the factory's make_batch / loss_fn, when it returned them


def _shapes(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(type(module).__name__, "")] + [(n, tuple(p.shape)) for n, p in module.named_parameters()]


def model_facts(source: ModelSource) -> ModelFacts:
    with building_on_meta():
        built = source.build()
    model, *extras = training.unpack_built(built, source)
    parameters = sum(p.numel() for p in model.parameters())
    rows = sum(p[0].numel() if p.dim() > 0 else 1 for p in model.parameters())
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    outer = [(n, m) for n, m in lists if not any(n.startswith(o + ".") for o, _ in lists if o != n)]
    if len(outer) != 1 or len(outer[0][1]) < 2:
        return ModelFacts(parameters, 0, "", rows, model, tuple(extras))
    path, blocks = outer[0]
    first = _shapes(blocks[0])
    if any(_shapes(block) != first for block in blocks):
        return ModelFacts(parameters, 0, "", rows, model, tuple(extras))
    return ModelFacts(parameters, len(blocks), path, rows, model, tuple(extras))


def _cut(model: torch.nn.Module, path: str, k: int) -> torch.nn.Module:
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
    return variant


def variant(source: ModelSource, facts: ModelFacts, k: int) -> ModelSource:
    """The source whose build gives the model with its first k blocks (k = facts.blocks: the model itself)."""
    if facts.blocks == 0 or k >= facts.blocks:
        return source

    def build() -> Any:
        model = _cut(facts.model, facts.list_path, k)
        return (model, *facts.extras) if facts.extras else model

    return dataclasses.replace(source, build=build)
