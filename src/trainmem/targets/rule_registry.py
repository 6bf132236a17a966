"""One registry of per-op kernel rules for a target, which refuses a second rule for the same op.

Like torch/utils/flop_counter.py's registry, without its second hand-written dict: a rule is
registered once, by decorator, at import; registering another for the same op raises there, so two
modules cannot silently disagree about what one kernel allocates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

Rule = TypeVar("Rule", bound=Callable)


class RuleRegistry(Generic[Rule]):
    def __init__(self, target: str) -> None:
        self.target = target
        self._rules: dict[str, Rule] = {}

    def register(self, op: str) -> Callable[[Rule], Rule]:
        """A decorator that registers its function as the rule for `aten.<op>`."""
        def register(rule: Rule) -> Rule:
            if op in self._rules:
                raise RuntimeError(f"a {self.target} kernel rule for aten.{op} is already registered "
                                   f"({self._rules[op].__qualname__}); refusing {rule.__qualname__}")
            self._rules[op] = rule
            return rule
        return register

    def ops(self) -> frozenset[str]:
        return frozenset(self._rules)

    def rule_for(self, op: str) -> Rule:
        return self._rules[op]
