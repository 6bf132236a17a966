"""A traced run (TraceResult) to plain JSON values and back, for the trace cache (trace/cache_store.py).

JSON, not pickle: a cache file is read back as data and can never run code. The encoding is exact for the
types it accepts and refuses every other type (`NotCacheable`), so what comes back compares equal to what went
in, type for type (a tuple stays a tuple, a StrEnum its enum). The events and storages, most of a trace, are
stored as columns over one table of strings (module paths and op names repeat on every event), which gzip
then shrinks tenfold.

Decoding checks the shape of what it reads: a damaged or hostile file raises `BadCacheFile`, which the store
answers by tracing again, never by a wrong figure of a wrong type.
"""

from __future__ import annotations

import enum
import importlib
from collections import Counter
from typing import Any

from trainmem.trace.events import Category, Event, KernelCall, Phase, StorageRecord, TensorMeta, Trace
from trainmem.trace.traced import TraceResult

FORMAT = 1  # bumped when the layout below changes; a file of another format is a miss

_EVENT_COLUMNS = ("seq", "action", "nbytes", "sid", "phase", "module", "op", "step")
_STORAGE_COLUMNS = ("sid", "nbytes", "category", "phase", "module", "op", "step", "dtype", "shape", "stream")
_STRING_COLUMNS = frozenset({"action", "module", "op", "dtype"})
_FACTS = ("parameters", "trainable_parameters", "module_parameters", "op_counts", "warnings", "checkpointed",
          "model_name", "output_elements", "parameter_modules", "trainable_shapes", "leaf_modules", "buffer_bytes",
          "input_bytes", "quantized_parameters", "adapter_parameters", "quantized_storage_bytes", "libraries",
          "code_libraries", "resolved", "parallel_notes")
_TORCH_KINDS = ("dtype", "device", "memory_format", "layout")


class NotCacheable(Exception):
    """A value of the trace that this encoding does not carry exactly: the trace is not stored."""


class BadCacheFile(Exception):
    """A stored trace that does not decode into a trace: damaged, of another format, or not ours."""


def encode(traced: TraceResult) -> dict[str, Any]:
    if traced.framework is not None:
        raise NotCacheable("a framework section (Keras) is not cached")
    strings = _Strings()
    trace = traced.trace
    return {
        "format": FORMAT,
        "events": _columns(trace.events, _EVENT_COLUMNS, strings),
        "storages": _columns(trace.storages.values(), _STORAGE_COLUMNS, strings),
        "kernel_calls": [[c.op, c.at_seq, c.outputs_allocated, _value(c.args), _value(c.outputs),
                          _value(c.output_sids)] for c in trace.kernel_calls],
        "sets": {name: sorted(getattr(trace, name)) for name in ("host_storages", "managed_storages",
                                                                 "offloaded_storages")},
        "loop_marks": trace.loop_marks,  # plain lists of text and integers (trace/loop_twin.py)
        "facts": {name: _value(getattr(traced, name)) for name in _FACTS},
        "strings": strings.table,
    }


def decode(data: Any) -> TraceResult:
    try:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise BadCacheFile(f"expected a stored trace of format {FORMAT}")
        strings = data["strings"]
        if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
            raise BadCacheFile("expected a table of strings")
        events = [Event(*row) for row in _rows(data["events"], _EVENT_COLUMNS, strings)]
        storages = [StorageRecord(*row) for row in _rows(data["storages"], _STORAGE_COLUMNS, strings)]
        calls = [KernelCall(op, at, n, _plain(args), _plain(outs), _plain(sids))
                 for op, at, n, args, outs, sids in data["kernel_calls"]]
        sets = {name: set(_ints(values)) for name, values in data["sets"].items()}
        trace = Trace(events, {record.sid: record for record in storages}, calls, **sets,
                      loop_marks=_loop_marks(data.get("loop_marks", [])))
        facts = {name: _plain(data["facts"][name]) for name in _FACTS}
        facts["op_counts"] = Counter(facts["op_counts"])
        facts["parameter_modules"] = set(facts["parameter_modules"])
        facts["leaf_modules"] = set(facts["leaf_modules"])
        traced = TraceResult(trace=trace, **facts)
    except BadCacheFile:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ImportError, RecursionError) as error:
        raise BadCacheFile(f"expected a stored trace, the file does not decode ({type(error).__name__})") from None
    _check_types(traced)
    return traced


class _Strings:
    """One table of the strings the columns share; a column holds indexes into it."""

    def __init__(self) -> None:
        self.table: list[str] = []
        self.index: dict[str, int] = {}

    def of(self, text: str) -> int:
        if type(text) is not str:
            raise NotCacheable(f"a string column holds {type(text).__name__}")
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.table)
            self.table.append(text)
        return found


def _columns(records: Any, names: tuple[str, ...], strings: _Strings) -> dict[str, list]:
    columns: dict[str, list] = {name: [] for name in names}
    for record in records:
        for name in names:
            value = getattr(record, name)
            if name in _STRING_COLUMNS:
                value = strings.of(value)
            elif name in ("phase", "category"):
                value = str(value)
            elif name == "shape":
                value = list(value)
            columns[name].append(value)
    return columns


