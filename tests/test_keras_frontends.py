"""Keras references in (frontends/keras/reference.py and its readers): each kind of reference, which framework a
reference is, safe_mode, and hostile files refused in bounded time before TensorFlow parses anything."""

import json
import time
import zipfile

import pytest

from trainmem.errors import ModelRefError
from trainmem.frontends import Kind, ModelSource, reference_kind
from trainmem.frontends.keras.keras_file import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, MAX_CONFIG_OBJECTS
from trainmem.frontends.framework import is_keras_reference, resolve_model
from trainmem.frontends.keras.reference import KerasSource
from trainmem.frontends.keras.saved_model import MAX_PB_BYTES
from trainmem.setup import TrainingSetup

pytestmark = pytest.mark.tf  # Keras or TensorFlow: left out of `make check`, run by `make test`

SEED = "mlp:1000-100-100-100-100-10"
SEED_PARAMETERS = 131_410  # 1000·100+100 + 3·(100·100+100) + 100·10+10
SETUP = TrainingSetup(batch_size=4)


def _keras():
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras")
    from trainmem.frontends.keras.imports import import_keras

    keras = import_keras()
    if keras.backend.backend() != "tensorflow":
        pytest.skip("Keras was imported on another backend in this process")
    return keras


def _in_graph(source: KerasSource):
    import tensorflow as tf

    with tf.Graph().as_default() as graph:
        model = source.build()
        return model.count_params(), graph


def _keras_zip(path, config) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", config if isinstance(config, (str, bytes)) else json.dumps(config))
        archive.writestr("metadata.json", "{}")
    return str(path)


# ---- framework detection: text and a stat, nothing run ------------------------------------------------


def test_reference_kinds_and_framework_detection(tmp_path):
    saved = tmp_path / "exported"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"")
    assert reference_kind("model.keras") == Kind.KERAS and reference_kind(str(saved)) == Kind.SAVED_MODEL
    assert reference_kind(str(saved / "saved_model.pb")) == Kind.SAVED_MODEL
    assert is_keras_reference("model.keras") and is_keras_reference(str(saved))
    assert not is_keras_reference(SEED) and not is_keras_reference("net.yaml")  # torch unless --framework keras
    assert is_keras_reference(SEED, "keras") and not is_keras_reference("model.keras", "torch")


def test_torch_references_stay_torch_under_auto():
    source = resolve_model(SEED, SETUP)
    assert isinstance(source, ModelSource) and source.name == SEED


def test_a_keras_file_with_framework_torch_is_one_line():
    with pytest.raises(ModelRefError, match="expected a PyTorch model with --framework torch, got a Keras model"):
        resolve_model("model.keras", SETUP, "torch")


# ---- mlp: and layer specs as Keras models ------------------------------------------------------------


def test_seed_mlp_as_keras_has_torch_parameter_count():
    _keras()
    source = resolve_model(SEED, SETUP, "keras")
    assert isinstance(source, KerasSource) and source.kind == "mlp"
    count, graph = _in_graph(source)
    assert count == SEED_PARAMETERS
    # built in a graph: the variables' initializers are ops that never ran, no eager tensor holds a weight
    assert any(op.type == "VarHandleOp" for op in graph.get_operations())


def test_seed_spec_as_keras(tmp_path):
    _keras()
    spec = tmp_path / "seed.yaml"
    spec.write_text("input: [1000]\nlayers:\n" + "".join("  - linear: {out_features: 100}\n  - relu\n" for _ in range(4))
                    + "  - linear: {out_features: 10}\n")
    source = resolve_model(str(spec), SETUP, "keras")
    assert source.kind == "spec" and _in_graph(source)[0] == SEED_PARAMETERS


