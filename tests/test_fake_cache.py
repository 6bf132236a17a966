"""FakeTensorMode's dispatch cache under a trace (trace/fake_cache.py): a cache hit must give the storages a fresh
meta-kernel call gives, so a trace with the cache equals one without it, event for event."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainmem.frontends import resolve
from trainmem.setup import TrainingSetup
from trainmem.targets import cpu_kernels
from trainmem.trace import fake_cache, run
from trainmem.trace.torch_private import FakeTensorMode, destroy_library

MODELS = str(Path(__file__).with_name("models.py"))


@pytest.fixture(scope="module")
def twin_op():
    """An aten op whose meta kernel returns one tensor twice, as mkldnn_rnn_layer_backward's bias gradients are
    one tensor. It is in aten's namespace because FakeTensorMode caches built-in ops only."""
    library = torch.library.Library("aten", "FRAGMENT")
    library.define("_trainmem_test_twin(Tensor x) -> (Tensor, Tensor)")

    def meta(x):
        out = torch.empty_like(x)
        return out, out

    library.impl("_trainmem_test_twin", meta, "Meta")
    yield torch.ops.aten._trainmem_test_twin.default
    destroy_library(library)


def _shared(outputs) -> bool:
    return id(outputs[0].untyped_storage()) == id(outputs[1].untyped_storage())


def _twice(mode, op):
    with mode:
        x = torch.empty(4, 8)
        return [op(x) for _ in range(2)]


def test_a_plain_cache_hit_splits_outputs_the_meta_kernel_shares(twin_op):
    """The mechanism the checked cache guards against: without it, the second call traces other storages."""
    first, second = _twice(FakeTensorMode(allow_non_fake_inputs=True), twin_op)
    assert _shared(first) and not _shared(second)


def test_the_tracing_mode_gives_every_call_the_meta_kernels_storages(twin_op):
    first, second = _twice(fake_cache.tracing_fake_mode(), twin_op)
    assert _shared(first) and _shared(second)


def test_the_tracing_mode_caches_ordinary_ops():
    assert isinstance(fake_cache.tracing_fake_mode(), fake_cache.TracingFakeTensorMode)  # this torch has the hooks
    hits = FakeTensorMode.cache_hits
    with fake_cache.tracing_fake_mode():
        x = torch.empty(3, 5)
        for _ in range(3):
            torch.mm(x, x.t())
    assert FakeTensorMode.cache_hits >= hits + 2


def test_in_place_and_view_outputs_are_rebuilt_as_they_were():
    """An in-place op's output is its argument and a view op's shares its input's storage: a hit rebuilds both."""
    with fake_cache.tracing_fake_mode():
        x = torch.empty(6, 4)
        for _ in range(2):
            assert x.add_(1) is x
            assert x.view(24).untyped_storage() is x.untyped_storage()
            assert x.t().contiguous().untyped_storage() is not x.untyped_storage()


def test_our_keys_tell_tensors_apart_exactly_as_torchs_metadata_does():
    """_tensor_key against extract_tensor_metadata on tensors that differ in one field each (shape, stride, layout in
    memory, offset, storage size, dtype, device, requires_grad, conj, neg, inference mode): equal keys exactly where
    torch's metadata is equal."""
    from torch._subclasses.fake_tensor import extract_tensor_metadata

    assert fake_cache._has_fast_keys()  # this torch's TensorMetadata is the one the keys cover
    mode = fake_cache.tracing_fake_mode()
    with mode:
        base = torch.empty(4, 6)
        with torch.inference_mode():
            inference = torch.empty(4, 6)
        tensors = [base, torch.empty(4, 6), base.t(), base.t().contiguous(), base[1:], torch.empty(5, 6)[1:],
                   torch.empty(24)[:24].view(4, 6), torch.empty(4, 6, dtype=torch.bfloat16),
                   torch.empty(4, 6, device="cuda"), torch.empty(4, 6, requires_grad=True),
                   torch.empty(4, 6, dtype=torch.complex64).conj(), torch.empty(4, 6, dtype=torch.complex64),
                   torch.empty(4, 6)._neg_view(), inference, torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last),
                   torch.empty(2, 3, 4, 5), torch.empty(2, 1, 4, 5).to(memory_format=torch.channels_last)]
        keys = [mode._tensor_key(t) for t in tensors]
        metadata = [extract_tensor_metadata(t) for t in tensors]
    for i in range(len(tensors)):
        for j in range(len(tensors)):
            assert (keys[i] == keys[j]) == (metadata[i] == metadata[j]), (i, j)
    assert len(set(keys)) >= len(tensors) - 2  # a fresh tensor and a contiguous copy have base's metadata


def _events(model: str, setup: TrainingSetup, cache: bool, monkeypatch) -> list[tuple]:
    if not cache:
        monkeypatch.setattr(run, "tracing_fake_mode", fake_cache.uncached_fake_mode)
    traced = run.trace_training(resolve(model, setup), setup, cpu_kernels.kernel_ops())
    monkeypatch.undo()
    return [(e.action, e.nbytes, e.phase, e.module, e.op, e.step) for e in traced.trace.events]


@pytest.mark.heavy
@pytest.mark.parametrize("model, values", [
    (f"{MODELS}:lstm", {"batch_size": 4, "target_shape": "scalar"}),
    (f"{MODELS}:tiny_gpt", {"batch_size": 2, "target_shape": "128", "precision": "bf16-mixed"}),
    (f"{MODELS}:resnet_small", {"batch_size": 2}),
    (f"{MODELS}:moe_token_mask", {"batch_size": 2}),
])
def test_a_trace_with_the_cache_equals_one_without_it_event_for_event(model, values, monkeypatch):
    setup = TrainingSetup.from_mapping({"optimizer": "adam", **values}, where="test")
    without = _events(model, setup, False, monkeypatch)
    assert _events(model, setup, True, monkeypatch) == without  # the first trace fills the cache
    assert _events(model, setup, True, monkeypatch) == without  # the second is served from it
