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


@pytest.mark.heavy
def test_onnx_cnn_matches_its_torch_twin(tmp_path):
    path = _save(tmp_path, CNN_NODES, CNN_INITS)
    from_onnx = estimate(path, batch_size=8, optimizer="adam")
    twin = estimate(_torch_twin(), batch_size=8, optimizer="adam", input_shape="3,16,16")
    assert from_onnx.parameters == twin.parameters == 8 * 27 + 8 + 16 + 5120 + 10
    assert from_onnx.breakdown["buffers"] >= 2 * 8 * 4  # running mean and variance are buffers
    assert from_onnx.tensor_bytes == pytest.approx(twin.tensor_bytes, rel=0.02)


def test_unknown_operators_are_listed(tmp_path):
    nodes = [helper.make_node("NonMaxSuppression", ["x"], ["z"]), helper.make_node("Loop", ["z"], ["y"])]
    path = _save(tmp_path, nodes, [])
    with pytest.raises(ModelRefError, match="cannot convert Loop, NonMaxSuppression"):
        estimate(path)


def _export(tmp_path, name, dynamic=True):
    """A zoo model exported as people export them: eval mode, torch.onnx.export's TorchScript exporter."""
    import warnings

    import models  # the test zoo, tests/models.py

    model, make_batch = getattr(models, name)()
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), make_batch(2), str(path), dynamo=False, opset_version=17, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}} if dynamic else None)
    return path


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["lstm", "gru", "tiny_gpt", "transformer_encoder", "mobilenet_like", "unet"])
def test_exported_models_compute_what_onnx_computes(tmp_path, name):
    """Exported graphs compute shapes at run time (Shape, Gather, Unsqueeze, Concat → Reshape), use Clip,
    ConvTranspose, LSTM/GRU with ONNX's gate order...: the converted module, given the file's weights,
    computes what ONNX's reference evaluator computes, and the graph can be estimated."""
    from onnx.reference import ReferenceEvaluator

    from trainmem.frontends.onnx_ref import _graph_module

    path = _export(tmp_path, name)
    proto = onnx.load(str(path))
    shape = [d.dim_value if d.dim_value > 0 else 3 for d in proto.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 50, size=shape) if proto.graph.input[0].type.tensor_type.elem_type == TensorProto.INT64
         else rng.standard_normal(shape).astype(np.float32))
    expected = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    with torch.no_grad():
        got = _graph_module(proto, with_values=True)(torch.as_tensor(x)).numpy()
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    assert estimate(str(path), batch_size=3, optimizer="adam", run_steps=2).tensor_bytes > 0


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_recurrent_exports_train_like_their_torch_twin(tmp_path, name):
    """ONNX keeps LSTM/GRU gates in another order; the weights are reordered once when the module is built,
    so training the graph allocates what nn.LSTM/nn.GRU allocate (each layer is one ONNX node)."""
    from conftest import zoo

    # tensor bytes only: the two traced steps, without the long run's glibc heap replay (alloc/steady_state.py)
    twin = estimate(zoo(name), batch_size=4, optimizer="adam", run_steps=2)
    graph = estimate(str(_export(tmp_path, name)), batch_size=4, optimizer="adam", run_steps=2)
    assert graph.parameters == twin.parameters
    # nn.LSTM/GRU keep b_ih and b_hh apart, the ONNX node one bias B = [b_ih, b_hh]: oneDNN's backward returns
    # the two bias gradients as two storages (targets/cpu_kernels.py), which the module keeps as two .grad tensors and
    # the graph sums into B's one; the peaks may differ by those gradients, 2 × 4H fp32 per layer
    hidden, layers = 256, 2  # tests/models.py LSTMClassifier
    assert abs(graph.tensor_bytes - twin.tensor_bytes) <= layers * 2 * 4 * hidden * 4 + 128


@pytest.mark.heavy
def test_fixed_batch_export_says_how_to_estimate_it(tmp_path):
    path = _export(tmp_path, "tiny_gpt", dynamic=False)
    assert estimate(str(path), batch_size=2).tensor_bytes > 0
    with pytest.raises(ModelRefError, match="exported with a fixed batch of 2: estimate with --batch-size 2"):
        estimate(str(path), batch_size=4)


