"""ONNX models as references: the graph becomes a torch module whose initializers are trainable
parameters, so that training them can be traced like any model.

Why not onnx2torch: it depends on torchvision, which cannot be installed beside the pinned CPU build of
torch (torchvision's wheels need a different torch). The converter here covers the operators that
exported MLPs, CNNs, transformers and recurrent nets use; a graph with any other operator is refused
with the list of what is missing, never run in part.

Exported graphs compute shapes at run time (Shape → Gather → Unsqueeze → Concat → Reshape). The model
runs on fake tensors, which have shapes but no values, so shape arithmetic is folded with numpy:
Constant nodes, integer initializers, Shape and every op whose inputs are all such constants give numpy
arrays; an op that meets a real tensor turns its constant inputs into tensors. An op that needs a value
(Reshape's shape, Slice's bounds, Split's sizes) takes it from a constant, and refuses one computed from
tensor data.

The file is read with onnx.load(load_external_data=False): tensors stored outside the file are not
read, only their shapes (from the initializer's dims). Nothing in an ONNX file is executable code.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from trainmem.errors import ModelRefError, one_line, quote, short
from trainmem.files import regular_file
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


def _static(value, what: str) -> list[int]:
    """The integer values of a constant input (a numpy array folded from constants)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return [int(v) for v in value.reshape(-1).tolist()]
    raise ModelRefError(f"expected {what} computable from constants and shapes, got one computed from tensor data",
                        where="onnx")


def _axes(x, a, index: int = 1) -> list[int] | None:
    """Axes from the attribute (older opsets) or the input (opset 13 and later), or None for all."""
    if "axes" in a:
        return list(a["axes"])
    return _static(x[index], "axes") if len(x) > index and x[index] is not None else None


