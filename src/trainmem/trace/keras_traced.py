"""What tracing a Keras model's training step on TensorFlow yields (trace/keras_graph.py), in types that
need no TensorFlow: the targets (targets/tf_cpu.py, targets/tf_gpu.py) and the report read these."""

from __future__ import annotations

import dataclasses

from trainmem.trace.events import Trace


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
class KerasTraced:
    """A Keras model's `fit` step traced as TensorFlow's executor runs it.

    `trace` holds storages with Category/Phase, module = the Keras layer whose call made the op ("" for
    the loss, optimizer and metric ops outside layers), op = the TensorFlow op type. Variables (weights,
    optimizer slots, the iteration counter, metric totals) are storages allocated in Phase.INIT."""

    trace: Trace
    parameters: int  # model.count_params()
    trainable_parameters: int
    optimizer_slot_bytes: int  # every optimizer variable: per-parameter slots and its scalars
    layers: tuple[LayerRow, ...]
    op_counts: dict[str, int]  # op type -> ops of the step (one step)
    unsupported_ops: dict[str, int]  # op types traced by size alone: no rule says how they hold memory
    order: str  # the executor order assumed, in words
    warnings: list[str]
    model_name: str = ""
    input_bytes: int = 0  # one batch (x and y)
    buffer_bytes: int = 0  # non-trainable weights and metric variables
    runtime_graph: str = "unoptimized"  # "grappler" when the trace follows the graph after Grappler's passes
    jit_compile_on_gpu: bool = False  # what Keras's jit_compile="auto" picks where a GPU is present
    function_ops: int = 0  # ops inside the functions step ops call (While bodies…), not in op_counts
