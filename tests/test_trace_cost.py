"""The trace's own work per op does not grow with the trace, and the constant-cost bookkeeping of which
module made each autograd node answers exactly what a rescan of every noted output at every dispatch
answers (trace/modules.py). Work is counted, not timed: `outputs_looked_at` is how many times the tracker
read an output's grad_fn."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from trainmem.trace.events import Phase
from trainmem.trace.modules import ModuleTracker
from trainmem.trace.recorder import TraceRecorder
from trainmem.trace.torch_private import FakeTensorMode, sequence_nr, tree_leaves


class RescanTracker(ModuleTracker):
    """The reference: every noted output is looked at on every dispatch until it has a grad_fn, dies,
    or its module returns (what trace/modules.py did before its cost was made constant)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._pending: list[tuple[weakref.ref, str]] = []

    def note_outputs(self, out) -> None:
        if self._stack:
            self._pending.extend((weakref.ref(t), self._stack[-1]) for t in tree_leaves(out) if isinstance(t, torch.Tensor))

    def resolve_pending(self) -> None:
        unresolved = []
        self.outputs_looked_at += len(self._pending)
        for ref, name in self._pending:
            tensor = ref()
            if tensor is None:
                continue
            if tensor.grad_fn is not None:
                self._by_sequence_nr.setdefault(sequence_nr(tensor.grad_fn), name)
            else:
                unresolved.append((ref, name))
        self._pending = unresolved

    def before_op(self, written_storages) -> None:
        self.resolve_pending()

    def _post(self, module, args, output) -> None:
        if self._names.get(id(module)) is not None and self._stack:
            self.resolve_pending()
            self._pending.clear()
        super()._post(module, args, output)


class BiGRU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(8, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0].mean(dim=1))


class _AddInPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))

    def forward(self, buffer, x):
        return buffer.add_(F.linear(x, self.weight))


class InPlaceOnNoted(nn.Module):
    """A buffer made without a grad_fn gets one later, when an in-place op with a trainable operand (in
    another module) writes it: the buffer's settled output must be looked at again, and being noted
    first, it claims the in-place op's node for this module, as a rescan has it."""

    def __init__(self) -> None:
        super().__init__()
        self.add = _AddInPlace()

    def forward(self, x):
        buffer = torch.zeros(x.shape)
        scratch = x * 3  # an op between: the buffer has settled by the in-place op
        return (self.add(buffer, x) * 2).sum() + scratch.sum()


class _ScaleThenShift(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        scaled = x * 2
        ctx.save_for_backward(scaled + 1)  # an op after `scaled`, whose grad_fn comes only when forward returns
        return scaled

    @staticmethod
    def backward(ctx, grad):
        (shifted,) = ctx.saved_tensors
        return grad * shifted


class FunctionOutputs(nn.Module):
    """The output of an autograd.Function, made inside its forward (grad disabled), gets its grad_fn
    when the forward returns, several ops later."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return (_ScaleThenShift.apply(x * self.weight) * 3).sum()


def _trace(model: nn.Module, inputs: torch.Tensor, tracker_type: type[ModuleTracker]):
    """Forward and backward of `model` on fake tensors under the recorder; the tracker and the op count."""
    tracker = tracker_type(model)
    recorder = TraceRecorder(tracker)
    with FakeTensorMode(allow_non_fake_inputs=True), tracker, recorder:
        recorder.phase = Phase.FORWARD
        loss = model(inputs).sum()
        recorder.phase = Phase.BACKWARD
        loss.backward()
    return tracker, sum(recorder.op_counts.values())


def _relative(mapping: dict[int, str]) -> list[tuple[int, str]]:
    """Sequence numbers count from wherever the thread's counter stood: compare them from the first."""
    first = min(mapping, default=0)
    return sorted((number - first, name) for number, name in mapping.items())


def test_grad_fn_lookups_per_op_do_not_grow_with_the_sequence():
    torch.manual_seed(0)
    per_op = {}
    for length in (8, 32):
        tracker, ops = _trace(BiGRU(), torch.randn(2, length, 8), ModuleTracker)
        per_op[length] = tracker.outputs_looked_at / ops
    assert per_op[32] <= per_op[8] * 1.1, per_op
    assert per_op[32] < 1.0, per_op


def test_the_rescan_it_replaces_grows_with_the_sequence():
    """The same count for the rescan: it grows about as the sequence does (the test above can fail)."""
    per_op = {}
    for length in (8, 32):
        tracker, ops = _trace(BiGRU(), torch.randn(2, length, 8), RescanTracker)
        per_op[length] = tracker.outputs_looked_at / ops
    assert per_op[32] > per_op[8] * 2.5, per_op


@pytest.mark.parametrize("model, inputs", [
    (BiGRU, (2, 12, 8)),
    (lambda: nn.Sequential(InPlaceOnNoted()), (3, 4)),
    (lambda: nn.Sequential(FunctionOutputs()), (4,)),
])
def test_module_of_each_autograd_node_is_what_a_rescan_finds(model, inputs):
    torch.manual_seed(0)
    constant, _ = _trace(model(), torch.randn(*inputs), ModuleTracker)
    torch.manual_seed(0)
    rescan, _ = _trace(model(), torch.randn(*inputs), RescanTracker)
    assert constant._by_sequence_nr, "nothing was attributed: the test would pass vacuously"
    assert _relative(constant._by_sequence_nr) == _relative(rescan._by_sequence_nr)


class _Probe(torch.autograd.Function):
    """Records, in its backward, the module the tracker names for the node running (its own)."""

    seen: list[str] = []

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        _Probe.seen.append(ModuleTracker.active.current())
        return grad * 2


class _Probed(nn.Module):
    def forward(self, x):
        return _Probe.apply(x)


def test_a_node_no_output_claimed_is_the_module_it_was_made_in():
    """A node whose outputs the recorder never saw get a grad_fn (a DTensor op's: the recorder sees its local tensors'
    ops) is attributed by its sequence number to the module innermost when it was made (trace/modules.py _made_in).
    Here no output is noted at all: every module named in backward comes from that."""
    model = nn.Sequential(_Probed(), nn.Linear(4, 4), nn.Sequential(nn.ReLU(), _Probed()))
    _Probe.seen = []
    with ModuleTracker(model) as tracker:
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    assert not tracker._by_sequence_nr
    assert _Probe.seen == ["2.1", "0"]