def _ops():
    """ONNX operator → function(inputs, attributes) returning a tensor or a tuple of tensors. Inputs are
    torch tensors; inputs that a function reads as values (shapes, axes, bounds) may be numpy arrays."""
    import torch
    import torch.nn.functional as F

    from trainmem.trace.torch_private import rnn_kernels

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

    def conv_transpose(x, a):
        dims = x[1].dim() - 2
        pads = a.get("pads", [0] * 2 * dims)
        if pads[:dims] != pads[dims:] or "output_shape" in a:
            raise ModelRefError(f"expected symmetric ConvTranspose pads without output_shape, got {pads}", where="onnx")
        fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[dims]
        return fn(x[0], x[1], x[2] if len(x) > 2 else None, stride=a.get("strides", 1), padding=pads[:dims],
                  output_padding=a.get("output_padding", 0), groups=a.get("group", 1), dilation=a.get("dilations", 1))

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
        shape = _static(x[1], "Reshape's shape")
        shape = [x[0].shape[i] if v == 0 and not a.get("allowzero") else v for i, v in enumerate(shape)]
        return x[0].reshape(shape)

    def unsqueeze(x, a):
        out = x[0]
        chosen = _axes(x, a)
        rank = out.dim() + len(chosen)
        for axis in sorted(v % rank for v in chosen):
            out = out.unsqueeze(axis)
        return out

    def squeeze(x, a):
        chosen = _axes(x, a)
        return x[0].squeeze() if chosen is None else x[0].squeeze(tuple(v % x[0].dim() for v in chosen))

    def slice_(x, a):
        starts, ends = _static(x[1], "Slice's starts"), _static(x[2], "Slice's ends")
        chosen = _static(x[3], "Slice's axes") if len(x) > 3 and x[3] is not None else list(range(len(starts)))
        steps = _static(x[4], "Slice's steps") if len(x) > 4 and x[4] is not None else [1] * len(starts)
        index = [slice(None)] * x[0].dim()
        for start, end, axis, step in zip(starts, ends, chosen, steps):
            if step < 1:
                raise ModelRefError(f"expected positive Slice steps, got {step}", where="onnx")
            index[axis % x[0].dim()] = slice(start, end, step)
        return x[0][tuple(index)]

    def split(x, a):
        axis = a.get("axis", 0) % x[0].dim()
        if len(x) > 1 and x[1] is not None:
            sizes = _static(x[1], "Split's sizes")
        elif "split" in a:
            sizes = list(a["split"])
        else:
            parts = a["num_outputs"]
            sizes = [-(-x[0].shape[axis] // parts)] * parts
        return tuple(torch.split(x[0], sizes, dim=axis))

    def gather(x, a):
        axis, indices = a.get("axis", 0), x[1]
        if not isinstance(indices, torch.Tensor):  # constant indices, possibly negative (counted from the end)
            indices = torch.as_tensor(indices % x[0].shape[axis])
        if axis == 0 and x[0].dim() == 2 and x[0].is_floating_point():  # an embedding lookup
            return F.embedding(indices, x[0])
        return torch.index_select(x[0], axis, indices.reshape(-1)).reshape(
            *x[0].shape[:axis], *indices.shape, *x[0].shape[axis + 1:])

    def clip(x, a):
        low = x[1] if len(x) > 1 and x[1] is not None else a.get("min")
        high = x[2] if len(x) > 2 and x[2] is not None else a.get("max")
        return torch.clamp(x[0], low, high)

    def trilu(x, a):
        k = _static(x[1], "Trilu's k")[0] if len(x) > 1 and x[1] is not None else 0
        return torch.triu(x[0], k) if a.get("upper", 1) else torch.tril(x[0], k)

    def reduce(fn):
        def run(x, a):
            chosen = _axes(x, a)
            keep = bool(a.get("keepdims", 1))
            return fn(x[0], dim=tuple(chosen) if chosen else tuple(range(x[0].dim())), keepdim=keep)
        return run

    def recurrent(kind: str):
        """ONNX LSTM/GRU (one layer, layout 0: [seq, batch, input]) through torch's own kernel. The weight
        initializers were put in torch's gate order when the module was built (_RECURRENT_ORDER), so the
        per-direction weights are views of the parameters, as in nn.LSTM/nn.GRU."""
        def run(x, a):
            if a.get("layout", 0) != 0 or (kind == "GRU" and not a.get("linear_before_reset", 0)):
                raise ModelRefError(f"expected {kind} with layout 0" + (" and linear_before_reset=1 (torch's GRU)"
                                                                        if kind == "GRU" else ""), where="onnx")
            if len(x) > 4 and x[4] is not None:
                lengths = _static(x[4], f"{kind}'s sequence_lens")
                if len(set(lengths)) > 1:
                    raise ModelRefError(f"expected {kind} sequences of one length, got {sorted(set(lengths))}",
                                        where="onnx")
            inputs, w, r = x[0], x[1], x[2]
            bias = x[3] if len(x) > 3 else None
            directions, hidden = w.shape[0], a["hidden_size"]
            gates = w.shape[1]
            weights = []
            for d in range(directions):
                weights += [w[d], r[d]] + ([bias[d, :gates], bias[d, gates:]] if bias is not None else [])
            zeros = inputs.new_zeros(directions, inputs.shape[1], hidden)
            h0 = x[5] if len(x) > 5 and x[5] is not None else zeros
            bidirectional = directions == 2
            if kind == "LSTM":
                c0 = x[6] if len(x) > 6 and x[6] is not None else zeros
                out, h_n, c_n = rnn_kernels().lstm(inputs, (h0, c0), weights, bias is not None, 1, 0.0, True,
                                                   bidirectional, False)
            else:
                out, h_n = rnn_kernels().gru(inputs, h0, weights, bias is not None, 1, 0.0, True, bidirectional, False)
            y = out.view(out.shape[0], out.shape[1], directions, hidden).transpose(1, 2)
            return (y, h_n, c_n) if kind == "LSTM" else (y, h_n)
        return run

    def pad(x, a):
        """ONNX pads are [begin of each axis..., end of each axis...]; F.pad wants (begin, end) pairs from
        the last axis backwards."""
        pads = _static(x[1], "Pad's pads") if len(x) > 1 and x[1] is not None else list(a.get("pads", []))
        rank = x[0].dim()
        chosen = _static(x[3], "Pad's axes") if len(x) > 3 and x[3] is not None else list(range(rank))
        begins, ends = pads[:len(chosen)], pads[len(chosen):]
        flat = [0] * (2 * rank)
        for axis, begin, end in zip(chosen, begins, ends):
            flat[2 * (rank - 1 - axis % rank)], flat[2 * (rank - 1 - axis % rank) + 1] = begin, end
        while len(flat) > 2 and flat[-2:] == [0, 0]:
            flat = flat[:-2]
        mode = a.get("mode", b"constant")
        mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}[
            mode.decode() if isinstance(mode, bytes) else mode]
        value = float(x[2].reshape(-1)[0]) if len(x) > 2 and x[2] is not None and mode == "constant" else 0.0
        return F.pad(x[0], flat, mode=mode, value=value) if mode == "constant" else F.pad(x[0], flat, mode=mode)

    def scatter_nd(x, a):
        if a.get("reduction", b"none") not in (b"none", "none"):
            raise ModelRefError("expected ScatterND without reduction", where="onnx")
        data, indices, updates = x
        return torch.index_put(data, tuple(indices.unbind(-1)), updates)

    def einsum(x, a):
        equation = a["equation"]
        return torch.einsum(equation.decode() if isinstance(equation, bytes) else equation, *x)

    return {
        "LSTM": recurrent("LSTM"), "GRU": recurrent("GRU"), "Pad": pad, "ScatterND": scatter_nd, "Einsum": einsum,
        "Not": lambda x, a: torch.logical_not(x[0]),
        "ReduceL2": reduce(lambda t, dim, keepdim: torch.linalg.vector_norm(t, 2, dim=dim, keepdim=keepdim)),
        "Gemm": gemm, "MatMul": lambda x, a: x[0] @ x[1], "Add": lambda x, a: x[0] + x[1],
        "Sub": lambda x, a: x[0] - x[1], "Mul": lambda x, a: x[0] * x[1], "Div": lambda x, a: x[0] / x[1],
        "Neg": lambda x, a: -x[0], "Exp": lambda x, a: torch.exp(x[0]), "Log": lambda x, a: torch.log(x[0]),
        "Relu": lambda x, a: F.relu(x[0]), "Sigmoid": lambda x, a: torch.sigmoid(x[0]),
        "Tanh": lambda x, a: torch.tanh(x[0]), "Erf": lambda x, a: torch.erf(x[0]),
        "Sqrt": lambda x, a: torch.sqrt(x[0]), "Pow": lambda x, a: torch.pow(x[0], x[1]),
        "Gelu": lambda x, a: F.gelu(x[0], approximate=a.get("approximate", b"none").decode()
                                    if isinstance(a.get("approximate"), bytes) else a.get("approximate", "none")),
        "LeakyRelu": lambda x, a: F.leaky_relu(x[0], a.get("alpha", 0.01)),
        "Clip": clip, "HardSigmoid": lambda x, a: torch.clamp(a.get("alpha", 0.2) * x[0] + a.get("beta", 0.5), 0, 1),
        "HardSwish": lambda x, a: F.hardswish(x[0]),
        "Softmax": lambda x, a: torch.softmax(x[0], a.get("axis", -1)),
        "LogSoftmax": lambda x, a: torch.log_softmax(x[0], a.get("axis", -1)),
        "Conv": conv, "ConvTranspose": conv_transpose, "MaxPool": pool("max"), "AveragePool": pool("avg"),
        "GlobalAveragePool": lambda x, a: x[0].mean(dim=tuple(range(2, x[0].dim())), keepdim=True),
        "BatchNormalization": lambda x, a: F.batch_norm(x[0], x[3], x[4], x[1], x[2], training=True,
                                                        momentum=1 - a.get("momentum", 0.9), eps=a.get("epsilon", 1e-5)),
        "LayerNormalization": lambda x, a: F.layer_norm(x[0], x[0].shape[a.get("axis", -1):], x[1],
                                                        x[2] if len(x) > 2 else None, a.get("epsilon", 1e-5)),
        "Flatten": lambda x, a: x[0].flatten(a.get("axis", 1)) if a.get("axis", 1) != 0 else x[0].reshape(1, -1),
        "Reshape": reshape, "Transpose": lambda x, a: x[0].permute(a["perm"]) if "perm" in a else x[0].t(),
        "Concat": lambda x, a: torch.cat(x, a["axis"]), "Identity": lambda x, a: x[0],
        "Dropout": lambda x, a: F.dropout(x[0], 0.5, training=True),  # the ratio does not change what is kept
        "ReduceMean": reduce(torch.mean), "ReduceSum": reduce(torch.sum),
        "ReduceMax": reduce(lambda t, dim, keepdim: torch.amax(t, dim=dim, keepdim=keepdim)),
        "Unsqueeze": unsqueeze, "Squeeze": squeeze, "Slice": slice_, "Split": split, "Gather": gather,
        "Expand": lambda x, a: x[0].expand(torch.broadcast_shapes(tuple(x[0].shape),
                                                                  tuple(_static(x[1], "Expand's shape")))),
        "Cast": lambda x, a: x[0].to(getattr(torch, _DTYPES[a["to"]])),
        "Equal": lambda x, a: torch.eq(x[0], x[1]), "Where": lambda x, a: torch.where(x[0], x[1], x[2]),
        "Mod": lambda x, a: torch.fmod(x[0], x[1]) if a.get("fmod") else torch.remainder(x[0], x[1]),
        "Trilu": trilu, "Shape": lambda x, a: _shape(x[0], a), "Constant": lambda x, a: _constant_node(a),
    }


def _shape(tensor, attributes):
    import numpy as np

    return np.array(tuple(tensor.shape)[attributes.get("start", 0):attributes.get("end")], dtype=np.int64)


def _constant_node(attributes):
    import numpy as np
    from onnx import numpy_helper

    if "value" in attributes:
        return numpy_helper.to_array(attributes["value"]).copy()
    for key, dtype in (("value_int", np.int64), ("value_ints", np.int64), ("value_float", np.float32),
                       ("value_floats", np.float32)):
        if key in attributes:
            return np.array(attributes[key], dtype=dtype)
    raise ModelRefError(f"expected a Constant with a value, got attributes {sorted(attributes)}", where="onnx")


def _folded(op_type: str, args: list, attributes: dict):
    """The op computed with numpy when all its inputs are numpy constants (shape arithmetic), else None."""
    import numpy as np

    table = _numpy_ops()
    if not all(isinstance(v, np.ndarray) for v in args if v is not None) or op_type not in table:
        return None
    result = table[op_type](args, attributes)  # numpy gives scalars for 0-d results: keep arrays
    return tuple(np.asarray(r) for r in result) if isinstance(result, tuple) else np.asarray(result)


@functools.cache
def _numpy_ops():
    import numpy as np

    def gather(x, a):
        return np.take(x[0], x[1], axis=a.get("axis", 0))

    def unsqueeze(x, a):
        chosen = _axes(x, a)
        rank = x[0].ndim + len(chosen)
        return np.expand_dims(x[0], tuple(sorted(v % rank for v in chosen)))

    def squeeze(x, a):
        chosen = _axes(x, a)
        return np.squeeze(x[0]) if chosen is None else np.squeeze(x[0], tuple(v % x[0].ndim for v in chosen))

    def slice_(x, a):
        starts, ends = x[1].reshape(-1).tolist(), x[2].reshape(-1).tolist()
        chosen = x[3].reshape(-1).tolist() if len(x) > 3 and x[3] is not None else list(range(len(starts)))
        steps = x[4].reshape(-1).tolist() if len(x) > 4 and x[4] is not None else [1] * len(starts)
        index = [slice(None)] * x[0].ndim
        for start, end, axis, step in zip(starts, ends, chosen, steps):
            index[axis % x[0].ndim] = slice(start, end, step)
        return x[0][tuple(index)]

    def cast(x, a):
        return x[0].astype({"float32": np.float32, "float16": np.float16, "float64": np.float64, "int64": np.int64,
                            "int32": np.int32, "bool": np.bool_, "uint8": np.uint8, "int8": np.int8}.get(
            _DTYPES.get(a["to"], ""), np.float32))

    def scatter_nd(x, a):
        out = x[0].copy()
        out[tuple(np.moveaxis(x[1], -1, 0))] = x[2]
        return out

    return {
        "ScatterND": scatter_nd, "Not": lambda x, a: np.logical_not(x[0]),
        "Identity": lambda x, a: x[0], "Shape": lambda x, a: _shape(x[0], a),
        "Constant": lambda x, a: _constant_node(a), "Gather": gather, "Unsqueeze": unsqueeze, "Squeeze": squeeze,
        "Concat": lambda x, a: np.concatenate(x, axis=a["axis"]), "Slice": slice_, "Cast": cast,
        "Add": lambda x, a: x[0] + x[1], "Sub": lambda x, a: x[0] - x[1], "Mul": lambda x, a: x[0] * x[1],
        "Div": lambda x, a: (x[0] // x[1]) if np.issubdtype(x[0].dtype, np.integer) else x[0] / x[1],
        "Mod": lambda x, a: np.fmod(x[0], x[1]) if a.get("fmod") else np.mod(x[0], x[1]),
        "Neg": lambda x, a: -x[0], "Sqrt": lambda x, a: np.sqrt(x[0]), "Equal": lambda x, a: np.equal(x[0], x[1]),
        "Where": lambda x, a: np.where(x[0], x[1], x[2]), "Reshape": lambda x, a: x[0].reshape(x[1].tolist()),
        "Expand": lambda x, a: x[0] * np.ones(x[1].tolist(), dtype=x[0].dtype),
        "ConstantOfShape": lambda x, a: np.full(x[0].tolist(), _constant_node(a).reshape(-1)[0] if a else 0.0,
                                                dtype=_constant_node(a).dtype if a else np.float32),
        "Range": lambda x, a: np.arange(x[0].item(), x[1].item(), x[2].item()),
        "Trilu": lambda x, a: (np.triu if a.get("upper", 1) else np.tril)(x[0], int(x[1]) if len(x) > 1 else 0),
        "Transpose": lambda x, a: np.transpose(x[0], a.get("perm")),
    }


def _graph_module(model_proto, with_values: bool = False):
    """The graph as a torch module. Float initializers become parameters (BatchNormalization's running
    statistics buffers), other initializers buffers; `with_values` copies their values (for checking the
    conversion against the ONNX reference evaluator), else they stay uninitialized."""
    import numpy as np
    import torch
    from onnx import numpy_helper

    graph, ops = model_proto.graph, _ops()
    missing = sorted({n.op_type for n in graph.node} - set(ops) - set(_numpy_ops()))
    if missing:
        raise ModelRefError(f"expected ONNX operators this converter knows; cannot convert {', '.join(missing)}",
                            where="onnx")

    # running statistics are state, not weights: BatchNormalization's inputs 3 and 4 become buffers
    # (the exporter stores equal initializers once and hands them on through Identity nodes: follow those)
    identity_of = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity"}

    def source(name: str) -> str:
        while name in identity_of:
            name = identity_of[name]
        return name

    statistics = {source(name) for n in graph.node if n.op_type == "BatchNormalization" for name in n.input[3:5]}
    # integer initializers (shapes, axes, indices) are read as constants for folding shape arithmetic
    constants = {t.name: numpy_helper.to_array(t).copy() for t in graph.initializer
                 if _DTYPES.get(t.data_type, "float32") not in ("float32", "float16", "float64", "bfloat16")}

    # a graph exported without dynamic axes has the export's batch size written into its shapes
    batches = {i.type.tensor_type.shape.dim[0].dim_value for i in graph.input if i.name not in constants
               and i.type.tensor_type.shape.dim and i.type.tensor_type.shape.dim[0].dim_value > 0}
    fixed_batch_hint = (f" (the graph was exported with a fixed batch of {min(batches)}: estimate with --batch-size "
                        f"{min(batches)}, or export with dynamic_axes for the batch dimension)" if batches else "")

    # LSTM/GRU weights (W, R, B) are stored in torch's gate order: name → (op type, which input)
    recurrent_weights = {name: (n.op_type, i) for n in graph.node if n.op_type in _RECURRENT_ORDER
                         for i, name in enumerate(n.input[1:4], start=1) if name}

    class OnnxGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.names: dict[str, str] = {}  # ONNX tensor name → attribute name
            for index, tensor in enumerate(graph.initializer):
                if tensor.name in constants:
                    value = torch.as_tensor(constants[tensor.name])
                elif with_values:
                    value = torch.as_tensor(_torch_gate_order(numpy_helper.to_array(tensor).copy(),
                                                              recurrent_weights.get(tensor.name)))
                else:
                    value = torch.empty(tuple(tensor.dims), dtype=getattr(torch, _DTYPES.get(tensor.data_type,
                                                                                              "float32")))
                attribute = f"init{index}_{''.join(c if c.isalnum() else '_' for c in tensor.name)[:40]}"
                if value.is_floating_point() and tensor.name not in statistics:
                    self.register_parameter(attribute, torch.nn.Parameter(value))
                else:
                    self.register_buffer(attribute, value)
                self.names[tensor.name] = attribute

        def forward(self, *inputs):
            values: dict[str, Any] = {name: getattr(self, attribute) for name, attribute in self.names.items()
                                      if name not in constants}
            values.update(constants)
            feeds = [i.name for i in graph.input if i.name not in self.names]
            values.update(zip(feeds, inputs))
            for node in graph.node:
                args = [values[name] if name else None for name in node.input]
                attributes = _attributes(node)
                result = _folded(node.op_type, args, attributes)
                if result is None:
                    if node.op_type not in ops:
                        raise ModelRefError(f"expected {node.op_type}'s inputs computable from constants and "
                                            "shapes, got tensor data", where="onnx")
                    try:
                        result = ops[node.op_type](_as_tensors(node.op_type, args), attributes)
                    except RuntimeError as error:
                        raise ModelRefError(f"{node.op_type} node {node.name or '(unnamed)'} failed: "
                                            f"{str(error).splitlines()[0]}{fixed_batch_hint}", where="onnx") from None
                for name, value in zip(node.output, result if isinstance(result, tuple) else (result,)):
                    values[name] = value
            outputs = [torch.as_tensor(v) if isinstance(v, np.ndarray) else v
                       for v in (values[o.name] for o in graph.output)]
            return outputs[0] if len(outputs) == 1 else tuple(outputs)

    return OnnxGraph()


# ONNX gate order → torch's: LSTM i,o,f,c → i,f,g(c),o; GRU z,r,h → r,z,n
_RECURRENT_ORDER = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2)}


