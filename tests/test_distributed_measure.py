"""Real torch.distributed runs over gloo (measure/gloo_ranks.py) against the per-rank estimate.

The matrix covers DDP, FSDP2 and ZeRO-1 at world sizes 2 and 4 and each loop style of the accuracy issue at
least once, and FSDP1 (nine launches of 2 or 4 processes, ~3.5 min on the 2-core machine under load; marked slow,
which `make test` runs):

    ddp   ws 2 inline   tests/models.py:tiny_gpt, batch 4; default buckets (25 MB, grads copied into them)
    ddp   ws 4 step-fn  1 MB buckets, gradient_as_bucket_view
    fsdp  ws 2 trainer  mlp:256-512-512-10 (as below), fully_shard per Linear, then the root
    fsdp  ws 4 lean     uneven shards (the 10-row head over 4 ranks)
    zero1 ws 2 lean     ZeroRedundancyOptimizer(Adam) partitions
    zero1 ws 4 inline
    fsdp1 ws 2 inline   tiny_gpt, batch 4, bf16-mixed, use_orig_params: FullyShardedDataParallel per block
    fsdp1 ws 4 trainer  SHARD_GRAD_OP, FSDP1 per Linear, bf16-mixed with bf16 parameters (PyTorch's FSDP tutorial)
    fsdp1 ws 4 lean     HYBRID_SHARD (shard 2, replicate 2), use_orig_params

Each rank's measured tensor peak must be within 2% of the estimate for that rank. The measured peak is c10's stream
with a gloo worker's frees that the profiler missed moved back to the end of the worker's work (c10_log.settled). Under
FSDP1 that settling sometimes moves a free from after the peak to before it: in about a third of the runs seen
(2026-12-06) one or both ranks settled one unit's buffer lower (tiny_gpt with checkpointing: 47,500,032 B settled),
while their raw stream, as it happened, peaked at the estimate to the byte (48,550,208 B). For FSDP1 each rank is
held to 2% of either figure.
"""

from __future__ import annotations

import pytest

from trainmem.errors import MeasureError
from trainmem.measure import c10_log
from trainmem.measure.gloo_ranks import measure_distributed
from trainmem.setup import TrainingSetup
from trainmem.targets.gloo import GLOO_OPS, gloo_effects
from trainmem.trace.events import KernelCall, TensorMeta

MLP = "mlp:256-512-512-10"
GPT = "tests/models.py:tiny_gpt"  # 4 pre-norm blocks, causal SDPA, tied LM head
MATRIX = [
    ("ddp", 2, "inline", {"model": GPT, "batch_size": 4}),
    ("ddp", 4, "step-fn", {"ddp_bucket_mb": 1, "gradient_as_bucket_view": True}),
    ("fsdp", 2, "trainer", {}),
    ("fsdp", 4, "lean", {}),
    ("zero1", 2, "lean", {}),
    ("zero1", 4, "inline", {}),
    ("fsdp1", 2, "inline", {"model": GPT, "batch_size": 4, "precision": "bf16-mixed", "fsdp1_use_orig_params": True}),
    ("fsdp1", 4, "trainer", {"fsdp1_sharding": "shard-grad-op", "precision": "bf16-mixed",
                             "fsdp1_param_dtype": "bfloat16"}),
    ("fsdp1", 4, "lean", {"fsdp1_sharding": "hybrid-shard", "dp_shard": 2, "fsdp1_use_orig_params": True}),
]
TOLERANCE = 0.02


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "world_size", "loop", "knobs"), MATRIX,
                         ids=[f"{s}-ws{w}-{loop}" for s, w, loop, _ in MATRIX])
