"""Per-rank estimates for many ranks: one trace per distinct rank role (parallel/roles.py), each replayed through
the target as a single-process trace is (estimate/assemble.py), then the roles side by side.

The answer is the most loaded role's Estimate (by process bytes: what must fit on each GPU), with `ranks` (one
row per role) and `parallel` (the layout, the spread between roles, host RAM with offload, the strategies'
notes, the analytic cross-checks). What a rank holds beside a single process's figures comes from the target
(`Target.rank_process_parts`): on a GPU the NCCL communicators' buffers, outside PyTorch's allocator
(targets/nccl.py); on the CPU torch.distributed's own runtime, a measured process part
(targets/distributed_runtime.py), while gloo's collectives' temporaries are kernel rules (targets/gloo.py).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from trainmem.estimate.result import Estimate, RankEstimate
from trainmem.setup import TrainingSetup


def estimate_distributed(chosen: Any, setup: TrainingSetup) -> Estimate:
    """Trace every distinct rank role of `setup.parallel` and assemble each; the most loaded one answers."""
    from trainmem.parallel.roles import rank_roles
    from trainmem.parallel.rank_trace import build_on_meta

    model, _, _, _ = build_on_meta(chosen.source, setup)
    roles = rank_roles(setup.parallel, model)
    shape = transformer_shape(model, chosen.source, setup)
    del model
    estimates, notes = [], []
    for role in roles:  # one trace alive at a time: a large model's trace holds millions of events
        traced = trace_role(chosen, setup, role)
        estimates.append(assemble_role(chosen, setup, role, traced))
        notes += traced.parallel_notes
        del traced
    est = combine(setup, roles, estimates)
    est = dataclasses.replace(est, parallel={**est.parallel, "notes": list(dict.fromkeys(notes))})
    return dataclasses.replace(est, parallel={**est.parallel, "cross_checks": cross_checks(est, setup, shape)})


def transformer_shape(model: Any, source: Any, setup: TrainingSetup) -> dict | None:
    """A Hugging Face transformer's shape numbers (hidden size, heads, layers, sequence) for the activation
    formula; None for other models."""
    config = getattr(model, "config", None)
    seq_len = source.resolved.get("seq_len") or setup.seq_len
    if config is None or not seq_len or not all(hasattr(config, key) for key in
                                                ("hidden_size", "num_attention_heads", "num_hidden_layers")):
        return None
    from trainmem.parallel.analytic import model_config_from_hf

    try:
        return model_config_from_hf(config, int(seq_len))
    except (AttributeError, TypeError):
        return None


def cross_checks(est: Estimate, setup: TrainingSetup, shape: dict | None) -> list[dict]:
    """The analytic formulas beside the traced figures (parallel/analytic.py), each difference explained."""
    try:
        from trainmem.parallel.analytic import cross_checks as formulas
    except ImportError:
        return []
    return [check.to_dict() for check in formulas(est.to_dict(), setup.parallel, shape)]


def trace_role(chosen: Any, setup: TrainingSetup, role: Any) -> Any:
    """The TraceResult of one role's rank (for the planner, which reuses traces across layouts)."""
    from trainmem.parallel.rank_trace import trace_rank

    return trace_rank(chosen.source, setup, role, kernel_ops(chosen.target), chosen.target.trace_semantics())


def kernel_ops(target: Any) -> frozenset[str]:
    """The target's kernel ops; the CPU target also sees gloo's collectives (their temporaries are its rules)."""
    return frozenset(target.kernel_ops())


def assemble_role(chosen: Any, setup: TrainingSetup, role: Any, traced: Any) -> Estimate:
    """One role's Estimate: the single-process assembly of its trace, what the target says a rank holds beside it
    (NCCL's buffers on a GPU, gloo's runtime on the CPU), and the role as the only row of `ranks` (combine() puts the rows of all roles together)."""
    from trainmem.estimate.assemble import assemble

    est = assemble(chosen.source, setup, chosen.device, chosen.target, traced, chosen.depth)
    for name, nbytes, assumption in chosen.target.rank_process_parts(setup.parallel, role):
        est = _add_process_part(est, name, nbytes, assumption)
    breakdown = {**est.breakdown, "communication": est.breakdown.get("communication", 0)}
    peak = est.to_dict()["peak"]
    row = RankEstimate(role.label, tuple(role.ranks), peak, breakdown, dict(est.process_parts), host_bytes(traced))
    return dataclasses.replace(est, breakdown=breakdown, ranks=(row,))


def _add_process_part(est: Estimate, name: str, nbytes: int, assumption: str) -> Estimate:
    parts = {**est.process_parts, name: nbytes}
    return dataclasses.replace(est, process_parts=parts, process_bytes=est.process_bytes + nbytes,
                               process_bytes_high=est.process_bytes_high + nbytes,
                               warnings=(*est.warnings, assumption))


def host_bytes(traced: Any) -> int:
    """The peak of the host-resident (offloaded) storages over the trace: their own timeline."""
    host = traced.trace.offloaded_storages
    if not host:
        return 0
    live = peak = 0
    for event in traced.trace.events:
        if event.sid in host:
            live += event.nbytes if event.action == "alloc" else -event.nbytes
            peak = max(peak, live)
    return peak


def combine(setup: TrainingSetup, roles: list[Any], estimates: list[Estimate]) -> Estimate:
    """The most loaded role's Estimate, with every role's row, the spread and host RAM per node."""
    rows = tuple(est.ranks[0] for est in estimates)
    most = max(range(len(estimates)), key=lambda i: (estimates[i].process_bytes, estimates[i].allocated_bytes))
    layout = setup.parallel
    figures = [row.process_bytes for row in rows]
    parallel = {
        "layout": layout.to_dict(),
        "roles": len(rows),
        "most_loaded": {"label": rows[most].label, "rank": roles[most].rank},
        "spread_bytes": max(figures) - min(figures),
        "host_bytes_per_rank": max(row.host_bytes for row in rows),
        "host_bytes_per_node": _host_per_node(layout, roles, rows),
        "notes": [],
        "cross_checks": [],
    }
    warnings = list(dict.fromkeys(w for est in estimates for w in est.warnings))
    return dataclasses.replace(estimates[most], ranks=rows, parallel=parallel, warnings=tuple(warnings))


def _host_per_node(layout: Any, roles: list[Any], rows: tuple[RankEstimate, ...]) -> int:
    """Host RAM the offloaded tensors of a node's ranks take together (ranks fill nodes in order), the most
    loaded node's."""
    if not any(row.host_bytes for row in rows):
        return 0
    per_node: dict[int, int] = defaultdict(int)
    for role, row in zip(roles, rows):
        for rank in role.ranks:
            per_node[rank // layout.gpus_per_node] += row.host_bytes
    return max(per_node.values())
