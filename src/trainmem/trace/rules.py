"""Deliberate rules for ops that fake tensors cannot run as they are.

Fake tensors carry no values, so an op whose *result* is a value (`.item()`, i.e.
`aten._local_scalar_dense`) or whose *shape* depends on values (`nonzero`, boolean indexing) cannot
be answered — Hugging Face attention-mask checks, GradScaler's found-inf test and mixture-of-experts
routing all do this (pytorch issue #126738). Each such op is answered by a named rule whose
assumption is checked first, and counted, so the report can say which assumptions the trace made.
A rule whose assumption does not hold refuses with a TraceError naming the op, the module and why:
a guess that is silently low is worse than no answer.

Routing masks are recognised by where they come from, not by their shape: the recorder hands every op
to `observe`, which tags the outputs of routing decisions (topk / argmax indices), the masks made by
comparing them with an expert id, and what reductions and views make of those masks. A tag carries
the expected number of true entries per element under balanced routing, in units of 1/experts: an
`idx == e` mask has 1 (each routing slot names one expert of E), `.any(dim)` over r slots of it has
r (top-k picks distinct experts), `.sum(dim) > 0` of it has the expected count (≥ 1: every expert hit).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from typing import Any

import torch

from trainmem.errors import TraceError
from trainmem.trace.packed_sequences import packed_lengths
from trainmem.trace.torch_private import FAKE_LIMITATIONS, disable_current_modes

_TAG = "_trainmem_routing"
# ops whose output (or output at this position) is a per-token choice of expert
_INDEX_OPS = {"topk": 1, "argmax": None, "argmin": None, "max": 1, "min": 1}
_PASS_THROUGH = frozenset({"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "select", "slice", "permute",
                           "transpose", "t", "expand", "clone", "contiguous", "_to_copy", "alias", "detach",
                           "flatten", "unbind", "split", "chunk", "lift_fresh", "lift_fresh_copy"})
_REDUCTIONS = frozenset({"sum", "any"})
_NONZERO_TESTS = frozenset({"gt", "ne"})  # count > 0, count != 0: was this expert hit


@dataclasses.dataclass(frozen=True)
class Routing:
    kind: str  # "index" (expert ids per slot), "mask" (bool/0-1 per element), "count", "expert_id", "batch_sizes"
    per_element: float = 0.0  # expected true entries (mask) or value (count) per element, × 1/experts


def routing_of(value: Any) -> Routing | None:
    return getattr(value, _TAG, None) if isinstance(value, torch.Tensor) else None


def _tag(value: Any, routing: Routing) -> None:
    for leaf in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(leaf, torch.Tensor):
            setattr(leaf, _TAG, routing)


def _numel(value: Any) -> int:
    return value.numel() if isinstance(value, torch.Tensor) else 1


class DataDependentRules:
    def __init__(self) -> None:
        self.fired: Counter[tuple[str, str, str]] = Counter()  # (op, module, assumption) -> count
        self.sequence_lengths: tuple[int, ...] | None = None  # --seq-lengths, for pack_padded_sequence

    def observe(self, op: str, args: tuple, out: Any) -> None:
        """Tag what a routing decision becomes (see the module docstring). Cheap: a set lookup per op."""
        if op in _INDEX_OPS:
            position = _INDEX_OPS[op]
            if position is None:
                _tag(out, Routing("index"))
            elif isinstance(out, (tuple, list)) and len(out) > position:
                _tag(out[position], Routing("index"))
            return
        source = routing_of(args[0]) if args else None
        if op == "eq" and len(args) > 1 and Routing("index") in (source, routing_of(args[1])):
            _tag(out, Routing("mask", 1.0))
        elif source is None:
            return
        elif op in _PASS_THROUGH:
            _tag(out, source)
        elif op in _REDUCTIONS and source.kind == "mask":
            reduced = _numel(args[0]) / max(_numel(out), 1)  # elements folded into each output element
            _tag(out, Routing("mask" if op == "any" else "count", source.per_element * reduced))
        elif op in _NONZERO_TESTS and source.kind == "count" and len(args) > 1 and args[1] == 0:
            _tag(out, Routing("mask", source.per_element))

    def handle(self, func: Any, args: tuple, kwargs: dict, error: Exception, module: str,
               module_object: Any = None) -> Any:
        op = str(getattr(func, "overloadpacket", func)).removeprefix("aten.")
        if not isinstance(error, FAKE_LIMITATIONS):
            raise error  # a real error of the model on this input (shape mismatch…): reported as such
        if op == "_local_scalar_dense" and isinstance(args[0], torch.Tensor):
            return self._value_read(args[0], module)
        if op == "_pack_padded_sequence":
            return self._packed(args, module)
        experts = getattr(module_object, "num_experts", None)
        if op in ("nonzero", "index") and isinstance(experts, int) and experts > 0:
            return self._balanced_routing(op, args, experts, module)
        raise TraceError(f"op aten.{op} cannot run on fake tensors ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else 'no message'}); "
                         "it needs a rule in trainmem/trace/rules.py", where=module or "model") from error

    def _value_read(self, tensor: torch.Tensor, module: str) -> Any:
        """A value read (`.item()`, `bool(t)`, `int(t)`). A bool or float read only steers control flow or
        is logged: read as False / 0.0 — for GradScaler's found_inf that is 'no overflow, take the step',
        the case that keeps optimizer state alive; for attention-mask checks, 'the mask is as expected'.
        An integer read usually becomes a size (`x[:n]`, `torch.zeros(n)`): reading 0 would make those
        tensors empty, so it is refused — except an expert id this module's routing rule produced, which
        only picks one of equally shaped experts."""
        if tensor.dtype == torch.bool:
            self.fired[("_local_scalar_dense", module, "value read as 0 / False")] += 1
            return False
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            self.fired[("_local_scalar_dense", module, "value read as 0 / False")] += 1
            return 0.0
        routing = routing_of(tensor)
        if routing is not None and routing.kind == "batch_sizes":  # B: batch_sizes[0], the largest entry
            return int(routing.per_element)
        if routing is not None and routing.kind == "expert_id":
            self.fired[("_local_scalar_dense", module, "expert id read as 0 (experts are alike under balanced routing)")] += 1
            return 0
        raise TraceError(f"op aten._local_scalar_dense reads an integer from a {tensor.dtype} tensor of shape "
                         f"{list(tensor.shape)} (`.item()`, `int(t)` or indexing with a tensor): fake tensors have "
                         "no values, and an integer usually becomes a size, so a guess could make the estimate low; "
                         "use a Python int or a shape there", where=module or "model")

    def _balanced_routing(self, op: str, args: tuple, experts: int, module: str) -> torch.Tensor:
        """A mixture-of-experts layer asks which experts got tokens, then which tokens each expert got
        (transformers' eager experts: `(expert_mask.sum(...) > 0).nonzero()`, then
        `torch.where(expert_mask[e])`; hand-written ones: `torch.where(idx == e)`, `x[idx == e]`).
        Balanced routing: every expert is hit, and each gets 1/experts of the token-slots. The mask must
        come from a routing decision (module docstring); anything else is refused."""
        mask, values = (args[0], None) if op == "nonzero" else _boolean_index(args)
        if mask is None:
            raise TraceError(f"op aten.index with indices {[getattr(i, 'shape', i) for i in args[1]]}: only `x[mask]` "
                             "with one leading boolean mask has a routing rule", where=module or "model")
        routing = routing_of(mask)
        if routing is None or routing.kind != "mask":
            what = "no routing decision" if routing is None else f"a routing {routing.kind}, not a mask"
            raise TraceError(f"op aten.{op} on a {list(mask.shape) if isinstance(mask, torch.Tensor) else '?'} mask "
                             f"in a mixture-of-experts layer ({experts} experts): the mask comes from {what} "
                             "(topk/argmax indices compared with an expert id, or their counts), so balanced routing "
                             "cannot say how many entries are true", where=module or "model")
        share = min(1.0, routing.per_element / experts)
        if share >= 1.0 and mask.dim() == 1 and op == "nonzero":  # the per-expert hit mask (+ a 'no expert' slot)
            self.fired[(op, module, "every expert receives tokens")] += 1
            result = torch.arange(min(experts, mask.shape[0]), dtype=torch.long).unsqueeze(1)
            _tag(result, Routing("expert_id"))
            return result
        rows = math.ceil(mask.numel() * share)
        self.fired[(op, module, "routing balanced: each expert gets 1/experts of the token-slots")] += 1
        if op == "nonzero":
            return torch.empty((rows, mask.dim()), dtype=torch.long)
        return values.new_empty((rows, *values.shape[mask.dim():]))

    def _packed(self, args: tuple, module: str) -> tuple[torch.Tensor, torch.Tensor]:
        """pack_padded_sequence by its bound: every sequence at the padded length, the most the packed data
        can hold (B × T rows), or, given the dataset's lengths (--seq-lengths), the batch of its B longest
        (trace/packed_sequences.py). The batch sizes are a real CPU tensor, as the op makes them, because the
        packed RNN kernels and pad_packed_sequence read their values."""
        padded, batch_first = args[0], bool(args[2]) if len(args) > 2 else False
        steps, batch = (padded.shape[1], padded.shape[0]) if batch_first else (padded.shape[0], padded.shape[1])
        lengths, assumption = packed_lengths(int(batch), int(steps), self.sequence_lengths)
        self.fired[("_pack_padded_sequence", module, assumption)] += 1
        with disable_current_modes():
            batch_sizes = torch.tensor([sum(1 for n in lengths if n > t) for t in range(lengths[0])], dtype=torch.int64)
        # an entry read is taken as B: batch_sizes[0], the one nn.LSTM/GRU read, and no other entry exceeds it
        _tag(batch_sizes, Routing("batch_sizes", float(batch)))
        return padded.new_empty((sum(lengths), *padded.shape[2:])), batch_sizes

    def warnings(self) -> list[str]:
        """One line per (op, assumption), with how often and where (the first modules by name)."""
        grouped: dict[tuple[str, str], Counter] = {}
        for (op, module, assumption), count in self.fired.items():
            grouped.setdefault((op, assumption), Counter())[module or "model"] += count
        lines = []
        for (op, assumption), modules in sorted(grouped.items()):
            names = sorted(modules, key=_natural)  # layers.2 before layers.10: the first blocks, however many there are
            where = ", ".join(f"'{n}'" for n in names[:3]) + (", …" if len(names) > 3 else "")
            count = f"{len(names)} modules: " if len(names) > 1 else ""
            lines.append(f"aten.{op}: {assumption} (fake tensors have no values) — ×{sum(modules.values())} in "
                         f"{count}{where}")
        return lines


def _natural(name: str) -> list:
    """A module name's sort key with its numbers as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _boolean_index(args: tuple) -> tuple[Any, Any]:
    """(the mask, the indexed tensor) of `x[mask]` (aten.index with one leading boolean index), else None."""
    values, indices = args[0], args[1]
    if len(indices) == 1 and isinstance(indices[0], torch.Tensor) and indices[0].dtype == torch.bool:
        return indices[0], values
    return None, values
