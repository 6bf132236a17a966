"""trace/batch_scaling.py: the trace of one batch size predicted from the traces of two equals the real
trace there, value for value, and so does the estimate replayed on it; streams that are not one stream
across batch sizes are refused or found out."""

import dataclasses

import pytest

from conftest import zoo
from trainmem.estimate import assemble_traced, prepare, trace
from trainmem.setup import TrainingSetup
from trainmem.trace.batch_scaling import BatchScaling, StreamsDiffer, Unpredictable, canonical
from trainmem.trace.events import Event, KernelCall, Phase, TensorMeta

GPU = "a100-80gb"


def _traces(model: str, device: str, batches, **values):
    """Traces at each batch, as the first ones of their shapes in the process: FakeTensorMode's dispatch
    cache is process-wide, and an op met again with the same shapes records fewer internal ops (detach,
    copy_) in op_counts, so a trace repeated from an earlier test would differ there."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    FakeTensorMode.cache_clear()
    setup = TrainingSetup.from_mapping({"optimizer": "adam", **values})
    chosen = prepare(model, setup, device)
    at = {batch: dataclasses.replace(setup, batch_size=batch) for batch in batches}
    return chosen, at, {batch: trace(chosen, at[batch]) for batch in batches}


@pytest.mark.heavy
@pytest.mark.parametrize("model, device, values", [
    ("mlp:64-32-10", "cpu", {"input_shape": "64"}),
    ("mlp:64-32-10", GPU, {"input_shape": "64", "precision": "bf16-mixed"}),
    (zoo("tiny_conv"), "cpu", {}),
    (zoo("tiny_conv"), GPU, {}),
    (zoo("tiny_attention"), "cpu", {}),
    (zoo("tiny_attention"), GPU, {"precision": "bf16-mixed"}),
    (zoo("tiny_lstm"), "cpu", {}),
    (zoo("tiny_lstm"), GPU, {}),
    (zoo("cnn_bn"), GPU, {"optimizer": "sgd"}),
])
def test_prediction_is_the_real_trace(model, device, values):
    """Traced at 2 and 4, predicted at 7 and 33: every event, storage, kernel call and batch-sized fact is
    what tracing 7 and 33 gives, and the estimate replayed on the prediction is the real one, byte for byte."""
    chosen, at, traced = _traces(model, device, (2, 4, 7, 33), **values)
    scaling = BatchScaling(2, traced[2], 4, traced[4])
    for batch in (7, 33):
        predicted = scaling.at(batch)
        real = canonical(traced[batch])
        assert [(e.action, e.nbytes, e.sid, e.op) for e in predicted.trace.events] == \
               [(e.action, e.nbytes, e.sid, e.op) for e in real.trace.events]
        assert predicted.trace.kernel_calls == real.trace.kernel_calls
        assert (predicted.input_bytes, predicted.output_elements) == (real.input_bytes, real.output_elements)
        assert predicted == real and scaling.matches(batch, traced[batch])
        assert assemble_traced(chosen, at[batch], predicted).to_dict() == \
               assemble_traced(chosen, at[batch], traced[batch]).to_dict()
    assert any(a.nbytes != b.nbytes for a, b in zip(traced[2].trace.events, traced[33].trace.events))


GUARDED = """
class Guarded(nn.Module):
    '''Takes another branch above batch 4: the branch makes one more activation.'''
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(32, 32)
    def forward(self, x):
        x = self.layer(x)
        if x.shape[0] > 4:
            x = torch.cat([x, x], dim=1)[:, :32] * 2
        return x

def factory():
    return Guarded(), lambda batch: (torch.randn(batch, 32),)
"""

CHUNKED = """
class Chunked(nn.Module):
    '''Runs its layer on chunks of 3 samples: the number of ops follows the batch.'''
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(32, 32)
    def forward(self, x):
        return torch.cat([self.layer(chunk) for chunk in x.split(3)])

def factory():
    return Chunked(), lambda batch: (torch.randn(batch, 32),)