def _rows(columns: dict[str, list], names: tuple[str, ...], strings: list[str]) -> Any:
    """The records' constructor arguments, column by column back into rows."""
    decoded = []
    for name in names:
        column = columns[name]
        if name in _STRING_COLUMNS:
            column = [strings[i] for i in _ints(column)]
        elif name == "phase":
            column = [Phase(v) for v in column]
        elif name == "category":
            column = [Category(v) for v in column]
        elif name == "shape":
            column = [tuple(_ints(shape)) for shape in column]
        else:
            column = _ints(column)
        decoded.append(column)
    if len({len(column) for column in decoded}) > 1:
        raise BadCacheFile("expected columns of one length")
    return zip(*decoded)


def _ints(values: Any) -> list[int]:
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise BadCacheFile("expected a list of integers")
    return values


def _value(value: Any) -> Any:
    """A plain JSON value; tuples, sets, enums, TensorMeta and torch's dtype/device objects tagged."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [_value(v) for v in value]
    if kind is tuple:
        return {"tuple": [_value(v) for v in value]}
    if kind in (set, frozenset):
        return {kind.__name__: sorted((_value(v) for v in value), key=repr)}
    if kind in (dict, Counter):
        if not all(type(k) is str for k in value):
            raise NotCacheable("a mapping with keys that are not strings")
        return {"dict": {k: _value(v) for k, v in value.items()}}
    if kind is TensorMeta:
        return {"tensor": [list(value.shape), value.itemsize, value.dtype, value.contiguous, value.storage_key,
                           value.channels_last]}
    if isinstance(value, enum.Enum) and kind.__module__.startswith("trainmem."):
        return {"enum": [kind.__module__, kind.__qualname__, value.value]}
    torch_kind = _torch_kind(value)
    if torch_kind is not None:
        return {"torch": [torch_kind, str(value)]}
    raise NotCacheable(f"a value of type {kind.__module__}.{kind.__qualname__}")


def _torch_kind(value: Any) -> str | None:
    if not type(value).__module__.startswith("torch"):
        return None
    import torch

    for kind in _TORCH_KINDS:
        if type(value) is getattr(torch, kind):
            return kind
    return None


def _plain(value: Any) -> Any:
    """The inverse of `_value`."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) is list:
        return [_plain(v) for v in value]
    if type(value) is not dict or len(value) != 1:
        raise BadCacheFile("expected a tagged value")
    (tag, body), = value.items()
    if tag == "tuple":
        return tuple(_plain(v) for v in body)
    if tag in ("set", "frozenset"):
        return (set if tag == "set" else frozenset)(_plain(v) for v in body)
    if tag == "dict":
        return {str(k): _plain(v) for k, v in body.items()}
    if tag == "tensor":
        shape, itemsize, dtype, contiguous, storage_key, channels_last = body
        return TensorMeta(tuple(_ints(shape)), itemsize, dtype, contiguous, storage_key, channels_last)
    if tag == "enum":
        return _enum(*body)
    if tag == "torch":
        return _torch_value(*body)
    raise BadCacheFile(f"expected a known tag, got {tag[:40]!r}")


def _enum(module: str, qualname: str, member: Any) -> enum.Enum:
    """Only trainmem's own enums: the module named is imported only when it is one of ours."""
    if not module.startswith("trainmem.") or not qualname.isidentifier():
        raise BadCacheFile("expected one of trainmem's enums")
    cls = getattr(importlib.import_module(module), qualname, None)
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        raise BadCacheFile("expected one of trainmem's enums")
    return cls(member)


def _torch_value(kind: str, text: str) -> Any:
    import torch

    if kind not in _TORCH_KINDS or not isinstance(text, str):
        raise BadCacheFile("expected a torch dtype, device, memory format or layout")
    if kind == "device":
        return torch.device(text)
    value = getattr(torch, text.removeprefix("torch."), None)
    if type(value) is not getattr(torch, kind):
        raise BadCacheFile(f"expected a torch {kind}, got {text[:40]!r}")
    return value


def _loop_marks(marks: Any) -> list[list]:
    """The lean loop's marks as stored: [kind, position, phase, module, step, [sid, …] or [[op, count], …]]; a file
    without them (a trace of another loop, or older) has none, and the inline loop is then traced, not derived."""
    def plain_ints(items: Any) -> bool:
        return isinstance(items, list) and all(type(i) is int or (isinstance(i, list) and len(i) == 2 and type(i[0])
                                                                    is str and type(i[1]) is int) for i in items)

    if not isinstance(marks, list) or not all(
            isinstance(m, list) and len(m) == 6 and type(m[0]) is str and type(m[1]) is int and type(m[2]) is str
            and type(m[3]) is str and type(m[4]) is int and plain_ints(m[5]) for m in marks):
        raise BadCacheFile("expected the lean loop's marks as lists")
    return marks


def _check_types(traced: TraceResult) -> None:
    """The figures the assembler adds up are integers; a file that says otherwise is not a trace of ours."""
    numbers = (traced.parameters, traced.trainable_parameters, traced.buffer_bytes, traced.input_bytes,
               traced.quantized_parameters, traced.adapter_parameters, traced.quantized_storage_bytes)
    if not all(type(n) is int for n in numbers) or not isinstance(traced.warnings, list):
        raise BadCacheFile("expected integer counts and a list of warnings")
    if not all(isinstance(name, str) and type(count) is int for name, count in traced.module_parameters.items()):
        raise BadCacheFile("expected parameters per module as integers")
