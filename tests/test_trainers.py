"""--trainer: each trainer's loop and forward wrapping (setup/trainers.py, trace/trainer_forward.py) against the
real library running the same model on the CPU (benchmarks/truth_loops.py --loop fabric|accelerate, a fresh
process that imports nothing of trainmem). The tolerance is test_loops.py's: the tensor engine's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import zoo
from trainmem import estimate
from trainmem.errors import SetupError
from trainmem.setup import TrainingSetup

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.01
TWO_STEPS = {"run_steps": 2}  # the truth is a tensor peak of two steps
TINY_GPT = (zoo("tiny_gpt"), {"batch_size": 4, "optimizer": "adamw", "target_shape": "128"})
CNN_BN = (zoo("cnn_bn"), {"batch_size": 16, "optimizer": "momentum", "target_shape": "scalar"})


def truth(reference: str, values: dict, loop: str, precision: str) -> int:
    command = [sys.executable, str(ROOT / "benchmarks" / "truth_loops.py"), reference, "--batch-size",
               str(values["batch_size"]), "--optimizer", values["optimizer"], "--loop", loop, "--precision", precision]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-2000:]
    return json.loads(lines[-1])["tensor_peak_bytes"]


def estimated(reference: str, values: dict, trainer: str, precision: str) -> int:
    setup = TrainingSetup.from_mapping({**values, "trainer": trainer, "precision": precision, **TWO_STEPS})
    return estimate(reference, setup=setup).tensor_bytes


CASES = [(TINY_GPT, "fabric"), (TINY_GPT, "accelerate"), (CNN_BN, "fabric")]


@pytest.mark.slow
@pytest.mark.parametrize("case,trainer", CASES, ids=[f"{c[0].rsplit(':', 1)[-1]}-{t}" for c, t in CASES])
def test_trainer_matches_the_real_library_under_bf16_mixed(case, trainer):
    reference, values = case
    measured = truth(reference, values, trainer, "bf16-mixed")
    est = estimated(reference, values, trainer, "bf16-mixed")
    assert abs(est - measured) / measured <= TOLERANCE, (trainer, est, measured)


@pytest.mark.heavy
def test_fabric_and_accelerate_hold_an_fp32_copy_of_a_low_precision_output():
    # tiny_gpt's logits, [4, 128, 1000] in bf16 under autocast: both trainers convert them to fp32 after the forward
    # (measured: 87,894,464 B with either library against 85,846,400 B for the plain autocast loop)
    reference, values = TINY_GPT
    plain = estimated(reference, values, "plain", "bf16-mixed")
    fabric = estimated(reference, values, "fabric", "bf16-mixed")
    assert estimated(reference, values, "accelerate", "bf16-mixed") == fabric
    assert fabric - plain == 4 * 128 * 1000 * 4  # the fp32 copy, alive with the bf16 one at the peak
    assert estimated(reference, values, "fabric", "fp32") == estimated(reference, values, "plain", "fp32")


def test_each_trainer_fills_in_its_loop_unless_given():
    loops = {trainer: str(TrainingSetup.from_mapping({"trainer": trainer}).loop)
             for trainer in ("plain", "lightning", "fabric", "accelerate", "hf")}
    assert loops == {"plain": "inline", "lightning": "lightning", "fabric": "inline", "accelerate": "inline",
                     "hf": "trainer"}
    assert str(TrainingSetup.from_mapping({"trainer": "lightning", "loop": "lean"}).loop) == "lean"
    setup = TrainingSetup.from_mapping({"trainer": "fabric"})
    assert setup.flag_for("loop") == "--trainer fabric (its loop inline)"
    assert setup.to_dict()["trainer"] == "fabric" and "trainer" not in TrainingSetup().to_dict()


def test_trainer_hf_is_the_hf_trainer_preset():
    by_trainer, by_flag = TrainingSetup.from_mapping({"trainer": "hf"}), TrainingSetup.from_mapping({"hf_trainer": True})
    assert by_trainer.hf_trainer and by_trainer.optimizer == by_flag.optimizer and by_trainer.loop == by_flag.loop
    assert by_trainer.max_grad_norm == by_flag.max_grad_norm == 1.0


@pytest.mark.parametrize("values,said", [
    ({"trainer": "keras"}, "expected plain|lightning|fabric|accelerate|hf, got 'keras'"),
    ({"trainer": "fabric", "hf_trainer": True}, "expected one trainer, got --trainer fabric and --hf-trainer"),
    ({"trainer": "hf", "hf_trainer": False}, "expected --trainer hf without --no-hf-trainer"),
    ({"trainer": 3}, "expected text, got 3"),
])
def test_bad_trainers_are_one_line(values, said):
    with pytest.raises(SetupError) as caught:
        TrainingSetup.from_mapping(values)
    assert said in str(caught.value) and caught.value.where == "--trainer"


@pytest.mark.parametrize("trainer", ["fabric", "hf"])
def test_keras_refuses_a_trainer_model_fit_is_its_own(trainer):
    from trainmem.trace import keras_torch_step
    from trainmem.trace.tf.fit_setup import check_supported

    setup = TrainingSetup.from_mapping({"trainer": trainer})
    for check in (check_supported, keras_torch_step.check_setup):
        with pytest.raises(SetupError) as caught:
            check(setup)
        assert "--trainer" in str(caught.value)
