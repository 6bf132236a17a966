"""ONNX references: a graph made in the test, converted and traced; unknown operators are listed."""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")
np = pytest.importorskip("numpy")

import torch  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from trainmem import estimate  # noqa: E402
from trainmem.errors import ModelRefError  # noqa: E402


def _init(name, shape):
    return numpy_helper.from_array(np.zeros(shape, dtype=np.float32), name)


def _save(tmp_path, nodes, inits, name="tiny.onnx"):
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    path = tmp_path / name
    onnx.save(helper.make_model(graph), str(path))
    return str(path)


CNN_NODES = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "g", "be", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p1"], ["f"]),
             helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], transB=1)]
CNN_INITS = [_init("w1", (8, 3, 3, 3)), _init("b1", (8,)), _init("g", (8,)), _init("be", (8,)), _init("m", (8,)),
             _init("v", (8,)), _init("w2", (10, 512)), _init("b2", (10,))]


def _torch_twin():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(512, 10))


def test_onnx_cnn_matches_its_torch_twin(tmp_path):
    path = _save(tmp_path, CNN_NODES, CNN_INITS)
    from_onnx = estimate(path, batch_size=8, optimizer="adam")
    twin = estimate(_torch_twin(), batch_size=8, optimizer="adam", input_shape="3,16,16")
    assert from_onnx.parameters == twin.parameters == 8 * 27 + 8 + 16 + 5120 + 10
    assert from_onnx.breakdown["buffers"] >= 2 * 8 * 4  # running mean and variance are buffers
    assert from_onnx.tensor_bytes == pytest.approx(twin.tensor_bytes, rel=0.02)


def test_unknown_operators_are_listed(tmp_path):
    nodes = [helper.make_node("NonMaxSuppression", ["x"], ["z"]), helper.make_node("Einsum", ["z"], ["y"], equation="ij->ij")]
    path = _save(tmp_path, nodes, [])
    with pytest.raises(ModelRefError, match="cannot convert Einsum, NonMaxSuppression"):
        estimate(path)
