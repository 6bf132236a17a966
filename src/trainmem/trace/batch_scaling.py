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
from fractions import Fraction
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


class _Quadratic(_Node):
    """Through three points (offsets 0 < o₁ < o₂): the quadratic in the offset, in exact fractions (Lagrange's
    form); a value it gives that is not a whole number, or below 0, is Unpredictable."""
    __slots__ = ("points",)

    def __init__(self, values: list[int], offsets: list[int]) -> None:
        self.points = list(zip(offsets, values))

    def at(self, offset: int) -> int:
        total = Fraction(0)
        for i, (x_i, y_i) in enumerate(self.points):
            term = Fraction(y_i)
            for j, (x_j, _) in enumerate(self.points):
                if j != i:
                    term *= Fraction(offset - x_j, x_i - x_j)
            total += term
        if total.denominator != 1 or total < 0:
            raise Unpredictable(f"the quadratic through {self.points} gives {total} at {offset}")
        return int(total)


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
    return _fit([first, second], [0, span], flags_from_second)


def _integers(values: list, offsets: list[int]) -> _Node:
    """Whole numbers at the offsets as one node: equal, a line (two points, a whole slope), or through three
    points the quadratic (SequenceScaling), which must give whole numbers where it is asked."""
    if all(value == values[0] for value in values):
        return _Same(values[0])
    if len(values) == 2:
        slope, rest = divmod(values[1] - values[0], offsets[1])
        if rest:
            raise StreamsDiffer(f"{values[0]} → {values[1]} over {offsets[1]} batch sizes is not a whole number per "
                                "sample")
        return _Line(values[0], slope)
    return _Quadratic(values, offsets)


def _fit(values: list, offsets: list[int], flags_from_last: bool = False) -> _Node:
    """The node that gives values[i] at offsets[i] (offsets[0] = 0): _pair's walk for two or three points."""
    first, kind = values[0], type(values[0])
    for other in values[1:]:
        if type(other) is not kind:
            raise StreamsDiffer(f"{kind.__name__} {first!r} against {type(other).__name__} {other!r}")
    if kind is bool and flags_from_last:
        return _Same(values[-1])
    if kind is int:
        return _integers(values, offsets)
    if all(other == first for other in values[1:]) and _immutable(first):
        return _Same(first)
    if isinstance(first, (list, tuple)) and not hasattr(first, "_fields"):  # torch.Size too; not namedtuples
        if any(len(other) != len(first) for other in values[1:]):
            raise StreamsDiffer(f"{len(first)} items against {' and '.join(str(len(o)) for o in values[1:])}")
        return _Sequence(kind, [_within(f"[{index}]", list(items), offsets, flags_from_last)
                                for index, items in enumerate(zip(*values))])
    if isinstance(first, dict):
        if any(list(other) != list(first) for other in values[1:]):
            missing = sorted(set(first) ^ set(values[-1]), key=str)[:3]
            raise StreamsDiffer(f"other keys ({', '.join(map(str, missing)) or 'another order'})")
        return _Mapping(kind, list(first), [_within(f"[{key!r}]", [v[key] for v in values], offsets, flags_from_last)
                                            for key in first])
    if kind is set:
        if any(other != first for other in values[1:]):
            raise StreamsDiffer("other members")
        return _Set(first)
    if dataclasses.is_dataclass(first):  # a field outside the value (TraceResult.cache_use): None predicted
        return _Record(kind, [_within(field.name, [getattr(v, field.name) for v in values], offsets, flags_from_last)
                              if field.compare else _Same(None) for field in dataclasses.fields(first)])
    if all(other == first for other in values[1:]):
        return _Same(first)
    raise StreamsDiffer(f"{first!r} against {values[-1]!r}")


def _within(step: str, values: list, offsets: list[int], flags_from_last: bool) -> _Node:
    try:
        return _fit(values, offsets, flags_from_last)
    except StreamsDiffer as differ:
        raise differ.inside(step) from None


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


_LENGTH = "sequence length \x00"  # where a warning names the traced length (an hf: model's "built ... sequence length 8")


def _worded(traced: Any, old: str, new: str) -> Any:
    """The TraceResult with `old` written as `new` in its warnings: the words that name the length, the one value
    of a trace that is neither a size nor the same at every length."""
    return dataclasses.replace(traced, warnings=[warning.replace(old, new) for warning in traced.warnings])


class SequenceScaling:
    """Traces at any sequence length from traces at three (`lengths`, increasing, none of them 1) of the same
    setup: each size a quadratic in the length (attention's scores are length × length; everything else that
    holds the sequence is a multiple of it), where the traced lengths and the one asked for are multiples of any
    padding a kernel makes (fit_sequences.py). Three points fit any quadratic, so fit.py traces the answer and the
    first length past it for real and compares both with their predictions before it trusts them."""

    def __init__(self, points: list[tuple[int, Any]]) -> None:
        lengths = [length for length, _ in points]
        if len(points) != 3 or not 1 < lengths[0] < lengths[1] < lengths[2]:
            raise ValueError(f"expected three sequence lengths 1 < s₁ < s₂ < s₃, got {lengths}")
        self.lengths = lengths
        try:
            self._root = _fit([_worded(canonical(traced), f"sequence length {n}", _LENGTH) for n, traced in points],
                              [n - lengths[0] for n in lengths])
        except StreamsDiffer as differ:
            raise differ.inside(f"sequence lengths {', '.join(map(str, lengths))}") from None

    def at(self, length: int) -> Any:
        """The TraceResult predicted for `length` (Unpredictable below the first length, or where a size is not
        a whole number or is negative)."""
        if length < self.lengths[0]:
            raise Unpredictable(f"sequence length {length} is below the traced {self.lengths[0]}")
        return _worded(self._root.at(length - self.lengths[0]), _LENGTH, f"sequence length {length}")

    def matches(self, length: int, traced: Any) -> bool:
        """Whether a real trace at `length` is exactly the prediction, value for value."""
        try:
            return canonical(traced) == self.at(length)
        except Unpredictable:
            return False
