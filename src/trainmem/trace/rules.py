"""Deliberate rules for ops that fake tensors cannot run as they are.

Fake tensors carry no values, so an op whose *result* is a value (`.item()`, i.e.
`aten._local_scalar_dense`) cannot be answered — Hugging Face attention-mask checks and GradScaler's
found-inf test both do this (pytorch issue #126738). Each such op is answered by a named rule and
counted, so the report can say which assumptions the trace made. Anything else is a TraceError that
names the op: never silently dropped.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from trainmem.errors import TraceError
from trainmem.trace.torch_private import FAKE_LIMITATIONS


class DataDependentRules:
    def __init__(self) -> None:
        self.fired: Counter[tuple[str, str, str]] = Counter()  # (op, module, assumption) -> count

    def handle(self, func: Any, args: tuple, kwargs: dict, error: Exception, module: str,
               module_object: Any = None) -> Any:
        op = str(getattr(func, "overloadpacket", func)).removeprefix("aten.")
        if not isinstance(error, FAKE_LIMITATIONS):
            raise error  # a real error of the model on this input (shape mismatch…): reported as such
        if op == "_local_scalar_dense" and isinstance(args[0], torch.Tensor):
            return self._scalar_zero(args[0], module)
        experts = getattr(module_object, "num_experts", None)
        if op == "nonzero" and isinstance(experts, int) and isinstance(args[0], torch.Tensor):
            return self._balanced_routing(args[0], experts, module)
        raise TraceError(f"op aten.{op} cannot run on fake tensors ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else 'no message'}); "
                         "it needs a rule in trainmem/trace/rules.py", where=module or "model") from error

    def _scalar_zero(self, tensor: torch.Tensor, module: str) -> Any:
        """A value read (`.item()`, `bool(t)`): assume zero / False. For GradScaler's found_inf this
        means 'no overflow, take the step', the case that keeps optimizer state alive."""
        self.fired[("_local_scalar_dense", module, "value read as 0 / False")] += 1
        if tensor.dtype == torch.bool:
            return False
        return 0.0 if tensor.dtype.is_floating_point else 0

    def _balanced_routing(self, mask: torch.Tensor, experts: int, module: str) -> torch.Tensor:
        """A mixture-of-experts layer asks which experts got tokens, then which tokens each expert got
        (transformers' eager experts: `expert_mask.sum(...) > 0).nonzero()`, then `torch.where(expert_mask[e])`).
        Assume balanced routing: every expert is hit, and each gets its share of the token-slots."""
        if mask.dim() == 1:  # the per-expert hit mask (experts, or experts + a 'no expert' slot)
            self.fired[("nonzero", module, "every expert receives tokens")] += 1
            return torch.arange(min(experts, mask.shape[0]), dtype=torch.long).unsqueeze(1)
        self.fired[("nonzero", module, "routing balanced: each expert gets 1/experts of the token-slots")] += 1
        return torch.empty((-(-mask.numel() // experts), mask.dim()), dtype=torch.long)

    def warnings(self) -> list[str]:
        """One line per (op, assumption), with how often and where (the first modules by name)."""
        grouped: dict[tuple[str, str], Counter] = {}
        for (op, module, assumption), count in self.fired.items():
            grouped.setdefault((op, assumption), Counter())[module or "model"] += count
        lines = []
        for (op, assumption), modules in sorted(grouped.items()):
            names = sorted(modules)
            where = ", ".join(f"'{n}'" for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            lines.append(f"aten.{op}: {assumption} (fake tensors have no values) — ×{sum(modules.values())} in {where}")
        return lines
