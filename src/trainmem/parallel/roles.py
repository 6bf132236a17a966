"""Which ranks hold the same memory, so that one trace stands for each group.

Ranks are alike when they share the pipeline stage (each stage holds other layers), the tensor-parallel class
(TP splits each sharded weight evenly, or tp.py refuses the layout, so every TP index holds the same sizes) and
the data-parallel shard class: FSDP's dim-0 chunks leave the last ranks smaller or empty when a dimension does not
divide, and ZeroRedundancyOptimizer's greedy partition gives ranks different parameters. The data-parallel classes
come from fsdp.dp_index_classes (H2); until that exists, or for DDP, every dp index is alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.setup.layout import ParallelLayout


@dataclasses.dataclass(frozen=True)
class RankRole:
    rank: int  # the rank that is traced for this role (the lowest of `ranks`)
    ranks: tuple[int, ...]  # every rank it stands for (same memory by construction)
    label: str  # "all ranks", "pp stage 0", "dp ranks 0-6" …
    pp_index: int = 0
    dp_indices: tuple[int, ...] = (0,)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "rank": self.rank, "ranks": list(self.ranks)}


def dp_classes(layout: ParallelLayout, model_on_meta: Any) -> list[tuple[int, ...]]:
    """Groups of dp indices whose local shards have the same sizes (one group without data parallelism)."""
    if layout.dp == 1:
        return [(0,)]
    try:
        from trainmem.parallel.fsdp import dp_index_classes
    except ImportError:
        return [tuple(range(layout.dp))]
    classes = [tuple(sorted(group)) for group in dp_index_classes(model_on_meta, layout)]
    covered = sorted(i for group in classes for i in group)
    if covered != list(range(layout.dp)):  # a partition of the dp indices, or the roles would skip ranks
        raise ValueError(f"dp_index_classes must partition range({layout.dp}), got {classes}")
    return sorted(classes)


def rank_roles(layout: ParallelLayout, model_on_meta: Any) -> list[RankRole]:
    """One role per (pp stage, dp class); TP indices always share a role. Ordered by stage, then dp class."""
    layout = layout.resolve()
    classes = dp_classes(layout, model_on_meta)
    roles = []
    for stage in range(layout.pp):
        for group in classes:
            ranks = tuple(sorted(layout.rank_of(stage, d, t) for d in group for t in range(layout.tp)))
            roles.append(RankRole(ranks[0], ranks, _label(layout, stage, group, len(classes)), stage, group))
    return roles


def _label(layout: ParallelLayout, stage: int, group: tuple[int, ...], n_classes: int) -> str:
    parts = []
    if layout.pp > 1:
        parts.append(f"pp stage {stage}")
    if n_classes > 1:
        parts.append(f"dp {'index' if len(group) == 1 else 'indices'} {compact(group)}")
    if not parts:
        return "all ranks"
    return ", ".join(parts)


def compact(numbers: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5, 7, 8) -> '0-2, 5, 7-8'."""
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
