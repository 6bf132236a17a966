"""Layouts ruled out by a traced sibling: moving state to host RAM never adds GPU memory beyond a unit's copies.

The same layout with more offloaded (none < optimizer < params, setup/layout.py Offload) holds less on the GPU:
offloading moves the optimizer state (and with `params` the sharded parameters and gradients) of every unit to host
RAM, and adds at most transient copies of one unit's parameters and gradients on their way between host and GPU.
So when the layout with the most offload does not fit, by more than SLACK, neither does the same layout with less
at that micro-batch or any larger one (more samples never need less memory), and those need no trace.

Measured on tests/test_plan.py's TINY_LLAMA (seq 64, AdamW, dp 2, bf16-mixed, checkpointing on and off; FSDP,
ZeRO-1/2/3): the planner's figures with more offload were at most 6 MiB above those with less, at 1.5 GiB per rank
(the figures round each (phase, category) up to whole MiB, reuse.py); with hidden size 512 and seq 256 every
step of offload lowered the figure, by 60-260 MiB. SLACK covers both: the rounding of up to 16 categories and two
copies of the largest block's parameters in fp32.

Which layouts are worth a probe: tracing the most-offload layout first costs a trace when a less intrusive one
turns out to fit (it would have been skipped). The planner probes only where the model states alone take at
least PROBE_FLOOR of the budget on the least-offloading layout of the chain, where the activations usually tip it
over.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from trainmem.plan.enumerate import Candidate
from trainmem.plan.plan_result import PlanRow
from trainmem.setup.layout import Offload
from trainmem.units import format_bytes

MiB = 1 << 20
ROUNDING_SLACK = 16 * MiB  # reuse.py rounds each (phase, category) up to MiB: at most 16 categories
PROBE_FLOOR = 0.5  # model states take at least half the budget: probe the most offload first


@dataclasses.dataclass
class OffloadOrder:
    """Per checkpointing setting, the offload of the layout found not to fit by more than the slack and why (it
    holds for the micro-batch it was found at and every larger one: evaluation goes up in micro-batch)."""

    budget: int
    slack: int  # ROUNDING_SLACK + two fp32 copies of the largest block's parameters (module docstring)
    floor: Callable[[Candidate], int]  # states.py's model-state floor of a candidate
    assess: Callable[[Candidate], PlanRow]
    dead: dict[bool, tuple[Offload, str]] = dataclasses.field(default_factory=dict)

    def probe(self, members: list[Candidate]) -> dict[Candidate, PlanRow]:
        """Rows of the most-offload member of each checkpointing chain at one micro-batch, assessed ahead of the
        others where the chain's least-offloading member's states take at least PROBE_FLOOR of the budget."""
        rows = {}
        for ckpt in (False, True):
            chain = sorted((c for c in members if c.checkpointing == ckpt), key=lambda c: offload_rank(c.offload))
            if len(chain) < 2 or ckpt in self.dead or self.floor(chain[0]) < PROBE_FLOOR * self.budget:
                continue
            most = chain[-1]
            rows[most] = row = self.assess(most)
            if row.status == "does not fit" and row.peak_bytes > self.budget + self.slack:
                self.dead[ckpt] = (most.offload, f"{most.label()} needs {format_bytes(row.peak_bytes)}; less offload "
                                   "never needs less GPU memory, nor more samples")
        return rows

    def ruled_out(self, candidate: Candidate) -> PlanRow | None:
        """The row of a candidate the probes rule out (less offload than a chain's that does not fit), else None."""
        found = self.dead.get(candidate.checkpointing)
        if found is None:
            return None
        offload, why = found
        if offload_rank(candidate.offload) >= offload_rank(offload):
            return None
        return PlanRow(candidate, "ruled out", why=why)


def offload_rank(offload: Offload) -> int:
    """How much is offloaded: none 0 < optimizer 1 < params 2 (Offload's own order)."""
    return list(Offload).index(offload)
