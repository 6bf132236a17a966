"""The step graph as TensorFlow runs it: after Grappler's passes (tensorflow/core/grappler/optimizers/
meta_optimizer.cc: pruning, constant folding, arithmetic and dependency optimizers, remapper…), which a
tf.function's graph goes through before its executor is built. On the CPU the remapper fuses MatMul +
BiasAdd (+ Relu) into _FusedMatMul and Conv2D + BiasAdd (+ Relu) into _FusedConv2D, and the dependency
optimizer removes the IdentityN that Keras puts over the gradients; those rewrites change which buffers
exist. TensorFlow objects come from the caller; nothing is imported here but what it hands over.

tensorflow.python.grappler.tf_optimizer.OptimizeGraph runs the same meta optimizer on a MetaGraphDef
whose "train_op" collection names what must be kept (here every stateful op of the step and its outputs),
with the nodes placed on the CPU (the remapper only fuses nodes placed on a device it knows).
"""

from __future__ import annotations

import heapq
from typing import Any

from trainmem.trace.tf.private import grappler_optimize

CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
FUNCTIONAL_LOOPS = ("While", "StatelessWhile")


def optimized_step(tf: Any, graph: Any, step_ops: list, keep: list) -> tuple[Any, list] | str:
    """(the optimized graph, its step ops in the creation order of the ops they come from), or why not."""
    def configure(meta: Any) -> None:
        for node in meta.graph_def.node:
            node.device = node.device or CPU
            if node.op in FUNCTIONAL_LOOPS:
                # keep the loop functional: lowered to Enter/Merge/Switch/Exit frames (lower_functional_ops.cc,
                # as the runtime does), its ops would run once per iteration, which a straight replay cannot
                # follow; trace/tf/while_loops.py sizes the functional loop from its body instead
                node.attr["_lower_using_switch_merge"].b = False
        meta.collection_def["train_op"].node_list.value.extend(sorted({op.name for op in keep}))

    try:
        optimized = grappler_optimize(graph.as_graph_def(), configure)
        runtime = tf.Graph()
        with runtime.as_default():
            tf.graph_util.import_graph_def(optimized, name="")
    except Exception as error:  # noqa: BLE001 - Grappler's own failure: the unoptimized graph is traced
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    before = {op.name for op in graph.get_operations()}
    created = {op.name: index for index, op in enumerate(step_ops)}
    ops = [op for op in runtime.get_operations() if op.name in created or op.name not in before]
    if any(op.type in ("Enter", "Exit") for op in ops):
        return "it lowered a loop to control-flow frames"
    ordered = _creation_order(ops, created)
    return runtime, ordered if _topological(ordered) else ops


def _creation_order(ops: list, created: dict[str, int]) -> list:
    """A topological order that follows the creation order of the ops they come from wherever the
    optimized graph's edges allow (Kahn's algorithm, the ready op made first runs first); an op Grappler
    made is keyed right after its last input."""
    names = {op.name for op in ops}
    key: dict[str, float] = {}
    for op in ops:  # Grappler's own order is topological: inputs are keyed first
        if op.name in created:
            key[op.name] = created[op.name]
        elif op.inputs:
            key[op.name] = max(key.get(t.op.name, -1.0) for t in op.inputs) + 0.5
    consumers_of: dict[str, list[str]] = {}
    for op in ops:
        for tensor in op.inputs:
            consumers_of.setdefault(tensor.op.name, []).append(op.name)
    for op in reversed(ops):  # a new op without inputs (a folded constant) goes just before its first consumer
        if op.name not in key:
            key[op.name] = min((key.get(c, float(len(created))) for c in consumers_of.get(op.name, [])),
                               default=float(len(created))) - 0.5
    waiting = {op.name: len({t.op.name for t in op.inputs if t.op.name in names}
                            | {c.name for c in op.control_inputs if c.name in names}) for op in ops}
    consumers: dict[str, list] = {}
    for op in ops:
        for producer in {t.op.name for t in op.inputs} | {c.name for c in op.control_inputs}:
            if producer in names:
                consumers.setdefault(producer, []).append(op)
    position = {op.name: index for index, op in enumerate(ops)}
    ready = [(key[op.name], index, op) for index, op in enumerate(ops) if waiting[op.name] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, _, op = heapq.heappop(ready)
        order.append(op)
        for consumer in consumers.get(op.name, []):
            waiting[consumer.name] -= 1
            if waiting[consumer.name] == 0:
                heapq.heappush(ready, (key[consumer.name], position[consumer.name], consumer))
    return order if len(order) == len(ops) else ops


def _topological(ops: list) -> bool:
    seen: set[str] = set()
    names = {op.name for op in ops}
    for op in ops:
        if any(t.op.name in names and t.op.name not in seen for t in op.inputs):
            return False
        seen.add(op.name)
    return True


def stateful(op: Any) -> bool:
    try:
        return bool(op.op_def.is_stateful)
    except AttributeError:
        return False
