"""The trace of any batch size from the traces of two: match two traced runs value by value and
evaluate each size as an affine function of the batch.

Two runs of the same training step at batch sizes b₁ < b₂ make the same ops in the same order; what
changes is the size of whatever holds the batch (activations, inputs, gradients of activations, kernel
workspaces that follow them), and those sizes are products of a batch-sized dimension with constants.
`BatchScaling` walks both TraceResults together — events, storages, kernel calls, module output sizes,
the resolved inputs — and keeps every value equal in both as it is; every integer that differs becomes
`v₁ + slope·(b − b₁)` with slope (v₂ − v₁)/(b₂ − b₁), which must be whole. Anything else that differs —
an event more or fewer, another op, a string or a float — means the step is not one stream across
batch sizes (a guard on the batch, ops whose count follows the batch), and `StreamsDiffer` says where.

Two points fit any line: the scaling says nothing about a third batch until a real trace there is
found equal to the prediction (`matches`). fit.py makes that check before it trusts an answer.
The allocator's rounding, block splitting and the target's kernel rules are not part of the trace:
they run on the predicted trace as on a real one, so they need not be affine.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from trainmem.trace.events import KernelCall, TensorMeta


class StreamsDiffer(Exception):
    """The two traces are not one stream with sizes affine in the batch; `where` is the first value
    that shows it (a path such as trace.events[120].op)."""

    def __init__(self, why: str, where: str = "") -> None:
        super().__init__(why)
        self.why, self.where = why, where

    def inside(self, step: str) -> StreamsDiffer:
        return StreamsDiffer(self.why, step + ("" if not self.where or self.where.startswith("[") else ".") + self.where)

    def __str__(self) -> str:
        return f"{self.where}: {self.why}" if self.where else self.why


class Unpredictable(Exception):
    """No prediction for this batch: a size the line gives there is negative (the line does not reach that
    far), or it is batch 1 of the pair (1, 2), whose flags the prediction does not keep."""


# values kept as they are when equal in both traces: immutable, so one object serves every batch
_IMMUTABLE = (int, float, str, bytes, bool, type(None), enum.Enum)


class _Node:
    __slots__ = ()

    def at(self, offset: int) -> Any:  # offset = batch − b₁
        raise NotImplementedError


class _Same(_Node):
    """Equal in both traces and immutable."""
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def at(self, offset: int) -> Any:
        return self.value


class _Line(_Node):
    __slots__ = ("first", "slope")

    def __init__(self, first: int, slope: int) -> None:
        self.first, self.slope = first, slope

    def at(self, offset: int) -> int:
        value = self.first + self.slope * offset
        if value < 0:
            raise Unpredictable(f"{self.first} + {self.slope}·{offset} < 0")
        return value


class _Sequence(_Node):
    __slots__ = ("kind", "items")

    def __init__(self, kind: type, items: list[_Node]) -> None:
        self.kind, self.items = kind, items

    def at(self, offset: int) -> Any:
        values = [item.at(offset) for item in self.items]
        return values if self.kind is list else self.kind(values)


class _Mapping(_Node):
    __slots__ = ("kind", "keys", "values")

    def __init__(self, kind: type, keys: list, values: list[_Node]) -> None:
        self.kind, self.keys, self.values = kind, keys, values

    def at(self, offset: int) -> Any:
        out = self.kind()
        for key, value in zip(self.keys, self.values):
            out[key] = value.at(offset)
        return out


class _Set(_Node):
    """A mutable set equal in both traces: each batch gets its own copy."""
    __slots__ = ("value",)

    def __init__(self, value: set) -> None:
        self.value = value

    def at(self, offset: int) -> set:
        return set(self.value)


class _Record(_Node):
    """A dataclass instance rebuilt field by field (the fields in declaration order, all in __init__)."""
    __slots__ = ("kind", "fields")

    def __init__(self, kind: type, fields: list[_Node]) -> None:
        self.kind, self.fields = kind, fields

    def at(self, offset: int) -> Any:
        return self.kind(*[field.at(offset) for field in self.fields])


def _immutable(value: Any) -> bool:
    if isinstance(value, _IMMUTABLE):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(item) for item in value)
    if dataclasses.is_dataclass(value):
        params = getattr(type(value), "__dataclass_params__", None)
        return bool(params and params.frozen) and all(_immutable(getattr(value, f.name))
                                                      for f in dataclasses.fields(value))
    return not isinstance(value, (list, dict, set)) and type(value).__module__.startswith("torch")  # dtype, device


def _pair(first: Any, second: Any, span: int, flags_from_second: bool = False) -> _Node:
    """The node that gives `first` at offset 0 and `second` at offset `span`; with `flags_from_second`, a
    bool that differs is taken from `second` for every batch (see BatchScaling)."""
    kind = type(first)
    if kind is not type(second):
        raise StreamsDiffer(f"{kind.__name__} {first!r} against {type(second).__name__} {second!r}")
    if kind is bool and flags_from_second:
        return _Same(second)
    if kind is int:
        if first == second:
            return _Same(first)
        slope, rest = divmod(second - first, span)
        if rest:
            raise StreamsDiffer(f"{first} → {second} over {span} batch sizes is not a whole number per sample")
        return _Line(first, slope)
    if first == second and _immutable(first):
        return _Same(first)
    if isinstance(first, (list, tuple)) and not hasattr(first, "_fields"):  # torch.Size too; not namedtuples
        if len(first) != len(second):
            raise StreamsDiffer(f"{len(first)} items against {len(second)}")
        items = []
        for index, (a, b) in enumerate(zip(first, second)):
            try:
                items.append(_pair(a, b, span, flags_from_second))
            except StreamsDiffer as differ:
                raise differ.inside(f"[{index}]") from None
        return _Sequence(kind, items)
    if isinstance(first, dict):
        if list(first) != list(second):
            missing = sorted(set(first) ^ set(second), key=str)[:3]
            raise StreamsDiffer(f"other keys ({', '.join(map(str, missing)) or 'another order'})")
        values = []
        for key in first:
            try:
                values.append(_pair(first[key], second[key], span, flags_from_second))
            except StreamsDiffer as differ:
                raise differ.inside(f"[{key!r}]") from None
        return _Mapping(kind, list(first), values)
    if kind is set:
        if first != second:
            raise StreamsDiffer("other members")
        return _Set(first)
    if dataclasses.is_dataclass(first):
        fields = []
        for field in dataclasses.fields(first):  # a field outside the value (TraceResult.cache_use): None predicted
            try:
                fields.append(_pair(getattr(first, field.name), getattr(second, field.name), span,
                                    flags_from_second) if field.compare else _Same(None))
            except StreamsDiffer as differ:
                raise differ.inside(field.name) from None
        return _Record(kind, fields)
    if first == second:
        return _Same(first)
    raise StreamsDiffer(f"{first!r} against {second!r}")


def canonical(traced: Any) -> Any:
    """The TraceResult with each kernel call's storage keys numbered by first appearance in the call.
    A key is the id() of a storage, different in every run; only its equality inside one call means
    anything (targets/cpu_kernels.py asks whether two arguments share storage), and that survives numbering."""
    calls = [_numbered(call) for call in traced.trace.kernel_calls]
    return dataclasses.replace(traced, trace=dataclasses.replace(traced.trace, kernel_calls=calls))


def _numbered(call: KernelCall) -> KernelCall:
    numbers: dict[int, int] = {}

    def renumber(value: Any) -> Any:
        if isinstance(value, TensorMeta):
            return dataclasses.replace(value, storage_key=numbers.setdefault(value.storage_key, len(numbers)))
        if isinstance(value, tuple):
            return tuple(renumber(item) for item in value)
        return value

    return dataclasses.replace(call, args=renumber(call.args), outputs=renumber(call.outputs))


class BatchScaling:
    """Traces at any batch size from traces at two (`first_batch` < `second_batch`) of the same setup.

    Batch 1 is a size-1 dimension, and a size-1 dimension's stride does not count: a transposed (1, n)
    activation is contiguous at batch 1 and not above. When the first batch is 1, a flag (a bool: the
    kernel calls' `contiguous`) that differs is taken from the second trace for every batch; the
    prediction is for batches above 1, and batch 1 keeps its own trace."""

    def __init__(self, first_batch: int, first: Any, second_batch: int, second: Any) -> None:
        if not 0 < first_batch < second_batch:
            raise ValueError(f"expected two batch sizes 0 < b₁ < b₂, got {first_batch} and {second_batch}")
        self.first_batch, self.second_batch = first_batch, second_batch
        try:
            self._root = _pair(canonical(first), canonical(second), second_batch - first_batch, first_batch == 1)
        except StreamsDiffer as differ:
            raise differ.inside(f"batch {first_batch} against {second_batch}") from None

    def at(self, batch: int) -> Any:
        """The TraceResult predicted for `batch` (Unpredictable when a size would be negative there)."""
        if batch < self.second_batch and self.first_batch == 1:
            raise Unpredictable(f"batch {batch}: the flags are batch {self.second_batch}'s")
        return self._root.at(batch - self.first_batch)

    def matches(self, batch: int, traced: Any) -> bool:
        """Whether a real trace at `batch` is exactly the prediction, value for value."""
        try:
            return canonical(traced) == self.at(batch)
        except Unpredictable:
            return False

