"""The command line with Keras models: estimate's JSON keys, compare, measure --framework keras, and one-line
errors with exit 2 for options that do not apply."""

import json
from pathlib import Path

import pytest

from trainmem.cli import main

pytestmark = pytest.mark.tf  # Keras or TensorFlow: left out of `make check`, run by `make test`

SEED = "mlp:1000-100-100-100-100-10"
SEED_ARGS = [SEED, "--batch-size", "256", "--optimizer", "adam"]
SEED_PARAMETERS = 131_410
DESIGN_KEYS = {"trainmem_version", "model", "setup", "device", "peak", "breakdown", "fits"}
PEAK_KEYS = {"tensor_bytes", "allocated_bytes", "reserved_bytes", "process_bytes", "phase", "module", "op"}
CATEGORIES = {"parameters", "buffers", "gradients", "optimizer_state", "activations", "temporaries", "inputs", "runtime"}


def run(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def tensorflow():
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras")


def _floor_committed() -> bool:
    from trainmem.targets.tf import cpu_process as tf_cpu

    return tf_cpu.DATA.exists()


def test_seed_mlp_on_a_gpu_json(tensorflow, capsys):
    code, out, err = run(["estimate", *SEED_ARGS, "--framework", "keras", "--device", "a100-40gb",
                          "--tf-memory", "growth", "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert set(data) >= DESIGN_KEYS | {"keras", "framework"} and set(data["peak"]) >= PEAK_KEYS
    assert set(data["breakdown"]) >= CATEGORIES and all(isinstance(v, int) for v in data["breakdown"].values())
    assert data["model"]["parameters"] == data["model"]["trainable_parameters"] == SEED_PARAMETERS
    assert data["framework"] == {"name": "keras", "keras_backend": "tensorflow"}
    # allocated = get_memory_info's peak = the BFC chunks in use, which the breakdown splits
    assert sum(data["breakdown"].values()) == data["peak"]["allocated_bytes"] == data["keras"]["tensorflow"]["peak_in_use"]
    assert data["peak"]["reserved_bytes"] == data["keras"]["tensorflow"]["region_bytes"]
    # Keras Adam: momentums and velocities per weight, iterations (int64) and the learning rate (float32)
    state = next(row for row in data["explanation"]["rows"] if row["what"] == "optimizer_state")
    assert state["traced_bytes"] == 2 * 4 * SEED_PARAMETERS + 8 + 4
    layers = data["keras"]["layers"]
    assert [row["parameters"] for row in layers if row["class_name"] == "Dense"] == [100_100, 10_100, 10_100,
                                                                                      10_100, 1_010]
    shown = data["keras"]["tensorflow"]["nvidia_smi_by_mode"]
    assert shown["default"] > shown["growth"] == data["peak"]["process_bytes"]


def test_seed_mlp_on_the_cpu_text(tensorflow, capsys):
    if not _floor_committed():
        pytest.skip("targets/data/tf_cpu_floor.json is not in this tree")
    code, out, err = run(["estimate", *SEED_ARGS, "--framework", "keras"], capsys)
    assert code == 0, err
    assert "131,410 parameters" in out and "Keras on TensorFlow" in out and "process (peak RSS)" in out
    assert "Layer (type)" in out and "dense_0 (Dense)" in out and "100,100" in out
    assert "What TensorFlow's numbers are" in out and "tf_import_file" in out


def test_compare_seed_mlp(tensorflow, capsys):
    if not _floor_committed():
        pytest.skip("targets/data/tf_cpu_floor.json is not in this tree")
    code, out, err = run(["compare", *SEED_ARGS, "--format", "json"], capsys)
    assert code == 0, err
    rows = {row["what"]: row for row in json.loads(out)["rows"]}
    assert rows["parameters"]["torch"] == rows["parameters"]["keras"] == SEED_PARAMETERS
    assert rows["optimizer slots"]["torch"] == 2 * 4 * SEED_PARAMETERS  # torch Adam's exp_avg and exp_avg_sq
    assert rows["optimizer slots"]["difference"] == 12  # Keras's iterations and learning-rate variables
    assert all(row["why"] for row in rows.values())
    code, text, _ = run(["compare", *SEED_ARGS], capsys)
    assert code == 0 and "Why they differ" in text and "Keras − PyTorch" in text


def test_compare_on_a_gpu_explains_the_floor(tensorflow, capsys):
    code, out, err = run(["compare", *SEED_ARGS, "--device", "h100-80gb"], capsys)
    assert code == 0, err
    assert "maps almost the whole card" in out and "131,410" in out


@pytest.mark.parametrize("argv, where, words", [
    (["estimate", SEED, "--framework", "tf"], "--framework", "expected auto|torch|keras, got 'tf'"),
    (["estimate", SEED, "--keras-backend", "jax"], "--keras-backend", "expected tensorflow|torch, got 'jax'"),
    (["estimate", SEED, "--framework", "torch", "--keras-backend", "torch"], "--keras-backend", "a Keras model"),
    (["estimate", SEED, "--tf-memory", "growth", "--framework", "keras"], "--tf-memory", "a GPU --device"),
    (["estimate", SEED, "--tf-memory", "growth", "--device", "a100-40gb"], "--tf-memory", "a Keras model on TensorFlow"),
    (["estimate", SEED, "--tf-memory", "lots", "--device", "a100-40gb", "--framework", "keras"], "--tf-memory",
     "expected a TensorFlow GPU memory mode"),
    (["estimate", SEED, "--tf-onednn", "maybe", "--framework", "keras"], "--tf-onednn", "expected auto|on|off"),
    (["estimate", SEED, "--tf-onednn", "on", "--framework", "keras", "--device", "a100-40gb"], "--tf-onednn",
     "--device cpu"),
    (["estimate", SEED, "--tf-onednn", "on"], "--tf-onednn", "a Keras model on TensorFlow"),
    (["estimate", "hf:gpt2", "--framework", "keras"], "--framework", "a Keras model reference"),
    (["compare", SEED, "--framework", "keras"], "--framework", "no --framework with compare"),
    (["compare", "hf:gpt2"], "MODEL", "expected mlp:… or a layer spec"),
    (["fit", "model.keras", "--device", "a100-40gb"], "MODEL", "expected a PyTorch model for fit"),
    (["fit", SEED, "--device", "a100-40gb", "--framework", "keras"], "--framework", "--framework torch with fit"),
])
def test_bad_keras_options_are_one_line_exit_2(argv, where, words, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and line.startswith(f"trainmem: error: {where}: ") and words in line


def test_framework_from_a_setup_file(tensorflow, tmp_path, capsys):
    setup = tmp_path / "run.toml"
    setup.write_text('framework = "keras"\ndevice = "a100-40gb"\ntf_memory = "limit:4GiB"\nbatch_size = 8\n')
    code, out, err = run(["estimate", "mlp:20-10-2", "--setup", str(setup), "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["framework"]["name"] == "keras" and data["keras"]["tensorflow"]["memory_limit"] == 4 << 30
    setup.write_text('framework = "jax"\n')
    code, _, err = run(["estimate", "mlp:20-10-2", "--setup", str(setup)], capsys)
    assert code == 2 and f"{setup}: framework: expected auto|torch|keras" in err


def test_help_names_the_keras_options(capsys):
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    out = capsys.readouterr().out
    assert "--framework" in out and "--keras-backend" in out and "--tf-memory" in out and "model.keras" in out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "compare" in capsys.readouterr().out


def test_measure_framework_keras_on_a_tiny_model(tensorflow, tmp_path, capsys):
    if not _floor_committed():
        pytest.skip("targets/data/tf_cpu_floor.json is not in this tree")
    factory = tmp_path / "tiny.py"
    factory.write_text("import keras\n\ndef model():\n    return keras.Sequential([keras.Input((32,)), "
                       "keras.layers.Dense(16, activation='relu'), keras.layers.Dense(4)])\n")
    code, out, err = run(["measure", f"{factory}:model", "--framework", "keras", "--batch-size", "8",
                          "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["framework"] == "keras" and data["measured"]["peak_rss_bytes"] > 0
    assert data["estimate"]["process_bytes"] > 0 and isinstance(data["error"], float)
    assert Path(data["measured"]["model"].rpartition(":")[0]).name == "tiny.py"


def test_measure_framework_keras_on_an_mlp_reference(tensorflow, capsys):
    """mlp: is measured through a factory file of Keras alone (the measured process imports no trainmem)."""
    if not _floor_committed():
        pytest.skip("targets/data/tf_cpu_floor.json is not in this tree")
    code, out, err = run(["measure", "mlp:32-16-4", "--framework", "keras", "--batch-size", "8", "--format", "json"],
                         capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["model"] == "mlp:32-16-4" and data["measured"]["model"] == "mlp:32-16-4"
    assert data["measured"]["peak_rss_bytes"] > 0


def test_factories_written_for_measure(tensorflow, tmp_path):
    from trainmem.errors import MeasureError
    from trainmem.estimate.keras_measured import factory_to_measure
    from trainmem.setup import TrainingSetup

    setup = TrainingSetup(dropout=0.1)
    ref = factory_to_measure("mlp:8-4-2", setup, tmp_path)
    text = Path(ref.rpartition(":")[0]).read_text()
    assert "trainmem" not in text and "'rate': 0.1" in text and "'units': 4, 'activation': 'relu'" in text
    namespace = {}
    exec(compile(text, "measured_model.py", "exec"), namespace)  # noqa: S102 - the file written just above
    assert namespace["model"]().count_params() == 8 * 4 + 4 + 4 * 2 + 2
    with pytest.raises(MeasureError, match="expected file.py:factory, mlp:… or model.keras"):
        factory_to_measure("net.yaml", setup, tmp_path)


def test_torch_backend_after_keras_took_tensorflow_is_one_line(tensorflow, capsys):
    """Keras fixes its backend at its first import: in a process where it took TensorFlow, asking for torch is
    refused in one line, never answered on the wrong backend."""
    from trainmem.frontends.keras.imports import import_keras

    import_keras("tensorflow")
    code, out, err = run(["estimate", "mlp:8-4", "--framework", "keras", "--keras-backend", "torch"], capsys)
    assert code == 2 and out == "" and "on the tensorflow backend" in err and len(err.strip().splitlines()) == 1


def test_measure_under_auto_reads_a_factory_files_imports(tmp_path):
    """measure under --framework auto tells a Keras factory file from a torch one by its import lines, without
    running it (the measured child runs it)."""
    from trainmem.cli import Options
    from trainmem.cli.commands.measure import keras_factory_file as _keras_factory_file

    cases = {"import keras\n": True, "from tensorflow import keras\n": True, "import torch\nimport keras\n": False,
             "import torch\n": False, "x = 'import keras'\n": False}
    for index, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"m{index}.py"
        path.write_text(text)
        options = Options({"framework": "auto", "model": f"{path}:model"}, {}, {})
        assert _keras_factory_file(options) is expected, text
    assert not _keras_factory_file(Options({"framework": "torch", "model": f"{tmp_path / 'm0.py'}:model"}, {}, {}))


def test_measure_keras_on_a_gpu_device_is_one_line(capsys):
    code, out, err = run(["measure", "model.keras", "--device", "a100-40gb"], capsys)
    assert code == 2 and "expected --device cpu with a Keras model" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("mode, on", [("on", True), ("off", False)])
def test_tf_onednn_picks_the_cpu_path_and_says_so(tensorflow, capsys, mode, on):
    if not _floor_committed():
        pytest.skip("targets/data/tf_cpu_floor.json is not in this tree")
    code, out, err = run(["estimate", "mlp:200-100-10", "--framework", "keras", "--batch-size", "64",
                          "--tf-onednn", mode, "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["keras"]["tensorflow"]["onednn"] is on
    said = f"oneDNN {mode} (--tf-onednn {mode}"
    assert any(w.startswith(said) for w in data["warnings"])
    assert any(f"allocator path: oneDNN {mode}" in w for w in data["keras"]["explanation"])


def test_tf_onednn_auto_follows_the_environment(tensorflow, capsys, monkeypatch):
    if not _floor_committed():
        pytest.skip("targets/data/tf_cpu_floor.json is not in this tree")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    code, out, err = run(["estimate", "mlp:200-100-10", "--framework", "keras", "--batch-size", "64"], capsys)
    assert code == 0, err
    assert "oneDNN off (TF_ENABLE_ONEDNN_OPTS=0 in this environment)" in out
