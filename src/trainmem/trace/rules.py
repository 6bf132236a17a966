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

    def handle(self, func: Any, args: tuple, kwargs: dict, error: Exception, module: str) -> Any:
        op = str(getattr(func, "overloadpacket", func)).removeprefix("aten.")
        if not isinstance(error, FAKE_LIMITATIONS):
            raise error  # a real error of the model on this input (shape mismatch…): reported as such
        if op == "_local_scalar_dense" and isinstance(args[0], torch.Tensor):
            return self._scalar_zero(args[0], module)
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

    def warnings(self) -> list[str]:
        return [f"aten.{op} in '{module or 'model'}' ×{count}: {assumption} (fake tensors have no values)"
                for (op, module, assumption), count in sorted(self.fired.items())]