def test_channels_first_spec_becomes_channels_last(tmp_path):
    _keras()
    spec = tmp_path / "cnn.json"
    spec.write_text(json.dumps({"input": [3, 8, 8], "layers": [{"conv2d": {"out_channels": 4, "kernel_size": 3,
                                                                           "padding": 1}}, "relu", "flatten",
                                                               {"linear": {"out_features": 2}}]}))
    source = resolve_model(str(spec), SETUP, "keras")
    assert source.default_inputs[0].shape == (8, 8, 3) and "channels-first" in source.notes[0]
    assert _in_graph(source)[0] == (3 * 9 * 4 + 4) + (8 * 8 * 4 * 2 + 2)  # as torch's Conv2d and Linear


def test_spec_layer_without_keras_counterpart_is_one_line(tmp_path):
    _keras()
    spec = tmp_path / "t.json"
    spec.write_text(json.dumps({"input": [3, 8, 8], "layers": [{"convtranspose2d": {"out_channels": 4,
                                                                                    "kernel_size": 2}}]}))
    source = resolve_model(str(spec), SETUP, "keras")
    with pytest.raises(ModelRefError, match="expected layers with a Keras counterpart"):
        _in_graph(source)


# ---- model.keras: config.json only, safe_mode ----------------------------------------------------------


def test_keras_file_rebuilt_from_config_alone(tmp_path):
    keras = _keras()
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(7), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    path = tmp_path / "small.keras"
    model.save(path)
    source = resolve_model(str(path), SETUP)
    assert isinstance(source, KerasSource) and source.kind == "keras-file" and source.name == "small"
    assert _in_graph(source)[0] == 20 * 7 + 7 + 7 * 3 + 3
    assert "compiled with optimizer SGD" in source.notes[0]


def test_lambda_with_bytecode_is_refused(tmp_path):
    keras = _keras()
    marker = tmp_path / "ran"
    touch = eval(f"lambda x: __import__('pathlib').Path({str(marker)!r}).touch() or x")  # no closure: serializable
    model = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(touch)])
    path = tmp_path / "lambda.keras"
    model.save(path)
    marker.unlink(missing_ok=True)  # tracing the lambda at save time may have created it
    source = resolve_model(str(path), SETUP)
    with pytest.raises(ModelRefError, match="a Lambda layer holds Python bytecode, which trainmem never runs"):
        _in_graph(source)
    assert not marker.exists()


def test_unknown_custom_layer_is_one_line(tmp_path):
    _keras()
    config = {"module": "keras", "class_name": "Sequential", "config": {"name": "s", "layers": [
        {"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [None, 4]}},
        {"module": "my_private_package", "class_name": "FancyLayer", "config": {}, "registered_name": "Custom>Fancy"}]}}
    source = resolve_model(_keras_zip(tmp_path / "custom.keras", config), SETUP)
    with pytest.raises(ModelRefError, match="unknown 'FancyLayer'") as info:
        _in_graph(source)
    assert "\n" not in str(info.value)


# ---- SavedModel directories ------------------------------------------------------------------------------


def test_saved_model_traced_through_its_signature(tmp_path):
    keras = _keras()
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(5), keras.layers.Dense(2)])
    model.export(str(tmp_path / "exported"), verbose=False)
    source = resolve_model(str(tmp_path / "exported"), SETUP)
    assert isinstance(source, KerasSource) and source.kind == "saved-model"
    assert source.default_inputs[0].shape == (12,)
    assert _in_graph(source)[0] == 12 * 5 + 5 + 5 * 2 + 2


# ---- factories ---------------------------------------------------------------------------------------------


def test_factory_importing_keras_is_keras_and_torch_stays_torch(tmp_path):
    _keras()
    keras_file = tmp_path / "kmodel.py"
    keras_file.write_text("import keras\n\ndef model():\n    return keras.Sequential([keras.Input((6,)), "
                          "keras.layers.Dense(3)])\n")
    source = resolve_model(f"{keras_file}:model", SETUP)
    assert isinstance(source, KerasSource) and source.kind == "factory" and _in_graph(source)[0] == 21
    torch_file = tmp_path / "tmodel.py"
    torch_file.write_text("import torch\n\ndef model():\n    return torch.nn.Linear(6, 3)\n")
    assert isinstance(resolve_model(f"{torch_file}:model", SETUP), ModelSource)


