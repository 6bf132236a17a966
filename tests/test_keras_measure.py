"""measure/keras_cpu.py: one small real model.fit in a fresh process, and the request's checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmem.errors import ModelRefError
from trainmem.measure.keras_cpu import KerasMeasurement, child_request, measure_keras
from trainmem.setup import TrainingSetup

pytestmark = pytest.mark.tf  # Keras or TensorFlow: left out of `make check`, run by `make test`

MODELS = Path(__file__).resolve().parents[1] / "benchmarks" / "keras_models.py"


def test_request_is_plain_values():
    request = child_request(f"{MODELS}:mlp", TrainingSetup(batch_size=8, steps=3))
    assert request == {"model": f"{MODELS}:mlp", "batch_size": 8, "steps": 3, "optimizer": "adam", "loss": None,
                       "input_max": None, "seed": 0}


@pytest.mark.parametrize("ref", ["mlp:1000-10", "model.keras", f"{MODELS}:not-a-name", "missing.py:f"])
def test_request_refuses_what_is_not_a_factory(ref):
    with pytest.raises(ModelRefError):
        child_request(ref, TrainingSetup())


def test_medians_and_spread():
    runs = tuple({"peak_rss_bytes": peak, "environment": {}} for peak in (300, 100, 200))
    measured = KerasMeasurement("m.py:f", 4, 2, runs)
    assert measured.peak_rss_bytes == 200
    assert measured.spread == (100, 300)


def test_one_real_fit():
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras")
    measured = measure_keras(f"{MODELS}:dense_stack_0", TrainingSetup(batch_size=4, steps=2), runs=1)
    run = measured.runs[0]
    stages = run["stages"]
    # import tensorflow maps hundreds of MB of libraries; fit can only add to the high-water mark
    assert stages["import_tensorflow"]["RssFile"] > stages["start"]["RssFile"] + 100 * 2**20
    assert measured.peak_rss_bytes >= stages["compile"]["VmRSS"] >= stages["import_keras"]["VmRSS"]
    assert run["fit_samples"]["max_rss"] <= measured.peak_rss_bytes
    assert run["parameters"] == 8 * 2 + 2
    env = measured.environment
    assert env["tensorflow"] and env["keras"].startswith("3.") and env["nproc"] >= 1
    assert measured.gpu_peak_bytes is None or measured.gpu_peak_bytes > 0
