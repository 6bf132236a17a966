"""What tracing a training run yields (trace/run.py for PyTorch), in types that need no torch."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from trainmem.trace.events import Trace


@dataclasses.dataclass(frozen=True)
class TraceResult:
    """A traced run as the assembler reads it: the Trace and the model's facts the report needs.
    Built by keyword; a recorder for another framework builds the same value."""

    trace: Trace
    parameters: int
    trainable_parameters: int
    module_parameters: dict[str, int]  # module path -> parameter elements (own, not recursive)
    op_counts: Counter
    warnings: list[str]
    checkpointed: list[str]
    model_name: str
    output_elements: dict[str, int]  # module -> output elements of its first forward (whole batch)
    parameter_modules: set[str]  # module paths that own parameters
    trainable_shapes: list[tuple[int, ...]]  # shape of each trainable parameter (tied ones once)
    leaf_modules: set[str]  # modules without children (the layers a torchinfo-style summary lists)
    buffer_bytes: int  # the model's buffers
    input_bytes: int  # one batch as the first step made it
    quantized_parameters: int = 0  # parameters stored in 4 bits (QLoRA), counted as the model counts them
    adapter_parameters: int = 0  # parameters LoRA added (included in `parameters`)
    quantized_storage_bytes: int = 0  # their packed storage with its quantization statistics
    libraries: tuple[str, ...] = ()  # the libraries the model is built from (frontends/libraries.py)
    code_libraries: tuple[str, ...] = ()  # those whose code runs between its ops (frontends/libraries.py)
    resolved: dict[str, Any] = dataclasses.field(default_factory=dict)  # setup values actually used
    parallel_notes: list[str] = dataclasses.field(default_factory=list)  # many ranks: what the strategies assumed
    # what only the recording framework knows, for its target and report: None for PyTorch; Keras on TensorFlow's
    # trace/tf/keras_facts.py KerasFacts (layer table, optimizer slots, the executor order assumed)
    framework: Any = None
    # what the trace cache did for this trace (trace/cache_store.py CacheUse): not part of the trace's value
    cache_use: Any = dataclasses.field(default=None, compare=False)
