"""Estimate vs real runs on this machine (fresh processes). Tolerances from
benchmarks/results/accuracy_cpu.md: tensor peak 1% on rows the CPU target models fully; RSS 5%."""

import pytest

from conftest import zoo
from trainmem.measure.cpu import measure
from trainmem.setup import TrainingSetup

TENSOR_TOLERANCE = 0.01
RSS_TOLERANCE = 0.05

CASES = [
    ("mlp:1000-100-100-100-100-10", {"input_shape": "1000", "batch_size": 256, "optimizer": "adam"}),
    (zoo("cnn_bn"), {"batch_size": 16, "optimizer": "adam"}),
    (zoo("resnet_small"), {"batch_size": 8, "optimizer": "momentum"}),
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "adamw"}),
    (zoo("gru"), {"batch_size": 8, "optimizer": "adam"}),
    (zoo("lstm"), {"batch_size": 8, "optimizer": "adam"}),
    (zoo("unet"), {"batch_size": 4, "optimizer": "adam"}),
    (zoo("frozen_backbone"), {"batch_size": 16, "optimizer": "adam"}),
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "sgd", "checkpointing": True}),
]


@pytest.mark.slow
@pytest.mark.parametrize("ref,values", CASES, ids=[f"{r.rsplit(':', 1)[-1]}-{v['optimizer']}" for r, v in CASES])
def test_estimate_matches_measure(ref, values):
    comparison = measure(ref, TrainingSetup.from_mapping(values))
    errors = comparison.to_dict()["error"]
    assert abs(errors["tensor_bytes"]) <= TENSOR_TOLERANCE, comparison
    assert abs(errors["process_bytes"]) <= RSS_TOLERANCE, comparison
