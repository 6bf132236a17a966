"""The inline loop's trace derived from the lean loop's (trace/loop_twin.py) against a trace of the inline loop
itself: event for event, storage for storage (categories included), the same kernel calls and facts, on the zoo's
model families, loop-relevant setups (accumulation, mixed precision, a GPU target, checkpointing, frozen
parameters) and an HF model. The one thing allowed to differ is the count of prim.device queries: whether a fake
kernel runs (and asks its inputs' devices) or the fake tensor cache answers depends on the cache's state, not on
the loop."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from conftest import zoo
from trainmem.setup import TrainingSetup
from trainmem.trace import cache_store
from trainmem.trace.events import TensorMeta
from trainmem.trace.loop_twin import derivable, inline_from_lean

orchestrate = importlib.import_module("trainmem.estimate.orchestrate")

CASES = [  # (reference, setup values, device)
    ("mlp:1000-100-100-100-100-10", {"input_shape": "1000", "batch_size": 256, "optimizer": "adam"}, "cpu"),
    (zoo("cnn_bn"), {"batch_size": 8, "optimizer": "momentum", "grad_accum": 2}, "cpu"),
    (zoo("resnet_small"), {"batch_size": 4, "optimizer": "adam"}, "cpu"),
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "adamw", "precision": "bf16-mixed"}, "cpu"),
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "adamw", "precision": "fp16-mixed"}, "a100-40gb"),
    (zoo("tiny_gpt"), {"batch_size": 2, "optimizer": "sgd", "checkpointing": True}, "cpu"),
    (zoo("lstm"), {"batch_size": 4, "optimizer": "adam", "grad_accum": 3}, "cpu"),
    (zoo("unet"), {"batch_size": 2, "optimizer": "adam"}, "cpu"),
    (zoo("frozen_backbone"), {"batch_size": 4, "optimizer": "adam"}, "cpu"),
    (zoo("tied_lm"), {"batch_size": 2, "optimizer": "adamw"}, "h100-80gb"),
    (zoo("moe_token_mask"), {"batch_size": 8, "optimizer": "adam"}, "cpu"),
    ("hf:tests/data/tiny_llama", {"batch_size": 2, "seq_len": 32, "optimizer": "adamw",
                                  "lora": "r=4,alpha=8,targets=q_proj,v_proj"}, "cpu"),
    ("hf:tests/data/tiny_llama", {"batch_size": 2, "seq_len": 32, "qlora": True}, "a100-40gb"),
    # bitsandbytes before 0.43.2 keeps each 4-bit layer's input on its autograd context: the graph holds it past
    # backward, so it dies when the loop drops the graph (the lean loop's `del loss`), not with a name's tensors
    ("hf:tests/data/tiny_llama", {"batch_size": 2, "seq_len": 32, "qlora": True, "bnb_version": "0.42.0",
                                  "checkpointing": False, "grad_accum": 2}, "a100-40gb"),
    ("hf:tests/data/tiny_llama", {"batch_size": 2, "seq_len": 32, "qlora": True, "bnb_version": "0.41.1"}, "cpu"),
    (zoo("gru"), {"batch_size": 4, "optimizer": "adam"}, "cpu"),
    (zoo("packed_lstm_tagger"), {"batch_size": 4, "optimizer": "adam"}, "cpu"),
    (zoo("conv_autoencoder"), {"batch_size": 4, "optimizer": "adam", "precision": "bf16-mixed"}, "cpu"),
    (zoo("transformer_encoder"), {"batch_size": 4, "optimizer": "adam", "precision": "bf16-mixed"}, "h100-80gb"),
    (zoo("embbag_recsys"), {"batch_size": 16, "optimizer": "adam"}, "cpu"),
    (zoo("mobilenet_like"), {"batch_size": 4, "optimizer": "momentum"}, "a100-40gb"),
]


def _traced(reference: str, values: dict, device: str, loop: str):
    setup = TrainingSetup.from_mapping({**values, "loop": loop})
    with cache_store.as_asked(False):
        return orchestrate.trace(orchestrate.prepare(reference, setup, device), setup)


def _normalized(call):
    """A kernel call with each TensorMeta's storage_key (a Python id during the call) as its rank in the call."""
    seen: dict[int, int] = {}

    def plain(value):
        if isinstance(value, TensorMeta):
            return dataclasses.replace(value, storage_key=seen.setdefault(value.storage_key, len(seen)))
        if isinstance(value, (tuple, list)):
            return type(value)(plain(item) for item in value)
        return value

    return dataclasses.replace(call, args=plain(call.args), outputs=plain(call.outputs))


@pytest.mark.heavy
@pytest.mark.parametrize("reference,values,device", CASES,
                         ids=[f"{r.rsplit(':', 1)[-1].rsplit('/', 1)[-1]}-{i}" for i, (r, _, _) in enumerate(CASES)])
def test_the_derived_inline_trace_is_the_traced_one(reference, values, device):
    inline = _traced(reference, values, device, "inline")
    derived = inline_from_lean(_traced(reference, values, device, "lean"))
    assert derived is not None
    assert derived.trace.events == inline.trace.events
    assert derived.trace.storages == inline.trace.storages
    assert [_normalized(c) for c in derived.trace.kernel_calls] == [_normalized(c) for c in inline.trace.kernel_calls]
    for name in ("host_storages", "managed_storages", "offloaded_storages", "loop_marks"):
        assert getattr(derived.trace, name) == getattr(inline.trace, name), name
    queries = ("device",)
    assert ({op: n for op, n in derived.op_counts.items() if op not in queries}
            == {op: n for op, n in inline.op_counts.items() if op not in queries})
    plain = dict(trace=None, op_counts=None, cache_use=None)
    assert dataclasses.replace(derived, **plain) == dataclasses.replace(inline, **plain)


def test_only_the_default_inline_loop_is_derived():
    assert derivable(TrainingSetup())
    for values in ({"loop": "step-fn"}, {"loop": "lean"}, {"zero_grad": "zeros"}, {"compile": True},
                   {"strategy": "ddp", "world_size": 2}):
        assert not derivable(TrainingSetup.from_mapping(values)), values


def test_a_trace_without_marks_is_not_derived():
    inline = _traced("mlp:16-8-2", {"input_shape": "16", "batch_size": 4}, "cpu", "inline")
    assert inline.trace.loop_marks == [] and inline_from_lean(inline) is None


def test_a_name_holding_more_than_the_walk_bounds_is_not_derived(monkeypatch):
    from trainmem.trace import run

    walk = run._tensor_leaves_of
    monkeypatch.setattr(run, "_tensor_leaves_of", lambda value: walk(value, limit=1))
    lean = _traced("mlp:16-8-2", {"input_shape": "16", "batch_size": 4, "target_shape": "scalar"}, "cpu", "lean")
    assert any(mark[0] == "incomplete" for mark in lean.trace.loop_marks) and inline_from_lean(lean) is None