def test_padding_masks_norms_and_einsum_compute_what_onnx_computes(tmp_path):
    """The operators torchvision's Swin and MaxViT exports add: Pad, a mask built with ScatterND from
    constants and negated with Not, ReduceL2, Einsum."""
    from onnx.reference import ReferenceEvaluator

    from trainmem.frontends.onnx_ref import _graph_module

    def constant(name, array):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))

    nodes = [constant("pads", np.array([0, 1, 0, 0, 1, 2], dtype=np.int64)),
             helper.make_node("Pad", ["x", "pads"], ["p"]),
             helper.make_node("ReduceL2", ["p"], ["n"], axes=[2], keepdims=1),
             helper.make_node("Div", ["p", "n"], ["q"]),
             helper.make_node("Einsum", ["q", "w"], ["e"], equation="bij,jk->bik"),
             constant("zeros", np.zeros((6, 5), dtype=np.float32)),
             constant("where", np.array([[0, 1], [2, 3]], dtype=np.int64)),
             constant("ones", np.ones(2, dtype=np.float32)),
             helper.make_node("ScatterND", ["zeros", "where", "ones"], ["m"]),
             helper.make_node("Cast", ["m"], ["mb"], to=TensorProto.BOOL),
             helper.make_node("Not", ["mb"], ["keep"]),
             constant("nothing", np.zeros((), dtype=np.float32)),
             helper.make_node("Where", ["keep", "e", "nothing"], ["y"])]
    weight = np.random.default_rng(1).standard_normal((8, 5)).astype(np.float32)
    graph = helper.make_graph(nodes, "ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6, 5])],
                              [numpy_helper.from_array(weight, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(2).standard_normal((3, 4, 6)).astype(np.float32)
    expected = ReferenceEvaluator(proto).run(None, {"x": x})[0]
    with torch.no_grad():
        got = _graph_module(proto, with_values=True)(torch.as_tensor(x)).numpy()
    # the padded rows are all zero: their norm is 0 and both give NaN there
    assert np.allclose(got, expected, atol=1e-6, equal_nan=True) and (got == 0).sum() >= 2 * 3
    path = tmp_path / "ops.onnx"
    onnx.save(proto, str(path))
    assert estimate(str(path), batch_size=2).parameters == 8 * 5


def test_shared_batch_norm_statistics_stay_buffers(tmp_path):
    """The exporter stores equal initializers once and passes them on through Identity nodes (DenseNet's
    zero running means): statistics reached through Identity are still buffers, not parameters."""
    nodes = [helper.make_node("Identity", ["m"], ["m_shared"]), helper.make_node("Identity", ["v"], ["v_shared"]),
             *[helper.make_node("BatchNormalization", ["c1", "g", "be", "m_shared", "v_shared"], ["bn"])
               if n.op_type == "BatchNormalization" else n for n in CNN_NODES]]
    est = estimate(_save(tmp_path, nodes, CNN_INITS), batch_size=4, optimizer="adam")
    assert est.parameters == 8 * 27 + 8 + 16 + 5120 + 10


def test_files_that_are_not_onnx_models_are_refused_naming_the_file(tmp_path):
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelRefError, match=r"empty\.onnx: expected an ONNX model, got an empty file"):
        estimate(str(empty))
    folder = tmp_path / "folder.onnx"
    folder.mkdir()
    with pytest.raises(ModelRefError, match=r"folder\.onnx: expected an ONNX file, got a directory"):
        estimate(str(folder))
    with pytest.raises(ModelRefError, match=r"missing\.onnx: expected an ONNX file, found none"):
        estimate(str(tmp_path / "missing.onnx"))


def test_initializer_dimensions_beyond_its_data_are_refused_before_anything_is_built(tmp_path, monkeypatch):
    """Dimensions of 100000 × 100000 over 16 bytes of data: refused from the file, never allocated
    (the conversion that checks operators builds on meta)."""
    lying = TensorProto(name="w2", data_type=TensorProto.FLOAT, dims=[100_000, 100_000], raw_data=b"\0" * 16)
    path = _save(tmp_path, CNN_NODES, [*CNN_INITS[:6], lying, CNN_INITS[7]])
    real_empty = torch.empty

    def never_large(*size, **kwargs):
        shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        assert np.prod(shape, dtype=np.float64) < 1e9, f"torch.empty{tuple(shape)} asked for"
        return real_empty(*size, **kwargs)

    monkeypatch.setattr(torch, "empty", never_large)
    with pytest.raises(ModelRefError, match=r"tiny\.onnx: expected initializer 'w2' to hold the 10,000,000,000 "
                                            r"values its dimensions \[100000, 100000\] declare, got 4"):
        estimate(path)
