"""ONNX models as references: the graph becomes a torch module whose initializers are trainable
parameters, so that training them can be traced like any model.

Why not onnx2torch: it depends on torchvision, which cannot be installed beside the pinned CPU build of
torch (torchvision's wheels need a different torch). The converter here covers the operators that
training graphs of MLPs, CNNs and transformers use; a graph with any other operator is refused with
the list of what is missing, never run in part.

The file is read with onnx.load(load_external_data=False): tensors stored outside the file are not
read, only their shapes (from the initializer's dims). Nothing in an ONNX file is executable code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError
from trainmem.setup import InputSpec

# onnx TensorProto data types → torch dtype names
_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
           11: "float64", 16: "bfloat16"}


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ModelRefError("expected onnx for .onnx references; install it with pip install 'trainmem[onnx]'",
                            where="MODEL") from None
    return onnx


def _attributes(node) -> dict[str, Any]:
    onnx = _onnx()
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _ops():
    """ONNX operator → function(inputs, attributes) returning a tensor or a tuple of tensors."""
    import torch
    import torch.nn.functional as F

    def gemm(x, a):
        a_, b, c = x[0], x[1], x[2] if len(x) > 2 else None
        if a.get("transA"):
            a_ = a_.t()
        if a.get("transB"):
            b = b.t()
        y = a.get("alpha", 1.0) * (a_ @ b) if a.get("alpha", 1.0) != 1.0 else a_ @ b
        return y if c is None else y + (a.get("beta", 1.0) * c if a.get("beta", 1.0) != 1.0 else c)

    def conv(x, a):
        dims = x[1].dim() - 2
        pads = a.get("pads", [0] * 2 * dims)
        if pads[:dims] != pads[dims:]:
            raise ModelRefError(f"expected symmetric Conv pads, got {pads}", where="onnx")
        fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[dims]
        return fn(x[0], x[1], x[2] if len(x) > 2 else None, stride=a.get("strides", 1), padding=pads[:dims],
                  dilation=a.get("dilations", 1), groups=a.get("group", 1))

    def pool(kind):
        def run(x, a):
            dims = len(a["kernel_shape"])
            pads = a.get("pads", [0] * 2 * dims)
            fn = {("max", 1): F.max_pool1d, ("max", 2): F.max_pool2d, ("max", 3): F.max_pool3d,
                  ("avg", 1): F.avg_pool1d, ("avg", 2): F.avg_pool2d, ("avg", 3): F.avg_pool3d}[(kind, dims)]
            return fn(x[0], a["kernel_shape"], a.get("strides", a["kernel_shape"]), pads[:dims],
                      ceil_mode=bool(a.get("ceil_mode", 0)))
        return run

    def reshape(x, a):
        shape = [int(v) for v in x[1].tolist()] if x[1].device.type != "meta" else None
        if shape is None:
            raise ModelRefError("expected Reshape's shape as a constant initializer", where="onnx")
        shape = [x[0].shape[i] if v == 0 and not a.get("allowzero") else v for i, v in enumerate(shape)]
        return x[0].reshape(shape)

    return {
        "Gemm": gemm, "MatMul": lambda x, a: x[0] @ x[1], "Add": lambda x, a: x[0] + x[1],
        "Sub": lambda x, a: x[0] - x[1], "Mul": lambda x, a: x[0] * x[1], "Div": lambda x, a: x[0] / x[1],
        "Relu": lambda x, a: F.relu(x[0]), "Sigmoid": lambda x, a: torch.sigmoid(x[0]),
        "Tanh": lambda x, a: torch.tanh(x[0]), "Erf": lambda x, a: torch.erf(x[0]),
        "Sqrt": lambda x, a: torch.sqrt(x[0]), "Pow": lambda x, a: torch.pow(x[0], x[1]),
        "Gelu": lambda x, a: F.gelu(x[0], approximate=a.get("approximate", b"none").decode()
                                    if isinstance(a.get("approximate"), bytes) else a.get("approximate", "none")),
        "LeakyRelu": lambda x, a: F.leaky_relu(x[0], a.get("alpha", 0.01)),
        "Softmax": lambda x, a: torch.softmax(x[0], a.get("axis", -1)),
        "LogSoftmax": lambda x, a: torch.log_softmax(x[0], a.get("axis", -1)),
        "Conv": conv, "MaxPool": pool("max"), "AveragePool": pool("avg"),
        "GlobalAveragePool": lambda x, a: x[0].mean(dim=tuple(range(2, x[0].dim())), keepdim=True),
        "BatchNormalization": lambda x, a: F.batch_norm(x[0], x[3], x[4], x[1], x[2], training=True,
                                                        momentum=1 - a.get("momentum", 0.9), eps=a.get("epsilon", 1e-5)),
        "LayerNormalization": lambda x, a: F.layer_norm(x[0], x[0].shape[a.get("axis", -1):], x[1],
                                                        x[2] if len(x) > 2 else None, a.get("epsilon", 1e-5)),
        "Flatten": lambda x, a: x[0].flatten(a.get("axis", 1)) if a.get("axis", 1) != 0 else x[0].reshape(1, -1),
        "Reshape": reshape, "Transpose": lambda x, a: x[0].permute(a["perm"]) if "perm" in a else x[0].t(),
        "Concat": lambda x, a: torch.cat(x, a["axis"]), "Identity": lambda x, a: x[0],
        "Dropout": lambda x, a: F.dropout(x[0], 0.5 if len(x) < 2 else 0.5, training=True),
        "ReduceMean": lambda x, a: x[0].mean(dim=a["axes"], keepdim=bool(a.get("keepdims", 1))),
    }


def _graph_module(model_proto):
    import torch

    graph, ops = model_proto.graph, _ops()
    missing = sorted({n.op_type for n in graph.node} - set(ops))
    if missing:
        raise ModelRefError(f"expected ONNX operators this converter knows; cannot convert {', '.join(missing)}",
                            where="onnx")

    # running statistics are state, not weights: BatchNormalization's inputs 3 and 4 become buffers
    statistics = {name for n in graph.node if n.op_type == "BatchNormalization" for name in n.input[3:5]}

    class OnnxGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.names: dict[str, str] = {}  # ONNX tensor name → attribute name
            for index, tensor in enumerate(graph.initializer):
                dtype = getattr(torch, _DTYPES.get(tensor.data_type, "float32"))
                value = _constant(tensor) if tensor.data_type == 7 else torch.empty(tuple(tensor.dims), dtype=dtype)
                attribute = f"init{index}_{''.join(c if c.isalnum() else '_' for c in tensor.name)[:40]}"
                if value.is_floating_point() and tensor.name not in statistics:
                    self.register_parameter(attribute, torch.nn.Parameter(value))
                else:
                    self.register_buffer(attribute, value)
                self.names[tensor.name] = attribute

        def forward(self, *inputs):
            values: dict[str, Any] = {name: getattr(self, attribute) for name, attribute in self.names.items()}
            feeds = [i.name for i in graph.input if i.name not in self.names]
            values.update(zip(feeds, inputs))
            for node in graph.node:
                args = [values[name] for name in node.input if name]
                result = ops[node.op_type](args, _attributes(node))
                for name, value in zip(node.output, result if isinstance(result, tuple) else (result,)):
                    values[name] = value
            outputs = [values[o.name] for o in graph.output]
            return outputs[0] if len(outputs) == 1 else tuple(outputs)

    return OnnxGraph()


def _constant(tensor):
    """An int64 initializer (a Reshape's shape): its few values are read, on the CPU, as constants."""
    import torch
    from onnx import numpy_helper

    return torch.as_tensor(numpy_helper.to_array(tensor).copy(), device="cpu")


def _input_specs(graph, initializers: set[str]) -> tuple[InputSpec, ...]:
    specs = []
    for value in graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim[1:]  # the first is the batch
        shape = tuple(d.dim_value if d.dim_value > 0 else 1 for d in dims)
        specs.append(InputSpec(shape, _DTYPES.get(value.type.tensor_type.elem_type, "float32")))
    return tuple(specs)


def from_onnx(ref: str):
    from trainmem.frontends import ModelSource

    path = Path(ref)
    if not path.is_file():
        raise ModelRefError(f"expected an ONNX file, found none at {ref!r}", where="MODEL")
    onnx = _onnx()
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # noqa: BLE001 - onnx raises several kinds on a bad file
        raise ModelRefError(f"expected an ONNX model, could not read it: {str(error).splitlines()[0]}",
                            where=ref) from None
    _ops_check = _graph_module  # converting once here reports unknown operators before the trace
    _ops_check(proto)
    initializers = {t.name for t in proto.graph.initializer}
    return ModelSource(ref=ref, name=path.name, build=lambda: _graph_module(proto),
                       default_inputs=_input_specs(proto.graph, initializers),
                       notes=(f"ONNX graph of {len(proto.graph.node)} nodes converted to torch; its "
                              f"{len(initializers)} initializers are the parameters",))
