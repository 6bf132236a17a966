"""The model's repeated blocks, and the same model with fewer of them (reuse.py, 1.), as trace/block_variants.py
finds and cuts them. Models without such a list (an MLP, a CNN of unlike stages) are traced whole.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from trainmem.frontends import ModelSource
from trainmem.trace import step as training
from trainmem.trace.block_variants import repeated_blocks, with_blocks
from trainmem.trace.meta_build import building_on_meta


@dataclasses.dataclass
class ModelFacts:
    parameters: int
    blocks: int  # repeated identical blocks (0: none found, the model is traced whole)
    list_path: str  # the ModuleList's qualified name
    row_elements: int  # one dim-0 row of every parameter tensor: what padding can add per rank (reuse.py, 3.)
    model: torch.nn.Module  # the full model on meta
    extras: tuple = ()  # the factory's make_batch / loss_fn, when it returned them
    unit_parameters: int = 0  # the largest repeated block's parameters (the whole model's without blocks)


def model_facts(source: ModelSource) -> ModelFacts:
    with building_on_meta():
        built = source.build()
    model, *extras = training.unpack_built(built, source)
    parameters = sum(p.numel() for p in model.parameters())
    rows = sum(p[0].numel() if p.dim() > 0 else 1 for p in model.parameters())
    found = repeated_blocks(model)
    if found is None:
        return ModelFacts(parameters, 0, "", rows, model, tuple(extras), parameters)
    unit = max(sum(p.numel() for p in block.parameters()) for block in model.get_submodule(found.path))
    return ModelFacts(parameters, found.count, found.path, rows, model, tuple(extras), unit)


def variant(source: ModelSource, facts: ModelFacts, k: int) -> ModelSource:
    """The source whose build gives the model with its first k blocks (k = facts.blocks: the model itself)."""
    if facts.blocks == 0 or k >= facts.blocks:
        return source

    def build() -> Any:
        model = with_blocks(facts.model, facts.list_path, k)
        return (model, *facts.extras) if facts.extras else model

    return dataclasses.replace(source, build=build)