def test_each_rank_within_two_percent(strategy, world_size, loop, knobs):
    knobs = dict(knobs)
    model = knobs.pop("model", MLP)
    setup = TrainingSetup.from_mapping({"batch_size": 32, "strategy": strategy, "world_size": world_size,
                                        "loop": loop, **knobs})
    result = measure_distributed(model, setup, runs=0, timeout=300)
    assert [r.rank for r in result.ranks] == list(range(world_size))
    if strategy == "fsdp1":
        _settled_or_raw_within_two_percent(result)
        return
    for rank, child in zip(result.ranks, result.tensors):
        # the ground truth wraps the model itself: nothing of trainmem.parallel (the layout is setup/layout.py)
        assert child["parallel_modules"] == []
        assert child["pairing_exact"], "c10's log and the profiler did not pair: the settled peak is not trusted"
        assert rank.estimated_tensor_bytes is not None, f"no estimate for rank {rank.rank}"
        assert abs(rank.tensor_error) <= TOLERANCE, (
            f"rank {rank.rank}: measured {rank.tensor_bytes:,} B, estimated {rank.estimated_tensor_bytes:,} B "
            f"({rank.tensor_error:+.2%})\n{result}")
    assert "rank" in str(result) and result.to_dict()["ranks"][0]["measured"]["tensor_bytes"] > 0


def _settled_or_raw_within_two_percent(result) -> None:
    for rank, child in zip(result.ranks, result.tensors):
        assert child["parallel_modules"] == [] and child["pairing_exact"]
        assert rank.estimated_tensor_bytes is not None, f"no estimate for rank {rank.rank}"
        errors = [rank.estimated_tensor_bytes / measured - 1 for measured in (child["tensor_peak_bytes"],
                                                                             child["raw_peak_bytes"])]
        assert min(abs(error) for error in errors) <= TOLERANCE, (
            f"rank {rank.rank}: settled {child['tensor_peak_bytes']:,} B, raw {child['raw_peak_bytes']:,} B, "
            f"estimated {rank.estimated_tensor_bytes:,} B\n{result}")


@pytest.mark.slow
def test_a_failing_rank_is_one_line_and_all_ranks_end():
    setup = TrainingSetup.from_mapping({"batch_size": 4, "strategy": "ddp", "world_size": 2})
    with pytest.raises(MeasureError) as caught:
        measure_distributed("mlp:not-a-layer-list", setup, runs=0, estimate=False, timeout=120)
    message = str(caught.value)
    assert "\n" not in message and "rank" in message


def test_timeout_kills_every_rank():
    setup = TrainingSetup.from_mapping({"batch_size": 4, "strategy": "ddp", "world_size": 2})
    with pytest.raises(MeasureError, match="within"):
        measure_distributed(MLP, setup, runs=0, estimate=False, timeout=0.5)


def test_refuses_one_process_and_unsupported_layouts():
    with pytest.raises(MeasureError, match="distributed"):
        measure_distributed(MLP, TrainingSetup(), estimate=False)
    with pytest.raises(MeasureError, match="strategy"):
        measure_distributed(MLP, TrainingSetup.from_mapping({"strategy": "tp", "world_size": 2}), estimate=False)


@pytest.mark.parametrize("run_steps,expected", [(None, 32), (8, 8)])
def test_rss_runs_are_as_long_as_the_run_the_estimate_stands_for(monkeypatch, run_steps, expected):
    """The estimate's peak RSS is the long run's (its heap replay, 32 steps unless --steps says): the RSS runs run
    that many steps, the profiled tensor run the traced two (until 2026-12-07 the RSS runs ran two as well)."""
    from trainmem.measure import gloo_ranks

    requests = []

    def fake_launch(request, world_size, timeout, where):
        requests.append(request)
        steps = request["setup"]["steps"]
        return [{"tensor_peak_bytes": 1, "peak_rss_bytes": 2 + rank, "steps": steps, "torch": "x", "threads": 1,
                 "cpu_capability": "x"} for rank in range(world_size)]

    monkeypatch.setattr(gloo_ranks, "launch", fake_launch)
    setup = TrainingSetup.from_mapping({"batch_size": 1, "optimizer": "adam", "strategy": "ddp", "world_size": 2,
                                        "input_shape": "256", "run_steps": run_steps})
    result = measure_distributed(MLP, setup, runs=2)
    assert [(r["mode"], r["setup"]["steps"]) for r in requests] == [("tensors", 2), ("rss", expected), ("rss", expected)]
    assert result.ranks[1].process_runs == (3, 3) and result.ranks[1].estimated_process_high >= \
        result.ranks[1].estimated_process_bytes
    assert f"each {expected} steps" in str(result) and "high end" in str(result)