def test_factory_returning_keras_on_the_torch_path_says_framework_keras(tmp_path):
    _keras()
    path = tmp_path / "hidden.py"
    path.write_text("def model():\n    import keras\n    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])\n")
    source = resolve_model(f"{path}:model", SETUP)  # no keras import at module level: taken as torch
    with pytest.raises(ModelRefError, match="estimate it with --framework keras"):
        source.build()
    forced = resolve_model(f"{path}:model", SETUP, "keras")
    assert isinstance(forced, KerasSource) and _in_graph(forced)[0] == 21


def test_factory_returning_something_else_is_one_line(tmp_path):
    _keras()
    path = tmp_path / "bad.py"
    path.write_text("import keras\n\ndef model():\n    return 42\n")
    with pytest.raises(ModelRefError, match="expected the factory to return a keras.Model, got int"):
        _in_graph(resolve_model(f"{path}:model", SETUP))


# ---- hostile files: refused before Keras or TensorFlow parses them, in bounded time ---------------------


def _refused(ref: str, match: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ModelRefError, match=match):
        resolve_model(ref, SETUP)
    assert time.perf_counter() - started < 10


def test_hostile_keras_files(tmp_path):
    bomb = tmp_path / "bomb.keras"  # 17 MiB of zeros compress to ~17 KB: refused by its declared size
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("config.json", b" " * (MAX_CONFIG_BYTES + 1))
    assert bomb.stat().st_size < 1 << 20
    _refused(str(bomb), "config.json of at most")
    _refused(_keras_zip(tmp_path / "deep.keras", "[" * 100_000 + "]" * 100_000), "nested at most|class_name")
    deep = {"class_name": "X", "config": {}}
    for _ in range(MAX_CONFIG_DEPTH + 1):
        deep = {"class_name": "X", "config": {"inner": deep}}
    _refused(_keras_zip(tmp_path / "deep2.keras", deep), f"nested at most {MAX_CONFIG_DEPTH} deep")
    many = {"class_name": "Sequential", "config": {"layers": [{"class_name": "Dense"}] * (MAX_CONFIG_OBJECTS + 1)}}
    _refused(_keras_zip(tmp_path / "many.keras", many), "Keras objects")
    (tmp_path / "notzip.keras").write_bytes(b"not a zip at all")
    _refused(str(tmp_path / "notzip.keras"), "not a zip")
    (tmp_path / "dir.keras").mkdir()
    _refused(str(tmp_path / "dir.keras"), "config.json, found none")
    _refused(_keras_zip(tmp_path / "list.keras", [1, 2]), "describe a Keras object")
    with zipfile.ZipFile(tmp_path / "empty.keras", "w") as archive:
        archive.writestr("model.weights.h5", b"")
    _refused(str(tmp_path / "empty.keras"), "holding config.json")


def test_giant_saved_model_pb_is_refused_unread(tmp_path):
    directory = tmp_path / "giant"
    directory.mkdir()
    with open(directory / "saved_model.pb", "wb") as handle:  # sparse: its size without its bytes
        handle.truncate(MAX_PB_BYTES + 1)
    _refused(str(directory), "saved_model.pb of at most")
    (directory / "saved_model.pb").unlink()
    (directory / "saved_model.pbtxt").write_text("")
    _refused(str(directory), "pbtxt, which trainmem does not read")


def test_garbage_saved_model_pb_is_one_line(tmp_path):
    _keras()
    directory = tmp_path / "garbage"
    directory.mkdir()
    (directory / "saved_model.pb").write_bytes(b"\xff" * 4096)
    _refused(str(directory), "expected a SavedModel protobuf|one MetaGraph")
