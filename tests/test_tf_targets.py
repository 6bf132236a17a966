"""Keras on TensorFlow behind the Target interface: the estimate goes through the one assembler with TfCpuTarget or
TfGpuTarget, keeps its allocator replay (so the timeline and the HTML report draw it like PyTorch's), and a PyTorch
reference never imports a Keras module."""

import json
import subprocess
import sys

import pytest

import trainmem
import trainmem.report.text
from trainmem.devices import get_device
from trainmem.setup import TrainingSetup
from trainmem.targets import target_for

SEED = "mlp:1000-100-100-100-100-10"


@pytest.fixture(scope="module")
def tensorflow():
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras")


def test_target_for_picks_the_framework_and_device():
    from trainmem.targets.cpu_target import CpuTarget
    from trainmem.targets.tf.target import TfCpuTarget, TfGpuTarget

    setup = TrainingSetup(batch_size=8)
    assert isinstance(target_for(get_device("cpu"), setup, "tensorflow", tf_onednn="off"), TfCpuTarget)
    gpu = target_for(get_device("a100-40gb"), setup, "tensorflow", tf_memory="growth")
    assert isinstance(gpu, TfGpuTarget) and gpu.memory_mode == "growth"
    assert isinstance(target_for(get_device("cpu"), setup), CpuTarget)


@pytest.mark.parametrize("device, options, flag", [
    ("cpu", {"tf_memory": "growth"}, "--tf-memory"),
    ("a100-40gb", {"tf_onednn": "on"}, "--tf-onednn"),
    ("a100-40gb", {"alloc_conf": "expandable_segments:True"}, "--alloc-conf"),
    ("a100-40gb", {"tf_memory": "lots"}, "--tf-memory"),
])
def test_each_tensorflow_target_refuses_options_it_cannot_use_before_tracing(device, options, flag):
    with pytest.raises(trainmem.TrainmemError) as refused:
        target_for(get_device(device), TrainingSetup(batch_size=8), "tensorflow", **options)
    assert refused.value.where == flag and "\n" not in str(refused.value)


@pytest.mark.tf
@pytest.mark.parametrize("device", ["cpu", "t4"])
def test_a_keras_estimate_keeps_its_replay_and_draws_a_timeline(tensorflow, device, tmp_path):
    est = trainmem.estimate(SEED, framework="keras", device=device, batch_size=256, input_shape="1000")
    assert est.framework is not None and est.to_dict()["framework"] == {"name": "keras", "keras_backend": "tensorflow"}
    assert est.replay_input is not None
    timeline = est.timeline(max_points=200)
    # the drawing replays the same stream through the same allocator: its highest point is the allocated peak
    assert max(timeline.allocated) == est.allocated_bytes
    est.write_html(str(tmp_path / "keras.html"))
    assert "trainmem" in (tmp_path / "keras.html").read_text()


@pytest.mark.tf
def test_a_keras_gpu_estimate_has_no_pytorch_memory_snapshot(tensorflow, tmp_path):
    est = trainmem.estimate(SEED, framework="keras", device="t4", batch_size=256, input_shape="1000")
    with pytest.raises(trainmem.TrainmemError, match="TensorFlow's BFC allocator"):
        est.write_memory_snapshot(str(tmp_path / "snapshot.pickle"))


def test_a_pytorch_reference_never_imports_a_keras_module():
    code = ("import sys, json, trainmem\n"
            "est = trainmem.estimate('mlp:8-4', batch_size=2, input_shape='8')\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('trainmem.frontends.keras', "
            "'trainmem.trace.tf', 'trainmem.targets.tf', 'keras', 'tensorflow')))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.tf
def test_a_keras_gpu_answer_leads_with_what_the_step_needs(tensorflow):
    """TensorFlow's default memory mode maps almost the whole card: the report says first what the step needs, and
    the one line that makes TensorFlow map only that (issue 25: the first hour)."""
    default = trainmem.estimate(SEED, framework="keras", device="t4", batch_size=256, input_shape="1000")
    text = str(default)
    lead = text.split("Peak memory (TensorFlow)")[0]
    assert "The step needs" in lead and "set_memory_growth" in lead
    figures = default.to_dict()["keras"]["tensorflow"]
    assert "TensorFlow's default maps the card" in trainmem.report.text.render_quiet(default)
    growth = trainmem.estimate(SEED, framework="keras", device="t4", batch_size=256, input_shape="1000",
                               target_options={"tf_memory": "growth"})
    assert "set_memory_growth" not in str(growth) and "The step needs" in str(growth)
    assert figures["nvidia_smi_by_mode"]["growth"] < figures["nvidia_smi_by_mode"]["default"]


@pytest.mark.tf
def test_the_dataset_model_fit_holds_is_part_of_peak_rss(tensorflow):
    """--dataset-size: model.fit's arrays (x and y of every sample) are held in RAM beside the step; the default is
    as many batches as are traced. 60,000 MNIST-sized samples add their bytes at least once (the measured factors
    hold them 1-2 times: targets/data/tf_cpu_floor.json)."""
    base = dict(framework="keras", batch_size=32, input_shape="784")
    small = trainmem.estimate("mlp:784-128-10", **base)
    large = trainmem.estimate("mlp:784-128-10", target_options={"dataset_size": 60_000}, **base)
    arrays = 60_000 * (784 * 4 + 8)  # float32 images, int64 labels
    assert large.process_bytes - small.process_bytes >= arrays
    assert "1875 steps × the batch" in " ".join(large.warnings)  # ceil(60,000 / 32) batches in the epoch


@pytest.mark.parametrize("device, size, says", [("cpu", 0, "from 1 to"), ("cpu", True, "from 1 to"),
                                                ("t4", 100, "--device cpu")])
def test_a_bad_dataset_size_is_refused_before_tracing(device, size, says):
    with pytest.raises(trainmem.TrainmemError, match=says) as refused:
        target_for(get_device(device), TrainingSetup(batch_size=8), "tensorflow", dataset_size=size)
    assert refused.value.where == "--dataset-size"


def test_a_pytorch_model_refuses_a_dataset_size():
    with pytest.raises(trainmem.TrainmemError, match="Keras model on TensorFlow"):
        trainmem.estimate("mlp:8-4", batch_size=2, input_shape="8", target_options={"dataset_size": 100})