def _meta(*shape: int) -> TensorMeta:
    return TensorMeta(tuple(shape), 4, "float32")


def test_gloo_rules_by_hand():
    """All-gather: one flat buffer as large as the output; reduce-scatter: a copy of the input; all-reduce and
    broadcast: nothing (benchmarks/results/gloo_temporaries.md)."""
    shard, full = _meta(1024), _meta(4096)
    gather = gloo_effects(KernelCall("_allgather_base_", 0, 0, (full, shard, None, False, -1), (), ()))
    assert [(e.before, e.after) for e in gather] == [((16384,), (-16384,))]
    scatter = gloo_effects(KernelCall("_reduce_scatter_base_", 0, 0, (shard, full, None, None, False, -1), (), ()))
    assert [(e.before, e.after) for e in scatter] == [((16384,), (-16384,))]
    gather_list = gloo_effects(KernelCall("allgather_", 0, 0, ([[shard] * 4], (shard,), None, False, -1), (), ()))
    assert [e.before for e in gather_list] == [(16384,)]
    assert gloo_effects(KernelCall("allreduce_", 0, 0, ((full,), None, None, None, False, -1), (), ())) == []
    assert gloo_effects(KernelCall("broadcast_", 0, 0, ((full,), None, 0, 0, False, -1), (), ())) == []
    assert gloo_effects(KernelCall("addmm", 0, 0, (full,), (), ())) == []
    assert {"_allgather_base_", "_reduce_scatter_base_", "allreduce_", "broadcast_"} <= GLOO_OPS


def test_c10_log_sees_an_allocation(tmp_path):
    import torch

    path = tmp_path / "c10.log"
    with c10_log.logging(path) as log:
        log.mark("loop_start")
        block = torch.empty(1000)
        del block
        log.mark("loop_end")
    figures = c10_log.peaks(c10_log.events(path))
    assert figures["tensor_peak_bytes"] >= 4032 and figures["loop_peak_bytes"] >= 4032  # 4,000 B rounded to 64


def test_settling_moves_a_workers_late_free_back():
    """A free the profiler missed (thread None) goes back to just after the worker's last event."""
    stream = [("alloc", 1000, 1000), ("alloc", 8, 1008), ("free", 8, 1000), ("alloc", 500, 1500),
              ("free", 1000, 500), ("free", 500, 0)]
    profiled = [(1, 1000, 1), (2, 8, 2), (3, -8, 2), (4, 500, 1), (6, -500, 1)]  # the -1000 free is missing
    moved, count = c10_log.settled(stream, profiled, main=1)
    assert count == 1
    assert [event[:2] for event in moved] == [("alloc", 1000), ("alloc", 8), ("free", 8), ("free", 1000),
                                              ("alloc", 500), ("free", 500)]
    assert c10_log.peaks(stream)["tensor_peak_bytes"] == 1024 + 512
    assert c10_log.peaks(moved)["tensor_peak_bytes"] == 1024 + 64


def test_settling_never_moves_a_free_back_across_a_mark():
    """A worker that drops a block after the loop ended (DDP's last bucket, held by its all-reduce's work at
    teardown) freed it after the loop: the block stays in the loop's peak, and the free still counts."""
    stream = [("mark:loop_start", 0, -1), ("alloc", 8, 8), ("free", 8, 0), ("alloc", 1000, 1000),
              ("mark:loop_end", 0, -1), ("free", 1000, 0)]
    profiled = [(1, 8, 2), (2, -8, 2), (3, 1000, 1)]  # the worker's -1000 free is missing
    kept, count = c10_log.settled(stream, profiled, main=1)
    assert count == 1
    assert kept == stream
    assert c10_log.peaks(kept)["loop_peak_bytes"] == 1024
