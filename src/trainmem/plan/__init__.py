"""`trainmem plan MODEL --gpus 8xh100-80gb`: the layouts that fit, ranked by headroom.

    plan(model, gpus="8xh100-80gb", *, setup=None, gpus_per_node=8, **setup_values) -> PlanResult

How traces are reused across layouts (blocks, micro-batches, data-parallel degrees) is in reuse.py's docstring;
the result says it in one line too.
"""

from __future__ import annotations

import time
from typing import Any

from trainmem.plan.enumerate import Candidate
from trainmem.plan.gpus import Gpus, parse_gpus
from trainmem.plan.plan_result import PlanResult, PlanRow

__all__ = ["Candidate", "Gpus", "PlanResult", "PlanRow", "parse_gpus", "plan"]


def plan(model: Any, gpus: str, *, setup: Any = None, gpus_per_node: int = 8, margin: float | None = None,
         strategies: Any = None, micro_batches: Any = None, precisions: Any = None, checkpointing: Any = None,
         offloads: Any = None, tps: Any = None, pps: Any = None, top: int = 20, time_limit: float | None = None,
         progress: Any = None, jobs: int | None = None, **setup_values: Any) -> PlanResult:
    """Every layout of `gpus` (COUNTxDEVICE) for `model` and the setup (a TrainingSetup, or its values as
    keywords as estimate() takes them; its layout keys are the planner's to choose and are refused here).
    The other keywords narrow what is enumerated (enumerate.py's defaults otherwise); past `time_limit` seconds
    the layouts not yet reached are listed as not evaluated. `jobs` worker processes trace at once (workers.py;
    default: one per CPU, as memory allows). A layout that cannot be traced is listed as failed with its reason
    (PlanResult.failed); when no layout could be evaluated at all, NothingEvaluated is raised with every failure
    (an error is no answer, and never "no layout fits")."""
    from trainmem.errors import NothingEvaluated
    from trainmem.estimate.orchestrate import setup_of
    from trainmem.fit import resolve_margin
    from trainmem.frontends import resolve
    from trainmem.plan import core, enumerate as layouts
    from trainmem.plan.blocks import model_facts
    from trainmem.plan.tracer import Tracer
    from trainmem.plan.workers import can_fork, default_jobs
    from trainmem.progress import Progress

    started = time.perf_counter()
    chosen = parse_gpus(gpus)
    setup = _checked(setup_of(setup, setup_values, "plan()"), gpus_per_node, jobs)
    kept = resolve_margin(margin, chosen.device)
    budget = int(chosen.device.capacity_bytes * (1 - kept.fraction))
    source = resolve(model, setup)
    facts = model_facts(source)
    # setup values that name a dimension fix it, as the CLI's --precision / --checkpointing / --batch-size do
    precisions = precisions or ((setup.precision,) if "precision" in setup_values else None)
    checkpointing = checkpointing or fixed_checkpointing(setup_values)
    micro_batches = micro_batches or ((setup.batch_size,) if "batch_size" in setup_values else None)
    options = _choices(strategies, micro_batches, precisions, checkpointing, offloads, tps, pps)
    candidates = layouts.candidates(chosen.count, gpus_per_node, facts.blocks, **options)
    tracer = Tracer(source, facts, setup, chosen.device, gpus_per_node)
    jobs = (jobs or default_jobs()) if can_fork() else 1  # without fork the groups run here (workers.py)
    with (progress or Progress("planning")) as bar:
        rows = core.run(tracer, candidates, budget, bar, time_limit, started, jobs)
    notes = [] if facts.blocks else ["no repeated blocks found: every layout traced with the whole model"]
    result = PlanResult(source.name, facts.parameters, chosen, gpus_per_node, budget, kept.fraction, kept.source,
                        tuple(rows), core.REUSE_WORDS, tracer.traces, time.perf_counter() - started, tuple(notes), top,
                        tracer.predicted, tracer.cached, jobs)
    if result.failed and not result.evaluated:  # an error is no answer: never "no layout fits"
        waiting = result.counts().get("not evaluated", 0)
        raise NothingEvaluated(result.failures, "layout", "layouts", where="plan",
                               also=f"{waiting:,} not evaluated within the time limit" if waiting else "")
    return result


def _checked(setup: Any, gpus_per_node: Any, jobs: Any) -> Any:
    """The setup, once it names no layout (the planner's to choose) and the counts are whole numbers."""
    from trainmem.errors import SetupError

    for value, where in ((gpus_per_node, "--gpus-per-node"), (jobs, "--jobs")):
        if (value is not None or where == "--gpus-per-node") and (isinstance(value, bool)
                                                                  or not isinstance(value, int) or value < 1):
            raise SetupError(f"expected a whole number of at least 1, got {value!r}", where=where)
    if setup.parallel.distributed:
        raise SetupError("expected no layout with plan (it enumerates them), got --strategy/--dp/--tp/--pp/"
                         "--world-size", where="--strategy")
    return setup


def fixed_checkpointing(setup_values: Any) -> tuple[str] | None:
    """Checkpointing given (setup values, or the CLI's given options) fixes the dimension: True on, False off
    (--checkpointing, --no-checkpointing); None where it was not given."""
    if "checkpointing" not in setup_values:
        return None
    return ("on" if setup_values["checkpointing"] else "off",)


def _choices(strategies, micro_batches, precisions, checkpointing, offloads, tps, pps) -> dict[str, Any]:
    from trainmem.setup.layout import Offload, Strategy
    from trainmem.plan import enumerate as layouts
    from trainmem.setup import Precision

    def listed(value: Any, convert, where: str) -> tuple | None:
        if value is None:
            return None
        items = value.split(",") if isinstance(value, str) else list(value)
        try:
            return tuple(convert(item.strip() if isinstance(item, str) else item) for item in items)
        except (ValueError, TypeError):
            from trainmem.errors import SetupError

            raise SetupError(f"expected a comma-separated list, got {value!r}", where=where) from None

    def whole(item: Any) -> int:
        number = int(item)
        if number < 1 or isinstance(item, bool) or (isinstance(item, float)):
            raise ValueError(item)
        return number

    def switch(item: Any) -> bool:
        text = str(item).lower()
        if text not in ("on", "off", "true", "false"):
            raise ValueError(item)
        return text in ("on", "true")

    given = {"kinds": listed(strategies, Strategy, "--strategies"),
             "micro_batches": listed(micro_batches, whole, "--micro-batches"),
             "precisions": listed(precisions, Precision, "--precisions"),
             "checkpointing": listed(checkpointing, switch, "--checkpointing-options"),
             "offloads": listed(offloads, Offload, "--offloads"),
             "tps": listed(tps, whole, "--tps"), "pps": listed(pps, whole, "--pps")}
    if given["kinds"] and any(kind not in layouts.DEFAULT_KINDS for kind in given["kinds"]):
        from trainmem.errors import SetupError

        raise SetupError(f"expected data-parallel kinds among {','.join(layouts.DEFAULT_KINDS)} (tp and pp are "
                         f"enumerated as degrees), got {strategies!r}", where="--strategies")
    return {key: value for key, value in given.items() if value}