"""


def test_a_guard_on_the_batch_is_found_out(tmp_factory):
    """Traces at 2 and 4 match (both below the guard), so a line exists; the real trace at 8 is not on it."""
    _, _, traced = _traces(tmp_factory(GUARDED), "cpu", (2, 4, 8))
    scaling = BatchScaling(2, traced[2], 4, traced[4])
    assert not scaling.matches(8, traced[8])
    assert len(scaling.at(8).trace.events) < len(traced[8].trace.events)


def test_ops_that_follow_the_batch_are_refused(tmp_factory):
    _, _, traced = _traces(tmp_factory(CHUNKED), "cpu", (2, 4))
    with pytest.raises(StreamsDiffer) as refused:
        BatchScaling(2, traced[2], 4, traced[4])
    assert refused.value.where.startswith("batch 2 against 4.trace.")


def _event(nbytes: int, op: str = "mm") -> Event:
    return Event(0, "alloc", nbytes, 0, Phase.FORWARD, "layer", op, 0)


@dataclasses.dataclass
class _Holder:  # stands in for a TraceResult: canonical() needs .trace.kernel_calls
    trace: object
    sizes: list


def _holder(events, sizes=()):
    from trainmem.trace.events import Trace

    return _Holder(Trace(events=list(events)), list(sizes))


def test_sizes_follow_a_line_and_nothing_else():
    scaling = BatchScaling(2, _holder([_event(100), _event(64)], [3]), 5, _holder([_event(160), _event(64)], [9]))
    predicted = scaling.at(11)
    assert [e.nbytes for e in predicted.trace.events] == [280, 64] and predicted.sizes == [21]
    assert predicted.trace.events[1] is scaling.at(3).trace.events[1]  # what does not change is shared
    with pytest.raises(Unpredictable):
        BatchScaling(2, _holder([_event(100)]), 3, _holder([_event(40)])).at(4)  # 100 − 60·2 < 0
    with pytest.raises(StreamsDiffer, match="not a whole number"):
        BatchScaling(2, _holder([_event(100)]), 4, _holder([_event(101)]))
    with pytest.raises(StreamsDiffer) as refused:
        BatchScaling(1, _holder([_event(8, "mm")]), 2, _holder([_event(16, "addmm")]))
    assert refused.value.where == "batch 1 against 2.trace.events[0].op"
    with pytest.raises(StreamsDiffer, match="items"):
        BatchScaling(1, _holder([_event(8)]), 2, _holder([_event(8), _event(8)]))


def test_batch_1_flags_are_batch_2s():
    """A (1, n) transpose is contiguous at batch 1 only: from the pair (1, 2) the flag is batch 2's for every
    batch above 1; from any other pair a differing flag is another stream."""
    def call(contiguous: bool, batch: int):
        holder = _holder([_event(8 * batch)])
        holder.trace.kernel_calls = [KernelCall("mm", 0, 1, (TensorMeta((batch, 8), 4, "float32", contiguous),), (), ())]
        return holder

    predicted = BatchScaling(1, call(True, 1), 2, call(False, 2)).at(5)
    assert predicted.trace.kernel_calls[0].args[0] == TensorMeta((5, 8), 4, "float32", False)
    assert predicted.trace.events[0].nbytes == 40
    with pytest.raises(Unpredictable):
        BatchScaling(1, call(True, 1), 2, call(False, 2)).at(1)
    with pytest.raises(StreamsDiffer, match="True against False"):
        BatchScaling(2, call(True, 2), 4, call(False, 4))


def test_storage_keys_keep_only_their_pattern():
    """A kernel call's storage keys are ids that change from run to run: numbered by first appearance,
    two traces whose calls share storage alike compare equal, and unlike do not."""
    def call(*keys):
        return KernelCall("lstm", 0, 0, tuple(TensorMeta((2, 4), 4, "float32", True, k) for k in keys), (), ())

    def numbered(*keys):
        holder = _holder([])
        holder.trace.kernel_calls = [call(*keys)]
        return canonical(holder).trace.kernel_calls[0]

    assert [m.storage_key for m in numbered(9001, 77, 9001).args] == [0, 1, 0]
    assert numbered(9001, 77, 9001) == numbered(5, 6, 5) != numbered(5, 6, 6)
