"""Two CPU facts a fake trace does not see, each checked against the real op on this machine:
torch.utils.checkpoint's saved CPU RNG state (trace/rng_state.py) and batch norm's fp32 statistics for a
bf16 input with fp32 parameters (targets/cpu_kernels.py _batch_norm_mixed)."""

from __future__ import annotations

import pytest
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.checkpoint import checkpoint

import trainmem
from trainmem.trace.rng_state import state_bytes

MODELS = str(Path(__file__).with_name("models.py"))


def _real_allocations(run) -> list[int]:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    return [event.cpu_memory_usage for event in prof.events() if event.cpu_memory_usage > 0]


@pytest.mark.heavy
def test_checkpoint_keeps_the_rng_state_as_a_real_run_does(monkeypatch):
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.1))
    x = torch.randn(2, 8, requires_grad=True)
    states = []
    real_get = torch.get_rng_state
    monkeypatch.setattr(torch, "get_rng_state", lambda: states.append(real_get()) or states[-1])

    def run():
        checkpoint(block, x, use_reentrant=False).sum().backward()

    assert state_bytes() in _real_allocations(run)  # the state is a real CPU allocation, the profiler sees it
    monkeypatch.undo()
    # each call made a new state of that size: saved in forward, and fork_rng's copy around the recomputation
    assert [state.untyped_storage().nbytes() for state in states] == [state_bytes()] * 2
    real = len(states)
    est = trainmem.estimate(f"{MODELS}:tiny_gpt", batch_size=2, target_shape="128", checkpointing=True, run_steps=2)
    states = [e for e in est.replay_input.events if e.action == "alloc" and e.nbytes == state_bytes()]
    blocks = 4  # tiny_gpt's layers, each checkpointed
    assert len(states) == real * blocks * 2  # two traced steps
    # kept for backward: the saved ones are activations of the forward phase
    assert sum(str(e.phase) == "forward" for e in states) == blocks * 2
    gpu = trainmem.estimate(f"{MODELS}:tiny_gpt", batch_size=2, target_shape="128", checkpointing=True, run_steps=2,
                            device="a100-40gb")
    assert not [e for e in gpu.replay_input.events if e.nbytes == state_bytes()]  # host memory, not the GPU's


def test_batch_norm_statistics_in_fp32_for_a_bf16_input_as_the_real_kernel():
    bn = torch.nn.BatchNorm2d(8)
    x = torch.randn(4, 8, 5, 5, dtype=torch.bfloat16)
    out = torch.ops.aten.native_batch_norm(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, True, 0.1, 1e-5)
    real = [t.untyped_storage().nbytes() for t in out]
    assert real[1:] == [8 * 4, 8 * 4]
    mixed = trainmem.estimate(f"{MODELS}:cnn_bn", batch_size=2, target_shape="scalar", precision="bf16-mixed",
                              run_steps=2)
    assert mixed.coverage["kernel_rules"].get("batch norm statistics in fp32 for a reduced-precision input") == 6
    plain = trainmem.estimate(f"{MODELS}:cnn_bn", batch_size=2, target_shape="scalar", run_steps=2)
    assert "batch norm statistics in fp32 for a reduced-precision input" not in plain.coverage["kernel_rules"]
