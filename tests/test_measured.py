"""Estimate vs real runs on this machine (fresh processes). Tolerances from
benchmarks/results/accuracy_cpu.md: the tensor peak is within 0.03% on every row there, so 1% here.
Peak RSS is held to 5% only for model families whose benchmark rows all meet it with margin; on the
convolutional nets and checkpointed runs the estimate is known to be 5–27% low (the runtime's small
objects fragment glibc's heap, benchmarks/results/glibc_fidelity.md), which is reported, not tested away."""

import pytest

from conftest import zoo
from trainmem.measure.cpu import measure
from trainmem.setup import TrainingSetup

TENSOR_TOLERANCE = 0.01
RSS_TOLERANCE = 0.05

CASES = [  # (reference, setup, whether peak RSS is held to RSS_TOLERANCE)
    ("mlp:1000-100-100-100-100-10", {"input_shape": "1000", "batch_size": 256, "optimizer": "adam"}, True),
    (zoo("cnn_bn"), {"batch_size": 16, "optimizer": "adam"}, False),
    (zoo("resnet_small"), {"batch_size": 8, "optimizer": "momentum"}, False),
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "adamw"}, True),
    (zoo("gru"), {"batch_size": 8, "optimizer": "adam"}, True),
    (zoo("lstm"), {"batch_size": 8, "optimizer": "adam"}, True),
    (zoo("unet"), {"batch_size": 4, "optimizer": "adam"}, False),
    (zoo("frozen_backbone"), {"batch_size": 16, "optimizer": "adam"}, True),
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "sgd", "checkpointing": True}, False),
    # bf16-mixed is not in the accuracy benchmark; measured RSS here runs 4.6-5.3% above the estimate
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "adamw", "precision": "bf16-mixed"}, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("ref,values,check_rss", CASES,
                         ids=[f"{r.rsplit(':', 1)[-1]}-{v['optimizer']}-{v.get('precision', 'fp32')}"
                              + ("-ckpt" if v.get("checkpointing") else "") for r, v, _ in CASES])
def test_estimate_matches_measure(ref, values, check_rss):
    comparison = measure(ref, TrainingSetup.from_mapping(values))
    errors = comparison.to_dict()["error"]
    assert abs(errors["tensor_bytes"]) <= TENSOR_TOLERANCE, comparison
    if check_rss:
        assert abs(errors["process_bytes"]) <= RSS_TOLERANCE, comparison