def _torch_gate_order(array, use):
    """An LSTM/GRU weight initializer's gate blocks put in torch's order (rows of W and R; each half of B)."""
    import numpy as np

    if use is None:
        return array
    op_type, _ = use
    order = _RECURRENT_ORDER[op_type]
    halves = np.split(array, 2, axis=1) if use[1] == 3 else [array]  # B holds Wb and Rb side by side
    reordered = [np.concatenate([np.split(half, len(order), axis=1)[g] for g in order], axis=1) for half in halves]
    return np.concatenate(reordered, axis=1)


# inputs an op reads as values (shapes, axes, bounds, sizes): they stay numpy constants
_VALUE_INPUTS = {"LSTM": {4}, "GRU": {4}, "Gather": {1}, "Pad": {1, 2, 3}, "ReduceL2": {1}, "Reshape": {1}, "Unsqueeze": {1}, "Squeeze": {1}, "Slice": {1, 2, 3, 4}, "Split": {1},
                 "Expand": {1}, "Trilu": {1}, "ReduceMean": {1}, "ReduceSum": {1}, "ReduceMax": {1}}


def _as_tensors(op_type: str, args: list) -> list:
    """The node's inputs for a torch op: numpy constants become tensors, except those read as values."""
    import numpy as np
    import torch

    keep = _VALUE_INPUTS.get(op_type, set())
    return [torch.as_tensor(v) if isinstance(v, np.ndarray) and i not in keep else v for i, v in enumerate(args)]


