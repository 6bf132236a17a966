"""Each --loop against the same loop written as plain PyTorch in benchmarks/truth_loops.py (a fresh
process that imports nothing of trainmem): the profiler's tensor peak of the real loop vs the estimate.
The tolerance is the tensor engine's (benchmarks/results/accuracy_cpu.md: every row within 0.03%)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import zoo
from trainmem import estimate
from trainmem.setup import TrainingSetup

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.01

MODELS = [  # (reference, setup values; targets are made with the batch, as a loader yields them)
    ("mlp:1000-100-100-100-100-10", {"input_shape": "1000", "batch_size": 256, "optimizer": "adam",
                                     "target_shape": "scalar"}),
    (zoo("cnn_bn"), {"batch_size": 16, "optimizer": "momentum", "target_shape": "scalar"}),
    (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "adamw", "target_shape": "128"}),
    (zoo("unet"), {"batch_size": 2, "optimizer": "adam", "target_shape": "96,96"}),
]
LOOPS = ["inline", "step-fn", "trainer", "lean", "lightning", "lightning-iterable"]


def truth(reference: str, values: dict, loop: str) -> int:
    command = [sys.executable, str(ROOT / "benchmarks" / "truth_loops.py"), reference,
               "--batch-size", str(values["batch_size"]), "--optimizer", values["optimizer"], "--loop", loop,
               "--grad-accum", str(values.get("grad_accum", 1))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-2000:]
    return json.loads(lines[-1])["tensor_peak_bytes"]


# the truth is a tensor peak: the estimate's two traced steps, without the long run's glibc heap replay
TWO_STEPS = {"run_steps": 2}
# the look-ahead batch of lightning-iterable shows at the MLP's optimizer peak and at the U-Net's step-1 peak; the
# other two models (within 0.003% when measured, docs/accuracy.md) are left to lightning, to keep the suite short
CASES = [(reference, values, loop) for reference, values in MODELS for loop in LOOPS
         if loop != "lightning-iterable" or reference.rsplit(":", 1)[-1] in ("1000-100-100-100-100-10", "unet")]


@pytest.mark.slow
@pytest.mark.parametrize("reference,values,loop", CASES,
                         ids=[f"{r.rsplit(':', 1)[-1]}-{loop}" for r, _, loop in CASES])
def test_loop_matches_a_real_loop(reference, values, loop):
    measured = truth(reference, values, loop)
    est = estimate(reference, setup=TrainingSetup.from_mapping({**values, "loop": loop, **TWO_STEPS}))
    assert abs(est.tensor_bytes - measured) / measured <= TOLERANCE, (loop, est.tensor_bytes, measured)


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["inline", "trainer", "lightning", "lightning-iterable"])
def test_accumulating_loops(loop):
    reference, values = MODELS[1][0], {**MODELS[1][1], "grad_accum": 2}
    measured = truth(reference, values, loop)
    est = estimate(reference, setup=TrainingSetup.from_mapping({**values, "loop": loop, **TWO_STEPS}))
    assert abs(est.tensor_bytes - measured) / measured <= TOLERANCE, (loop, est.tensor_bytes, measured)


def test_default_loop_is_inline():
    assert str(TrainingSetup().loop) == "inline"
    assert str(TrainingSetup.from_mapping({"hf_trainer": True}).loop) == "trainer"
