"""Per-rank estimates for many ranks: one trace per distinct rank role, each replayed through the target.
(The engine lands in the next commits; until then a distributed setup is refused in one line.)"""

from __future__ import annotations

from typing import Any

from trainmem.errors import SetupError


def estimate_distributed(chosen: Any, setup: Any) -> Any:
    raise SetupError(f"expected a single-process setup, got --strategy {setup.parallel.strategy}: per-rank "
                     "estimates are not yet supported", where="--strategy")
