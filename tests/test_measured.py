"""Estimate vs real runs on this machine (fresh processes, trainmem's own loop: benchmarks/accuracy_cpu.py
holds the estimate to independently written loops). Tolerances from benchmarks/results/accuracy_cpu.md:
the tensor peak is within 0.03% on every row there, so 1% here. On every case, process_bytes_high is at
least the measured peak RSS (the median of the runs). Peak RSS is held to 5% only for model families whose
benchmark rows meet it on this CPU's family; where the runtime's small objects fall varies from run to run, by
family and by CPU (benchmarks/results/glibc_fidelity.md, accuracy_cpu.md on AMD, accuracy_cpu_intel_amx.md on
Intel AMX), and the misses are reported there, not tested away."""

import pytest

from conftest import zoo
from trainmem.measure.single_process import measure
from trainmem.setup import TrainingSetup

TENSOR_TOLERANCE = 0.01
RSS_TOLERANCE = 0.05
# frozen_backbone's rows met 5% on the first AMD EPYC (accuracy_cpu.md: +1.9% to +4.9%, both batches) but not on the
# Intel Xeon with AMX (accuracy_cpu_intel_amx.md: batch 64 +7.5%, its runs 404-434 MiB; this test's one run at batch 16
# measured +5.4% and +9.3% there) nor on an AMD EPYC Zen 5 (accuracy_cpu_amd_zen5.md: batch 64 +5.0%; this test's one
# run at batch 16 +5.4% on a loaded machine, +2.3% in the benchmark): the estimate sits high on those CPUs (issue 21's
# open gap), so its RSS is held to the high end only, never to 5%
SHORT_RUN = {"run_steps": 8}

CASES = [  # (reference, setup, whether peak RSS is held to RSS_TOLERANCE)
    ("mlp:1000-100-100-100-100-10", {"input_shape": "1000", "batch_size": 256, "optimizer": "adam"}, True),
    (zoo("cnn_bn"), {"batch_size": 16, "optimizer": "adam"}, False),
    (zoo("resnet_small"), {"batch_size": 8, "optimizer": "momentum"}, False),
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "adamw"}, True),
    # +5.1% to +5.3% high at batch 8 with the small-object table (the oneDNN GRU's cache entries)
    (zoo("gru"), {"batch_size": 8, "optimizer": "adam"}, False),
    (zoo("lstm"), {"batch_size": 8, "optimizer": "adam"}, True),
    (zoo("unet"), {"batch_size": 4, "optimizer": "adam"}, False),
    (zoo("frozen_backbone"), {"batch_size": 16, "optimizer": "adam"}, False),
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "sgd", "checkpointing": True}, False),
    # bf16-mixed is not in the accuracy benchmark; measured RSS here runs 4.6-5.3% above the estimate
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "adamw", "precision": "bf16-mixed"}, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("ref,values,check_rss", CASES,
                         ids=[f"{r.rsplit(':', 1)[-1]}-{v['optimizer']}-{v.get('precision', 'fp32')}"
                              + ("-ckpt" if v.get("checkpointing") else "") for r, v, _ in CASES])
def test_estimate_matches_measure(ref, values, check_rss):
    # a case whose RSS is not held to 5% runs SHORT_RUN steps, not the long run (32): its tensor peak is the traced
    # steps' either way, and the high end must cover the run it estimates, whatever its length (a third of the time)
    run = {} if check_rss else SHORT_RUN
    comparison = measure(ref, TrainingSetup.from_mapping({**values, **run}))
    errors = comparison.to_dict()["error"]
    assert abs(errors["tensor_bytes"]) <= TENSOR_TOLERANCE, comparison
    assert comparison.estimate.process_bytes_high >= comparison.measured_process_bytes, comparison
    if check_rss:
        assert abs(errors["process_bytes"]) <= RSS_TOLERANCE, comparison
