"""The planner's answer: every layout considered, those that fit ranked by headroom. No torch."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.errors import failure_groups, grouped_failures
from trainmem.plan.enumerate import Candidate
from trainmem.plan.gpus import Gpus
from trainmem.units import format_bytes

EVALUATED = ("fits", "does not fit", "ruled out")  # statuses that are a verdict (ruled out: by model states alone)


@dataclasses.dataclass(frozen=True)
class PlanRow:
    candidate: Candidate
    status: str  # "fits" | "does not fit" | "ruled out" (model states alone) | "failed" (could not be traced) |
    # "skipped" (fits with fewer knobs, or a smaller micro-batch already does not fit) | "not evaluated" (time limit)
    peak_bytes: int | None = None  # the most loaded rank's high process figure (reuse.py: never below a full estimate)
    phase: str = ""  # where that peak is
    dominant: str = ""  # the largest category there
    breakdown: dict[str, int] = dataclasses.field(default_factory=dict)
    rank: str = ""  # which rank role ("all ranks", "pp stage 3")
    why: str = ""  # for ruled out / failed / skipped: the reason; else how the figure was made

    def headroom(self, capacity: int) -> int | None:
        return None if self.peak_bytes is None else capacity - self.peak_bytes

    def to_dict(self, capacity: int) -> dict[str, Any]:
        return {"layout": self.candidate.to_dict(), "label": self.candidate.label(), "status": self.status,
                "peak_bytes": self.peak_bytes, "headroom_bytes": self.headroom(capacity), "phase": self.phase,
                "dominant": self.dominant, "breakdown": dict(self.breakdown), "rank": self.rank, "why": self.why}


@dataclasses.dataclass(frozen=True)
class PlanResult:
    model_name: str
    parameters: int
    gpus: Gpus
    gpus_per_node: int
    budget: int  # a layout fits when its figure is at most this (capacity less the margin)
    margin: float
    margin_source: str
    rows: tuple[PlanRow, ...]
    reuse: str  # how traces were reused, in words
    traces: int  # rank-role traces run
    seconds: float
    notes: tuple[str, ...] = ()
    top: int = 20
    predicted: int = 0  # rank-role traces predicted from two traced micro-batches
    cached: int = 0  # of `traces`, those read from the trace cache (trace/cache_store.py)
    jobs: int = 1  # worker processes that traced (workers.py)

    @property
    def fitting(self) -> list[PlanRow]:
        """The layouts that fit, most headroom first (then fewer pipeline stages and less tensor parallelism,
        the simpler layout)."""
        rows = [r for r in self.rows if r.status == "fits"]
        return sorted(rows, key=lambda r: (r.peak_bytes, r.candidate.pp, r.candidate.tp, r.candidate.label()))

    @property
    def best(self) -> PlanRow | None:
        rows = self.fitting
        return rows[0] if rows else None

    @property
    def failed(self) -> list[PlanRow]:
        """The layouts that could not be evaluated, each with its reason in `why`."""
        return [r for r in self.rows if r.status == "failed"]

    @property
    def failures(self) -> list[tuple[str, str]]:
        """(layout label, reason) of each failed layout."""
        return [(r.candidate.label(), r.why) for r in self.failed]

    @property
    def evaluated(self) -> int:
        """How many layouts got a verdict (fits, does not fit, ruled out): "no layout fits" needs at least one."""
        return sum(r.status in EVALUATED for r in self.rows)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row.status] = out.get(row.status, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        from trainmem import __version__

        capacity = self.gpus.device.capacity_bytes
        return {"trainmem_version": __version__, "model": {"name": self.model_name, "parameters": self.parameters},
                "gpus": {**self.gpus.to_dict(), "gpus_per_node": self.gpus_per_node}, "budget_bytes": self.budget,
                "margin": self.margin, "margin_source": self.margin_source, "counts": self.counts(),
                "fits": [row.to_dict(capacity) for row in self.fitting],
                "not_fitting": [row.to_dict(capacity) for row in self.rows if row.status != "fits"],
                "failures": failure_groups(self.failures), "reuse": self.reuse, "traces": self.traces,
                "cached_traces": self.cached, "predicted_traces": self.predicted, "jobs": self.jobs,
                "seconds": round(self.seconds, 2), "notes": list(self.notes)}

    def __str__(self) -> str:
        capacity = self.gpus.device.capacity_bytes
        counts = ", ".join(f"{n:,} {status}" for status, n in sorted(self.counts().items()))
        lines = [f"trainmem plan — {self.model_name} ({self.parameters:,} parameters) on {self.gpus.count:,} × "
                 f"{self.gpus.device.name} ({format_bytes(capacity)} each, {self.gpus_per_node} per node)",
                 f"  a layout fits when its most loaded rank's high figure ≤ {format_bytes(self.budget)} "
                 f"(a {self.margin:.0%} margin: {self.margin_source})",
                 f"  {len(self.rows):,} layouts: {counts}; {self.traces:,} rank traces ("
                 + (f"{self.cached:,} of them from the trace cache, " if self.cached else "")
                 + f"and {self.predicted:,} predicted) in {self.seconds:.1f} s"
                 + (f", {self.jobs} worker processes" if self.jobs > 1 else ""),
                 f"  reuse: {self.reuse}", ""]
        fitting = self.fitting
        waiting = self.counts().get("not evaluated", 0)
        failed = len(self.failed)
        if not fitting and failed:
            lines.append(f"No layout evaluated fits ({self.evaluated:,} evaluated; {failed:,} failed, below)."
                         + (f" {waiting:,} not evaluated within the time limit." if waiting else ""))
        elif not fitting and waiting:
            lines.append(f"No layout evaluated fits; {waiting:,} not evaluated within the time limit.")
        elif not fitting:  # exit 2 where nothing was evaluated (cli/commands/plan.py): not a verdict
            lines.append("No layout fits." if self.evaluated else
                         "No layout was evaluated: these options and GPUs leave none to try.")
        else:
            lines.append(f"Layouts that fit, most headroom first ({min(self.top, len(fitting))} of {len(fitting):,}):")
            lines.append(f"  {'layout':<52} {'per-rank peak':>13} {'headroom':>10}  peak in / largest")
            for row in fitting[:self.top]:
                lines.append(f"  {row.candidate.label():<52} {format_bytes(row.peak_bytes):>13} "
                             f"{format_bytes(row.headroom(capacity)):>10}  {row.phase} / {row.dominant}"
                             + (f" ({row.rank})" if row.rank not in ("", "all ranks") else ""))
        if fitting and waiting:
            lines.append(f"({waiting:,} layouts not evaluated within the time limit: their figures are unknown)")
        lines += grouped_failures(self.failures, "layouts")
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)
