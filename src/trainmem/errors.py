"""The one exception family trainmem raises for bad input or a failed trace.

Every message says what was expected, what was given, and where, so that the CLI can print it as
one line and exit 2 (see cli.py). Nothing here imports torch.
"""

from __future__ import annotations


class TrainmemError(Exception):
    """Bad input or a failed trace: one line that names expected / got / where."""

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class ModelRefError(TrainmemError):
    """A model reference that cannot be resolved or built."""


class SetupError(TrainmemError):
    """A training setup value (batch size, optimizer, precision, shape…) that is not valid."""


class TraceError(TrainmemError):
    """The model's training step failed while being traced on fake tensors."""


class MeasureError(TrainmemError):
    """A real measurement run could not be started or failed."""


def expected(what: str, got: object, where: str | None = None, cls: type[TrainmemError] = SetupError) -> TrainmemError:
    """Build the standard 'expected X, got Y' error."""
    return cls(f"expected {what}, got {got!r}", where=where)
