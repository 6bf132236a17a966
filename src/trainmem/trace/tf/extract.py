"""A tf.Graph's training-step ops as plain records (trace/tf/ops.py): shapes, dtypes, producers, the layer and
phase of each op. Takes TensorFlow objects from the caller (trace/tf/keras_graph.py); imports nothing of TF."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trainmem.trace.events import Phase
from trainmem.trace.tf.kernels import KERNEL_ATTRS, KERNEL_OPS
from trainmem.trace.tf.ops import GraphOp, TensorInfo


def tensor_info(tensor: Any) -> TensorInfo:
    shape = tensor.shape
    dims = None if shape.rank is None else tuple(shape.as_list())
    return TensorInfo(dims, tensor.dtype.base_dtype.name)


def _attrs(op: Any) -> tuple:
    if op.type not in KERNEL_OPS:
        return ()
    out = []
    for name in KERNEL_ATTRS:
        try:
            value = op.get_attr(name)
        except ValueError:
            continue
        out.append((name, value.decode() if isinstance(value, bytes) else (list(value) if isinstance(value, list) else value)))
    return tuple(out)


def graph_ops(ops: Sequence[Any], phase_of: Callable[[int, Any], Phase], module_of: Callable[[int, Any], str],
              sizes_of: Callable[[Any], tuple[tuple, int] | None] = lambda op: None) -> list[GraphOp]:
    """`ops` in creation order (a topological order: an op can only take inputs from ops made before it)."""
    out = []
    for index, op in enumerate(ops):
        sized = sizes_of(op) or ((), 0)
        out.append(GraphOp(
            name=op.name, type=op.type,
            inputs=tuple((t.op.name, t.value_index) for t in op.inputs),
            outputs=tuple(tensor_info(t) for t in op.outputs),
            phase=phase_of(index, op), module=module_of(index, op),
            control_inputs=tuple(c.name for c in op.control_inputs), attrs=_attrs(op),
            output_bytes=sized[0], scratch_bytes=sized[1]))
    return out


def scope_owners(forward: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Name-scope prefix -> layer, from (op name, layer) of the forward ops; a prefix shared by ops of
    several layers maps to none of them. Gradient ops are named gradient_tape/<forward scope>/…"""
    owners: dict[str, str | None] = {}
    for name, layer in forward:
        parts = name.split("/")
        for end in range(1, len(parts) + 1):
            prefix = "/".join(parts[:end])
            if owners.get(prefix, layer) != layer:
                owners[prefix] = None
            else:
                owners[prefix] = layer
    return {k: v for k, v in owners.items() if v is not None}


def gradient_owner(name: str, owners: dict[str, str]) -> str:
    """The layer of a gradient op: the longest forward scope its name (without gradient_tape/) starts with."""
    parts = name.split("/")
    if parts and parts[0].startswith("gradient_tape"):
        parts = parts[1:]
    for end in range(len(parts), 0, -1):
        layer = owners.get("/".join(parts[:end]))
        if layer is not None:
            return layer
    return ""
