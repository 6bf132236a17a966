"""The seams of DESIGN.md hold: event types and the answer import without torch, the estimate package has no
import cycle, each target's rule registry refuses a second rule for an op, and an allocator's one replay
gives what separate replays gave (the live set and the snapshot at the allocated peak, the OOM figures)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainmem.alloc.cuda_caching import SegmentSummary
from trainmem.alloc.cuda_caching import replay as cuda_replay
from trainmem.alloc.cuda_config import AllocatorConfig
from trainmem.alloc.replay import CpuTensorAllocator, CudaAllocator
from trainmem.alloc.device_events import DeviceEvent
from trainmem.trace.events import Category, Phase

MiB = 2**20


def _run_without_torch(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter where `import torch` raises ImportError."""
    return subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n" + code],
                          capture_output=True, text=True, timeout=120)


def test_event_types_and_trace_import_without_torch():
    """A second framework's recorder can build the same Trace: the event types need no torch."""
    result = _run_without_torch(
        "from trainmem.trace.events import Category, Event, KernelCall, Phase, StorageRecord, TensorMeta, Trace\n"
        "from trainmem.alloc.device_events import DeviceEvent\n"
        "from trainmem.targets import DeviceStream\n"
        "from trainmem.trace.traced import TraceResult\n"
        "trace = Trace()\n"
        "trace.storages[0] = StorageRecord(0, 64, Category.ACTIVATIONS, Phase.FORWARD, 'fc', 'mm', 0)\n"
        "trace.events.append(Event(0, 'alloc', 64, 0, Phase.FORWARD, 'fc', 'mm', 0))\n"
        "assert 'torch' not in {name for name, module in sys.modules.items() if module is not None}\n"
        "print('ok')")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("first", ["trainmem.estimate.result", "trainmem.estimate.assemble",
                                   "trainmem.estimate.orchestrate", "trainmem.estimate", "trainmem.explain",
                                   "trainmem.targets.cuda_target", "trainmem.targets.cpu_target", "trainmem.alloc.replay"])
def test_estimate_package_imports_in_any_order_without_a_cycle(first):
    """No module of the estimate package is needed by what it imports: each imports first, alone."""
    result = subprocess.run([sys.executable, "-c", f"import {first}; from trainmem.estimate import Estimate, "
                             "assemble_traced, estimate, prepare, trace; print('ok')"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_estimate_is_frozen():
    import dataclasses

    import trainmem

    est = trainmem.estimate("mlp:8-4", batch_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.tensor_bytes = 0  # type: ignore[misc]
    assert est.modules[0].module == "(model)" and est.explanation.rows[0].what == "parameters"


def test_cuda_rule_registry_refuses_a_second_rule_for_an_op():
    from trainmem.targets import cuda_stream as cuda

    assert "mm" in cuda.kernel_ops() and "convolution" in cuda.kernel_ops() and "mse_loss" in cuda.kernel_ops()
    with pytest.raises(RuntimeError, match=r"a CUDA kernel rule for aten.mm is already registered"):
        cuda._RULES.register("mm")(cuda._cudnn)
    assert cuda._RULES.rule_for("mm") is cuda._cublas  # the refused rule left the first in place


def _event(action: str, key: int, nbytes: int) -> DeviceEvent:
    return DeviceEvent(action, nbytes, key, Category.ACTIVATIONS, Phase.FORWARD, "", "op", 0, key)


def _stream() -> list[DeviceEvent]:
    """Sizes that split, merge and leave segments behind, with an empty request and two peaks."""
    sizes = [3 * MiB, 700_000, 512, 25 * MiB, 0, 1, 12 * MiB]
    events = [_event("alloc", key, size) for key, size in enumerate(sizes)]
    events += [_event("free", 1, sizes[1]), _event("free", 3, sizes[3]), _event("alloc", 7, 40 * MiB),
               _event("alloc", 8, 0), _event("free", 7, 40 * MiB), _event("alloc", 9, 5 * MiB),
               _event("free", 0, sizes[0])]
    return events


def _live_at(events, index):
    live = {}
    for event in events[: index + 1]:
        if event.action == "alloc":
            live[event.key] = event
        else:
            live.pop(event.key, None)
    return live


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:20"])
def test_one_cuda_replay_gives_the_live_set_and_snapshot_of_separate_replays(conf):
    config = AllocatorConfig.from_env_string(conf)
    events = _stream()
    result = CudaAllocator(config).replay(events)
    whole = cuda_replay(events, config)
    assert (result.allocated, result.reserved) == (whole.peak_allocated_bytes, whole.peak_reserved_bytes)
    assert events[result.peak_index].key == 7  # the 40 MiB request is the allocated peak
    assert result.live == _live_at(events, result.peak_index)
    assert result.segments == SegmentSummary.of(cuda_replay(events[: result.peak_index + 1], config).snapshot())
    assert result.fragmentation == whole.fragmentation and result.out_of_memory is None


def test_out_of_memory_reports_the_whole_run_as_on_a_card_large_enough():
    events = _stream()
    small = CudaAllocator(AllocatorConfig(), capacity=60 * MiB).replay(events)
    large = CudaAllocator(AllocatorConfig()).replay(events)
    assert small.out_of_memory is not None and "out of memory" in small.out_of_memory
    assert dataclasses_without_oom(small) == dataclasses_without_oom(large)


def dataclasses_without_oom(result):  # noqa: D103 - a helper
    import dataclasses

    return dataclasses.replace(result, out_of_memory=None)


def test_cpu_allocator_counts_64_byte_chunks_and_keeps_the_live_set():
    events = [_event("alloc", 1, 100), _event("alloc", 2, 1), _event("free", 1, 100), _event("alloc", 3, 10)]
    result = CpuTensorAllocator().replay(events)
    assert (result.allocated, result.peak_index, result.reserved) == (128 + 64, 1, None)
    assert set(result.live) == {1, 2} and result.segments is None and result.out_of_memory is None
    assert CpuTensorAllocator().charged(100) == 100 and CudaAllocator(AllocatorConfig()).charged(100) == 512


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:20,roundup_power2_divisions:4"])
def test_segment_summary_sums_the_snapshot_after_every_event(conf):
    from trainmem.alloc.cuda_caching import CudaCachingAllocator

    allocator = CudaCachingAllocator(AllocatorConfig.from_env_string(conf))
    for event in _stream():
        if event.action == "alloc":
            allocator.malloc(event.key, event.nbytes)
        else:
            allocator.free(event.key)
        assert allocator.segment_summary() == SegmentSummary.of(allocator.snapshot()), event
    allocator.empty_cache()
    assert allocator.segment_summary() == SegmentSummary.of(allocator.snapshot())
