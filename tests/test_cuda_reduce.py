"""gpu_reduce_kernel's global-memory staging buffer (targets/cuda_reduce.py), checked by hand against
Reduce.cuh's setReduceConfig and against an H200's own allocator history of a plain PyTorch loop
(benchmarks/gpu_memory_history.py, which imports nothing of trainmem; its rows and pickles are in
benchmarks/data/memory_history/)."""

from __future__ import annotations

import json
from pathlib import Path

from trainmem import estimate
from trainmem.targets.cuda_reduce import GridFacts, reduce_buffer_bytes
from trainmem.trace.events import KernelCall, TensorMeta
from trainmem.setup.target_options import TargetOptions

HISTORY = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "memory_history" / "history.jsonl"
H200 = GridFacts.of("h200", (9, 0))


def _sum(shape, dims=None, dtype="float32", contiguous=True):
    meta = TensorMeta(tuple(shape), 4 if dtype == "float32" else 2, dtype, contiguous)
    return KernelCall("sum", 0, 1, (meta,) if dims is None else (meta, dims, False), (), ())


def test_bias_gradient_over_8192_rows_by_hand():
    # sum over dim 0 of [8192, 8192] fp32: outputs along the fastest dim, 4-wide vectors -> block 32 x 4 (128
    # threads); 4 warps split the 8192 inputs -> 2048 values a thread; grid.x = 2048 / 32 = 64 blocks;
    # target grid = 132 SMs x (2048 / 128) = 2112 -> ctas_per_output = max(min(33, 128), 8) = 33;
    # buffer 4 B x 8192 outputs x 33 x (32 x 4) = 138,412,032 B, semaphores 4 x 64 = 256 B (as measured)
    assert reduce_buffer_bytes(_sum((8192, 8192), [0]), H200) == 138_412_032 + 256
    # the 1000-wide last layer: grid.x = ceil(250 / 32) = 8 blocks; ctas = max(min(2112 / 8 = 264, 2048 / 16 = 128), 8)
    # = 128; 4 x 1000 x 128 x (32 x 4) = 65,536,000 B and 4 x 8 = 32 B, as measured
    assert reduce_buffer_bytes(_sum((8192, 1000), [0]), H200) == 65_536_000 + 32


def test_small_reductions_and_unknown_gpus():
    assert reduce_buffer_bytes(_sum((8, 1024), [0]), H200) == 0  # few values a thread: no split across blocks
    unknown = GridFacts(None, None)  # a custom: device: the largest split the rules allow
    assert reduce_buffer_bytes(_sum((8192, 8192), [0]), unknown) >= reduce_buffer_bytes(_sum((8192, 8192), [0]), H200)
    # a full reduction reduces along x inside a block: a buffer of one value per block only
    assert 0 < reduce_buffer_bytes(_sum((8192, 8192)), H200) < 1 << 16
    # not contiguous: the larger of the two launch shapes
    assert reduce_buffer_bytes(_sum((8192, 8192), [0], contiguous=False), H200) >= 138_412_288


def test_estimate_equals_the_h200_history():
    """The MLP of the measured history, its loop (targets made with the batch): allocated and requested peaks to
    the byte (before this rule the estimate was 132 MiB low)."""
    rows = {row["case"]: row for row in map(json.loads, HISTORY.read_text().splitlines())}
    measured = rows["mlp8192"]
    est = estimate("mlp:2048-8192-8192-8192-1000", device="h200", batch_size=8192, input_shape="2048",
                   optimizer="adam", loop="inline", target_shape="scalar",
                   target_options=TargetOptions(cuda_version=measured["cuda"]))
    assert est.allocated_bytes == measured["max_memory_allocated"]
    assert est.tensor_bytes == measured["requested_peak"]
    assert est.reserved_bytes >= measured["max_memory_reserved"]
    assert est.coverage["kernel_rules"]["sum/mean global-reduction buffers (Reduce.cuh)"] > 0
