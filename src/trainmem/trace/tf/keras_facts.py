"""What tracing a Keras model's training step on TensorFlow yields (trace/tf/keras_graph.py) beside the TraceResult every
framework hands on, in types that need no TensorFlow: the TensorFlow targets and the Keras report read these."""

from __future__ import annotations

import dataclasses



@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One row of the Keras-style table: a layer as `model.summary()` lists it, with the bytes of its
    forward outputs that the step keeps for backward (its activations)."""

    name: str
    class_name: str
    output_shape: tuple  # as the layer's output (whole batch); a tuple of shapes for several outputs
    parameters: int
    activation_bytes: int


@dataclasses.dataclass(frozen=True)
class KerasFacts:
    """What only a Keras trace knows, beside the TraceResult every framework hands on (trace/traced.py):
    `TraceResult.framework` of a Keras model's `fit` step traced as TensorFlow's executor runs it.

    The TraceResult's `trace` holds storages with Category/Phase, module = the Keras layer whose call made the op
    ("" for the loss, optimizer and metric ops outside layers), op = the TensorFlow op type. Variables (weights,
    optimizer slots, the iteration counter, metric totals) are storages allocated in Phase.INIT."""

    optimizer_slot_bytes: int  # every optimizer variable: per-parameter slots and its scalars
    layers: tuple[LayerRow, ...]
    unsupported_ops: dict[str, int]  # op types traced by size alone: no rule says how they hold memory
    order: str  # the executor order assumed, in words
    runtime_graph: str = "unoptimized"  # "grappler" when the trace follows the graph after Grappler's passes
    jit_compile_on_gpu: bool = False  # what Keras's jit_compile="auto" picks where a GPU is present
    function_ops: int = 0  # ops inside the functions step ops call (While bodies…), not in op_counts
