"""Keras 3 on the torch backend (frontends/keras/torch_backend.py, trace/keras_torch_step.py): the torch engine traces
Keras's own train_step and optimizer. Keras fixes its backend at its first import, and this test process may
hold Keras on TensorFlow already, so every check runs in a fresh process with KERAS_BACKEND=torch. Both
the trace and the measured fit run with Python's cyclic collector paused (keras_torch_step.run_steps,
measure/child.py _fit_keras): Keras's tree utilities leave batches in reference cycles."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf  # Keras or TensorFlow: left out of `make check`, run by `make test`

pytest.importorskip("keras")

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "benchmarks" / "keras_torch_check.py"  # the factories: mlp, cnn_bn, lstm

ESTIMATES = """
import json, resource, sys
from trainmem.frontends.keras.imports import import_keras
import_keras("torch")
from trainmem.devices import get_device
from trainmem.estimate.orchestrate import Prepared, assemble_traced, trace
from trainmem.frontends.keras.torch_backend import resolve_keras_torch
from trainmem.setup import TrainingSetup
from trainmem.targets import target_for
from trainmem.trace.events import Category

def run(ref, batch):
    setup = TrainingSetup(batch_size=batch)
    device = get_device("cpu")
    plan = Prepared(resolve_keras_torch(ref, setup), device, 2, {}, target_for(device, setup))
    traced = trace(plan, setup)
    by = {}
    for record in traced.trace.storages.values():
        by[str(record.category)] = by.get(str(record.category), 0) + record.nbytes
    est = assemble_traced(plan, setup, traced)
    return {"tensor_bytes": est.tensor_bytes, "parameters": traced.parameters, "warnings": list(est.warnings),
            "trainable": traced.trainable_parameters, "by": by,
            "layers": sorted({r.module for r in traced.trace.storages.values() if r.category == Category.ACTIVATIONS})}

def huge():
    import keras
    return keras.Sequential([keras.Input((16000,)), keras.layers.Dense(16000)])

out = {name: run(f"{sys.argv[1]}:{name}", batch) for name, batch in json.loads(sys.argv[2])}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
out["huge"] = run(huge, 1)
out["mlp_ref"] = run("mlp:1000-100-100-100-100-10", 256)
out["huge"]["rss_growth"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
print(json.dumps(out))
"""

ROWS = [("mlp", 8192), ("cnn_bn", 16)]  # peaks in the training step: 68 MB, 40 MB


def _env() -> dict[str, str]:
    return {**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}


def _last_json(done: subprocess.CompletedProcess) -> dict:
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-3000:]
    result = json.loads(lines[-1])
    assert "error" not in result, result["error"]
    return result


@pytest.fixture(scope="module")
def estimates() -> dict:
    done = subprocess.run([sys.executable, "-c", ESTIMATES, str(MODELS), json.dumps(ROWS)], capture_output=True,
                          text=True, env=_env(), timeout=600)
    return _last_json(done)


def _measured(name: str, batch: int) -> int:
    request = {"model": f"{MODELS}:{name}", "setup": {"batch_size": batch}, "mode": "tensors", "seed": 0,
               "keras_backend": "torch"}
    done = subprocess.run([sys.executable, "-m", "trainmem.measure.child", json.dumps(request)],
                          capture_output=True, text=True, env=_env(), timeout=600)
    return int(_last_json(done)["tensor_peak_bytes"])


def test_parameters_as_keras_counts_them(estimates):
    assert estimates["mlp"]["parameters"] == 131_410  # count_params() of the seed MLP 1000-100×4-10
    # cnn_bn: convs 896 + 18,496 + 36,928, BatchNorm 4 per channel (2 trainable) × 160, Dense 650
    assert estimates["cnn_bn"]["parameters"] == 896 + 18_496 + 36_928 + 4 * 160 + 650
    assert estimates["cnn_bn"]["trainable"] == 896 + 18_496 + 36_928 + 2 * 160 + 650


def test_references_keras_builds_and_what_the_estimate_says(estimates):
    assert estimates["mlp_ref"]["parameters"] == 131_410  # mlp: built as a Keras model (frontends/keras/reference.py)
    warnings = " ".join(estimates["mlp"]["warnings"])
    assert "TorchTrainer.train_step" in warnings and "reference cycle" in warnings
    # activations are attributed to the Keras layers that made them, by layer path
    layers = estimates["mlp"]["layers"]
    assert sum(bool(re.fullmatch(r"sequential(_\d+)?/dense(_\d+)?", name)) for name in layers) == 5, layers


def test_adam_state_is_two_slots_per_weight_and_keras_scalars(estimates):
    for name in ("mlp", "cnn_bn"):
        by = estimates[name]["by"]
        # keras/src/optimizers/adam.py build: a momentum and a velocity per trainable weight, float32
        assert by["optimizer_state"] == 2 * 4 * estimates[name]["trainable"]
        # keras/src/optimizers/base_optimizer.py __init__: iterations (dtype "int": int32 on this backend)
        # and learning_rate (floatx: float32), 4 B each
        assert by["optimizer_scalars"] == 4 + 4
        assert by["parameters"] == 4 * estimates[name]["trainable"]


def test_a_large_model_is_estimated_without_its_weights(estimates):
    huge = estimates["huge"]
    assert huge["parameters"] == 16000 * 16000 + 16000  # 1 GB of float32 weights
    assert huge["tensor_bytes"] > 4 * 4 * huge["parameters"]  # weights, gradients, two Adam slots
    assert huge["rss_growth"] < 200 << 20  # built on meta, traced on fake tensors


@pytest.mark.parametrize("name,batch", ROWS)
def test_tensor_peak_within_one_percent_of_model_fit(estimates, name, batch):
    measured = _measured(name, batch)
    estimated = estimates[name]["tensor_bytes"]
    assert measured > 10 << 20
    assert abs(estimated - measured) <= 0.01 * measured, (estimated, measured)
