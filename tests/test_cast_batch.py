"""--precision bf16 casts a factory's float batch to bfloat16 as training code under model.to(torch.bfloat16) does
(trace/cast_batch.py); integer tensors keep their dtype, and bf16-mixed (autocast) keeps the inputs fp32."""

import pytest
import torch

import trainmem
from trainmem.trace.cast_batch import CastBatch

FACTORY = """
class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(100, 256), nn.Linear(256, 10)
    def forward(self, ids, features):
        return self.head(self.embed(ids) + features)

def factory():
    return Mixed(), lambda batch: {"ids": torch.randint(0, 100, (batch, 8)), "features": torch.randn(batch, 8, 256)}

def plain():
    return nn.Linear(256, 10), lambda batch: torch.randn(batch, 256), lambda out, inputs: out.float().pow(2).mean()
"""
BATCH = 64
FEATURES = BATCH * 8 * 256  # elements of the float input
IDS = BATCH * 8 * 8  # bytes of the int64 token ids


def _inputs(est):
    return {t["name"]: t["dtype"] for t in est.resolved["inputs"]["tensors"]}


@pytest.mark.parametrize("precision, dtype, element_bytes", [("bf16", "bfloat16", 2), ("bf16-mixed", "float32", 4)])
def test_a_factory_batch_follows_the_precision(tmp_factory, precision, dtype, element_bytes):
    """On a GPU the batch at the peak is the cast copy alone (the loader's fp32 batch is host memory): 2 bytes
    per float element under bf16, 4 under bf16-mixed; the token ids stay int64 either way."""
    est = trainmem.estimate(tmp_factory(FACTORY), batch_size=BATCH, precision=precision, device="a100-40gb")
    assert _inputs(est) == {"ids": "int64", "features": dtype}
    assert est.breakdown["inputs"] == FEATURES * element_bytes + IDS
    cast = "; float tensor features cast to bfloat16 for precision bf16"
    assert est.resolved["inputs"]["from"] == "the model reference's batch maker" + (cast if precision == "bf16" else "")
    assert ("cast to bfloat16" in str(est)) == (precision == "bf16")


def test_the_traced_input_storage_is_bf16(tmp_factory):
    """The trace's storages of the first batch: the loader's fp32 tensor (host memory on a GPU) and its bf16
    copy, 2 bytes an element, which the step trains on; the CPU target keeps both (a CPU loop makes both)."""
    from trainmem.devices import get_device
    from trainmem.estimate import prepare, trace
    from trainmem.setup import TrainingSetup
    from trainmem.trace.events import Phase

    setup = TrainingSetup.from_mapping({"batch_size": BATCH, "precision": "bf16"})
    traced = trace(prepare(tmp_factory(FACTORY), setup, get_device("a100-40gb")), setup).trace
    first = [r for r in traced.storages.values() if r.phase == Phase.INPUTS and r.step == 0 and r.nbytes > IDS]
    assert sorted((r.dtype, r.nbytes, r.sid in traced.host_storages) for r in first) == [
        ("bfloat16", FEATURES * 2, False), ("float32", FEATURES * 4, True)]


def test_a_plain_tensor_batch_with_its_own_loss(tmp_factory):
    """(model, make_batch, loss_fn) returning one fp32 tensor: without the cast a bf16 Linear refuses it."""
    est = trainmem.estimate(tmp_factory(FACTORY, "plain"), batch_size=BATCH, precision="bf16")
    assert _inputs(est) == {"0": "bfloat16"}


def test_the_cast_keeps_the_batch_structure():
    Pair = __import__("collections").namedtuple("Pair", "x y")
    maker = CastBatch(lambda n: [Pair(torch.randn(n, 2), torch.zeros(n, dtype=torch.long)),
                                 {"mask": torch.ones(n, dtype=torch.bool), "w": torch.randn(n, dtype=torch.float64)}])
    batch = maker(3)
    assert isinstance(batch, list) and isinstance(batch[0], Pair)
    assert [batch[0].x.dtype, batch[0].y.dtype, batch[1]["mask"].dtype, batch[1]["w"].dtype] == [
        torch.bfloat16, torch.long, torch.bool, torch.bfloat16]
    assert maker.cast == ["0.x", "1.w"]
