"""Per-rank process figures of distributed estimates: torch.distributed's CPU runtime part, NCCL's communicator at
world size 1, and the CUDA 13 Hopper context, each by hand from the measured constants."""

from __future__ import annotations

import json
import statistics

import trainmem
from trainmem.devices import get_device
from trainmem.setup.layout import ParallelLayout
from trainmem.targets.cuda_runtime import context_fact, resolve_runtime
from trainmem.targets.distributed_runtime import DATA, PART, distributed_runtime_bytes
from trainmem.targets.nccl import ONE_RANK_COMM_BYTES, nccl_process_bytes

# copied by hand from targets/data/distributed_runtime_rss.json (benchmarks/distributed_runtime_rss.py --runs 3,
# torch 2.13.0+cpu): median rank VmHWM less the plain process's median, the larger of ws2/ws4 where both ran
DDP, FSDP, ZERO1, TP = 3_328_000, 6_981_632, 8_837_120, 7_458_816


def test_the_increments_are_the_medians_of_the_recorded_runs():
    for case in json.loads(DATA.read_text())["cases"]:
        expected = int(statistics.median(case["rank_hwm_bytes"])) - int(statistics.median(case["plain_hwm_bytes"]))
        assert case["increment_bytes"] == expected
        assert len(case["rank_hwm_bytes"]) == 3 * case["world_size"]  # 3 fresh runs of every rank


def test_cpu_runtime_part_per_strategy():
    def part(**layout) -> int:
        return distributed_runtime_bytes(ParallelLayout(**layout).resolve())[0]

    assert part(strategy="ddp", world_size=2) == part(strategy="ddp", world_size=64) == DDP
    assert part(strategy="fsdp", world_size=4) == FSDP
    assert part(strategy="zero2", world_size=2) == part(strategy="hsdp", world_size=4, dp_shard=2) == FSDP
    assert part(strategy="zero1", world_size=2) == ZERO1
    assert part(strategy="tp", world_size=2) == TP
    assert part(dp=2, tp=2) == FSDP + TP  # FSDP over dp (no data-parallel kind named) and DTensor TP
    assert part(strategy="pp", world_size=2) == ZERO1  # not measured: the largest measured increment
    text = distributed_runtime_bytes(ParallelLayout(strategy="pp", world_size=2).resolve())[1]
    assert "not measured" in text and PART in text


def test_nccl_counts_the_one_rank_communicator_of_a_data_parallel_user():
    assert ONE_RANK_COMM_BYTES == 585_105_408  # after_init - context, benchmarks/data/nccl_memory_h200.json
    h200 = get_device("h200")
    for strategy in ("ddp", "fsdp", "zero1"):
        nbytes, text = nccl_process_bytes(ParallelLayout(strategy=strategy, world_size=1), 0, h200)
        assert nbytes == ONE_RANK_COMM_BYTES and "one rank still initialises NCCL" in text
    assert nccl_process_bytes(ParallelLayout(), 0, h200)[0] == 0  # no strategy: no torch.distributed
    assert nccl_process_bytes(ParallelLayout(strategy="ddp", world_size=1), 0, get_device("cpu"))[0] == 0


def test_cuda13_context_by_architecture():
    cu130 = resolve_runtime("13.0", None, None)
    assert context_fact(cu130, (8, 9)).point == 426 * 2**20  # RTX 6000 Ada, unsloth-zoo PR #1053
    hopper = context_fact(cu130, (9, 0))  # H200, gpu_measurements.jsonl: 812 / 828 MiB beyond reserved
    assert (hopper.point, hopper.high) == (851_443_712, 868_220_928)
    assert context_fact(cu130) == hopper  # the GPU not named: the larger
    assert context_fact(resolve_runtime("12.8", None, None), (9, 0)).point == 256 * 2**20  # CUDA 12 unchanged


def test_cpu_estimate_carries_the_part_on_every_rank():
    single = trainmem.estimate("mlp:8-8-2", batch_size=1)
    est = trainmem.estimate("mlp:8-8-2", batch_size=1, strategy="ddp", world_size=2)
    assert est.process_parts[PART] == DDP
    assert all(row.process[PART] == DDP for row in est.ranks)
    assert est.process_bytes - DDP >= single.process_bytes - 64 * 1024  # DDP's bucket is a few hundred bytes
    assert any(PART in warning for warning in est.warnings)