def _input_specs(graph, initializers: set[str]) -> tuple[InputSpec, ...]:
    specs = []
    for value in graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim[1:]  # the first is the batch
        shape = tuple(d.dim_value if d.dim_value > 0 else 1 for d in dims)
        specs.append(InputSpec(shape, _DTYPES.get(value.type.tensor_type.elem_type, "float32")))
    return tuple(specs)


# bytes per element of the onnx TensorProto data types an initializer may hold
_ITEMSIZE = {"float32": 4, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1, "float16": 2,
             "float64": 8, "bfloat16": 2}
_MAX_ELEMENTS = 2**63 - 1  # a tensor's element count is an int64 (c10 TensorImpl::numel_)


def _check_initializers(graph, where: str) -> None:
    """Each initializer's dims must describe the data the file holds: a header claiming 100000 × 100000
    floats over 16 bytes is refused here, before anything is built (and building is on meta anyway).
    Initializers stored outside the file (external data) are not read: only their dims count."""
    for tensor in graph.initializer:
        dims = list(tensor.dims)
        if any(d < 0 for d in dims) or math.prod(dims) > _MAX_ELEMENTS:
            raise ModelRefError(f"expected initializer {quote(tensor.name)} with dimensions within int64, got "
                                f"{dims}", where=where)
        if tensor.data_location == 1:  # TensorProto.EXTERNAL
            continue
        dtype = _DTYPES.get(tensor.data_type)
        if dtype is None:
            raise ModelRefError(f"expected initializer {quote(tensor.name)} of a type among {', '.join(_ITEMSIZE)}, got "
                                f"ONNX data type {tensor.data_type}", where=where)
        numel = math.prod(dims)
        if tensor.raw_data:
            held = len(tensor.raw_data) // _ITEMSIZE[dtype]
        else:
            held = max(len(tensor.float_data), len(tensor.int32_data), len(tensor.int64_data), len(tensor.double_data),
                       len(tensor.uint64_data))
        if held != numel:
            raise ModelRefError(f"expected initializer {quote(tensor.name)} to hold the {numel:,} values its dimensions "
                                f"{dims} declare, got {held:,}", where=where)


def from_onnx(ref: str):
    import torch

    from trainmem.frontends import ModelSource

    path, size = regular_file(ref, "an ONNX file")
    where = short(ref)
    if size == 0:
        raise ModelRefError("expected an ONNX model, got an empty file", where=where)
    onnx = _onnx()
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # noqa: BLE001 - onnx raises several kinds on a bad file
        raise ModelRefError(f"expected an ONNX model, could not read it: {one_line(error)}", where=where) from None
    if not proto.graph.node:
        raise ModelRefError("expected an ONNX model with a graph, got none (an empty file, or not ONNX)", where=where)
    _check_initializers(proto.graph, where)
    with torch.device("meta"):  # converting once here reports unknown operators before the trace; nothing allocated
        _graph_module(proto)
    initializers = {t.name for t in proto.graph.initializer}
    return ModelSource(ref=ref, name=path.name, build=lambda: _graph_module(proto),
                       default_inputs=_input_specs(proto.graph, initializers),
                       notes=(f"ONNX graph of {len(proto.graph.node)} nodes converted to torch; its "
                              f"{len(initializers)} initializers are the parameters",))
