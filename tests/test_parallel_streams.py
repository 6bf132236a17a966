"""FSDP2's side streams on a CUDA target: the trace labels each storage with the stream it was allocated on (FSDP2's
`device_handle.stream(...)` regions select torch.cpu streams during the CPU trace as they select CUDA streams on a
GPU), and the caching allocator keeps each block in its allocation stream's pool, so a freed all-gather or
reduce-scatter block is not reused by a default-stream request. Also fully_shard's default reshard_after_forward
(None: the root keeps its unsharded parameters into backward)."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor

import trainmem
from trainmem.alloc.cuda_config import AllocatorConfig
from trainmem.alloc.replay import CudaAllocator
from trainmem.parallel import fsdp
from trainmem.parallel.apply import ParallelContext
from trainmem.setup.layout import ParallelLayout
from trainmem.parallel.world import fake_world
from trainmem.setup import TrainingSetup
from trainmem.alloc.device_events import DeviceEvent
from trainmem.targets import cuda_target
from trainmem.trace.events import Category, Phase
from trainmem.trace.torch_private import FakeTensorMode

MIB = 1 << 20


def _event(action: str, key: int, nbytes: int, stream: int = 0) -> DeviceEvent:
    event = DeviceEvent(action, nbytes, key, Category.COMMUNICATION, Phase.FORWARD, "", "empty", 0, key)
    if stream and action == "alloc":
        fields = {name: getattr(event, name) for name in DeviceEvent.__dataclass_fields__}
        return cuda_target.StreamEvent(**fields, stream=stream)
    return event


def test_a_freed_side_stream_block_is_not_reused_by_a_default_stream_request():
    # a 4 MiB request is a large-pool request: cudaMalloc'd as one 20 MiB segment (kLargeBuffer, requests of
    # 1-10 MiB; CUDACachingAllocator.cpp get_allocation_size). Freed on its own stream, the block stays in that
    # stream's pool: a default-stream request of the same size needs a second segment
    on_side = [_event("alloc", 1, 4 * MIB, stream=1), _event("free", 1, 4 * MIB), _event("alloc", 2, 4 * MIB)]
    same = [_event("alloc", 1, 4 * MIB), _event("free", 1, 4 * MIB), _event("alloc", 2, 4 * MIB)]
    allocator = CudaAllocator(AllocatorConfig())
    assert allocator.replay(same).reserved == 20 * MIB
    assert allocator.replay(on_side).reserved == 40 * MIB
    assert allocator.replay(on_side).allocated == allocator.replay(same).allocated == 4 * MIB


def test_fsdp_on_a_cuda_target_allocates_collective_buffers_on_side_streams(monkeypatch):
    seen: list[dict] = []
    real = cuda_target.on_streams

    def spy(stream, trace):
        by_stream = collections.defaultdict(collections.Counter)
        for record in trace.storages.values():
            by_stream[record.stream][(record.op, record.category, record.phase)] += 1
        seen.append(by_stream)
        return real(stream, trace)

    def estimate():
        result = trainmem.estimate("mlp:256-512-512-512-10", device="h200", strategy="fsdp", world_size=2,
                                   batch_size=64, optimizer="adam", steps=2)
        return result.to_dict()["ranks"][0]["peak"]

    monkeypatch.setattr(cuda_target, "on_streams", spy)
    with_streams = estimate()
    streams = seen[-1]
    # FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): foreach_all_gather makes the all-gather
    # buffer under all_gather_copy_in_stream (forward, and backward's re-gather: 4 units x 2 steps each),
    # foreach_reduce the reduce-scatter output (the sharded gradients are views of it) under reduce_scatter_stream;
    # the reduce-scatter input and the unsharded parameters are made on the current (default) stream
    communication, gradients = Category.COMMUNICATION, Category.GRADIENTS
    assert sorted(streams) == [0, 1, 2]
    # (the op that makes that buffer: torch.empty in foreach_all_gather under torch 2.10-2.15; under 2.8 the custom op
    # fsdp::all_gather_copy_in allocates it; either way one per unit and step, on stream 1)
    maker = "all_gather_copy_in" if ("all_gather_copy_in", communication, Phase.FORWARD) in streams[1] else "empty"
    assert streams[1] == {(maker, communication, Phase.FORWARD): 8, (maker, communication, Phase.BACKWARD): 8}
    assert streams[2] == {("empty", gradients, Phase.BACKWARD): 8}
    assert streams[0][("empty", communication, Phase.BACKWARD)] == 8  # reduce-scatter inputs
    assert streams[0][("resize_", Category.PARAMETERS, Phase.BACKWARD)] == 16  # unsharded parameters

    monkeypatch.setattr(cuda_target, "on_streams", lambda stream, trace: stream)
    without = estimate()
    assert with_streams["allocated_bytes"] == without["allocated_bytes"]
    assert with_streams["reserved_bytes"] > without["reserved_bytes"]


class _Model(nn.Module):
    """A root with parameters of its own (an embedding-like Linear, as GPT's root holds the embeddings) and two blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(32, 32)
        self.blocks = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))

    def forward(self, x):
        return self.blocks(self.head(x))


@pytest.mark.parametrize("reshard, root_kept", [(None, True), (True, False)])
def test_reshard_after_forward_none_keeps_the_root_unsharded_into_backward(reshard, root_kept):
    layout = ParallelLayout(strategy="fsdp", world_size=2).resolve()
    with fake_world(layout, 0) as world:
        with torch.device("meta"):
            model = _Model()
        ctx = ParallelContext(layout, world, None, TrainingSetup())
        notes = fsdp.shard(model, ctx, reshard_after_forward=reshard, prefetch=1, units=list(model.blocks))
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            model(torch.randn(4, 32)).sum()  # forward only: what stays unsharded until backward
            # FSDP2 registers the unsharded parameter (a plain tensor) while unsharded, the sharded DTensor otherwise
            assert (not isinstance(model.head.weight, DTensor)) == root_kept
            assert all(isinstance(block.weight, DTensor) for block in model.blocks)
    assert ("not passed" in notes[0]) == (reshard is None)
