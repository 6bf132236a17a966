"""Sizes of what a while loop (tf.while_loop v2: While / StatelessWhile, as Keras's RNN layers build it)
holds, read from its body function. TensorFlow objects come from the caller; a body read from a FunctionDef is rebuilt with
tensorflow's function_def_to_graph.

A TensorList output holds one tensor per iteration: TensorListPushBack / TensorListSetItem keep a
reference to the element (list_kernels.h: the list's `tensors` vector), so the list's bytes are the
iterations times the element's bytes, unless the element is a variable's read (ReadVariableOp aliases
the variable: every iteration holds the same buffer). The loop runs `iterations` times: the length of
the TensorLists that feed it (TensorListReserve's num_elements, TensorListFromTensor's leading dimension).
Each iteration's own temporaries come and go inside the loop; one iteration's worth of body outputs is
held as scratch while the loop runs, a bound of what one iteration keeps at once.
"""

from __future__ import annotations

import math
from typing import Any

from trainmem.trace.tf.ops import DTYPE_BYTES
from trainmem.trace.tf.private import function_def_graph, graph_function

LOOP_OPS = ("While", "StatelessWhile")


def _bytes(tensor: Any) -> int | None:
    shape = tensor.shape
    if shape.rank is None or any(d is None for d in shape.as_list()):
        return None
    return math.prod(shape.as_list()) * DTYPE_BYTES.get(tensor.dtype.base_dtype.name, 0)


def _static(tf: Any, tensor: Any) -> int | None:
    try:
        value = tf.get_static_value(tensor)
    except (TypeError, ValueError):
        return None
    return int(value) if value is not None and getattr(value, "ndim", 1) == 0 else None


def iterations(tf: Any, op: Any) -> int | None:
    """The trip count: from the loop's maximum_iterations, else the TensorLists it reads or fills."""
    counts = []
    for tensor in op.inputs:
        producer = tensor.op
        if producer.type == "TensorListReserve":
            counts.append(_static(tf, producer.inputs[1]))
        elif producer.type == "TensorListFromTensor":
            dims = producer.inputs[0].shape.as_list() if producer.inputs[0].shape.rank else []
            counts.append(dims[0] if dims else None)
    if len(op.inputs) > 1:
        counts.append(_static(tf, op.inputs[1]))  # while_v2's loop var 1: maximum_iterations
    known = [c for c in counts if c is not None and c > 0]
    return max(known) if known else None


def loop_sizes(tf: Any, graph: Any, op: Any) -> tuple[tuple[int | None, ...], int] | None:
    """(bytes of each output, scratch bytes while it runs) for a While op, or None where its body or its
    trip count cannot be read."""
    body = _body(graph, op)
    if body is None:
        return None
    count = iterations(tf, op)
    if count is None:
        return None
    sizes: list[int | None] = []
    for index, tensor in enumerate(op.outputs):
        if tensor.dtype.name != "variant":
            sizes.append(_bytes(tensor))
            continue
        produced = body.outputs[index] if index < len(body.outputs) else None
        sizes.append(_list_bytes(produced, count) if produced is not None else None)
    scratch = sum(b for b in (_bytes(t) for o in body.get_operations() for t in o.outputs
                              if o.type not in ("ReadVariableOp", "Const", "Placeholder") and t.dtype.name != "variant")
                  if b is not None)
    return tuple(sizes), scratch


def _body(graph: Any, op: Any) -> Any:
    """The loop body as a graph: a traced function's own FuncGraph, or one rebuilt from the FunctionDef
    of a graph that was imported (after Grappler)."""
    try:
        function = graph_function(graph, op.get_attr("body").name)
    except (ValueError, KeyError):
        return None
    if function is None:
        return None
    if hasattr(function, "graph"):
        return function.graph
    try:
        return function_def_graph(function.definition, [t.shape for t in op.inputs])
    except Exception:  # noqa: BLE001 - an unreadable body: the loop is reported as unsized
        return None


def _list_bytes(tensor: Any, count: int) -> int | None:
    """Bytes a TensorList loop var holds at the loop's end."""
    op = tensor.op
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    if op.type == "Placeholder":
        return 0  # passed through unchanged: the list the loop was given
    if op.type in ("TensorListPushBack", "TensorListSetItem"):
        element = op.inputs[-1]
        if element.op.type == "ReadVariableOp":
            return 0  # a variable's buffer, the same every iteration
        size = _bytes(element)
        return None if size is None else count * size
    if op.type in ("TensorListPopBack",):
        return 0  # the gradient loop empties the accumulators it reads
    return None


def function_ops(library: Any, ops: list) -> int:
    """Ops inside the functions the step's ops call (While/If bodies and conditions, PartitionedCall…),
    counted once per calling op and through nested calls. Each such call runs its function in an executor
    of its own (function.cc FunctionLibraryRuntime::Instantiate, one kernel per node of the FunctionDef),
    so its ops cost what the step's own ops cost per op; `library` is a GraphDef's FunctionDefLibrary
    (after Grappler: the bodies as the runtime instantiates them, e.g. "…while_body_587_rewritten")."""
    defs = {f.signature.name: f for f in library.function}
    memo: dict[str, int] = {}

    def inside(name: str, path: tuple[str, ...]) -> int:
        if name in path or name not in defs:
            return 0  # recursion, or a function not in the library
        if name not in memo:
            nodes, signature = defs[name].node_def, defs[name].signature
            # the instantiated body also holds an _Arg per input and a _Retval per output (function_body.cc)
            own = len(nodes) + len(signature.input_arg) + len(signature.output_arg)
            memo[name] = own + sum(inside(f, path + (name,)) for node in nodes for f in _called(node.attr))
        return memo[name]

    return sum(inside(f, ()) for op in ops for f in _called(op.node_def.attr))


def _called(attrs: Any) -> list[str]:
    """Function names an op's attributes name (func and list(func) attributes)."""
    names = []
    for value in attrs.values():
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names
