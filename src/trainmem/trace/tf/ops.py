"""A TensorFlow graph as the lifetime model reads it: op records with plain shapes and names, built from a
tf.Graph by trace/tf/extract.py. No TensorFlow here, so the lifetime rules (trace/tf/lifetimes.py) are tested
on hand-made graphs."""

from __future__ import annotations

import dataclasses
import math

from trainmem.trace.events import Category, Phase

# bytes per element of TensorFlow's dtypes (tensorflow/core/framework/types.proto); resource handles and
# variants (TensorLists) hold no fixed bytes per element and are 0 here: a rule sizes them or they are reported
DTYPE_BYTES = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1, "complex64": 8, "complex128": 16,
    "resource": 0, "variant": 0, "string": 0,
}

ValueRef = tuple[str, int]  # (producing op's name, output index)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int | None, ...] | None  # None: unknown rank; None entries: unknown dimensions
    dtype: str

    @property
    def known(self) -> bool:
        return self.shape is not None and all(d is not None for d in self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 0)

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer; 0 where the shape is not known (the caller reports those)."""
        if not self.known:
            return 0
        return math.prod(self.shape) * self.itemsize  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class GraphOp:
    name: str
    type: str
    inputs: tuple[ValueRef, ...]
    outputs: tuple[TensorInfo, ...]
    phase: Phase
    module: str  # the Keras layer whose call created it ("" outside layers)
    control_inputs: tuple[str, ...] = ()
    attrs: tuple = ()  # (name, value) pairs kept for kernel calls: strides, padding, data_format…
    output_bytes: tuple = ()  # where a rule sized the outputs itself (while loops' TensorLists): bytes or None
    scratch_bytes: int = 0  # held while the op runs, gone after (a loop's per-iteration temporaries)


@dataclasses.dataclass(frozen=True)
class VariableInfo:
    """A resource variable the step reads or writes: a persistent buffer from before the step."""

    name: str  # the VarHandleOp's name: ReadVariableOp's input 0 names it
    shape: tuple[int, ...]
    dtype: str
    category: Category
    module: str  # the layer that owns it ("" for optimizer scalars and metrics)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES.get(self.dtype, 0)


@dataclasses.dataclass
class StepGraph:
    """The ops of one training step in the order assumed, and what lies outside it."""

    ops: list[GraphOp]
    variables: dict[str, VariableInfo]  # by handle name
    inputs: dict[str, TensorInfo]  # placeholder op name -> its tensor: the batch (Phase.INPUTS)
    constants: dict[str, TensorInfo]  # Const ops: their tensor is made once, when the kernel is built
    gradients: set[ValueRef] = dataclasses.field(default_factory=set)  # passed to the optimizer
    external: set[str] = dataclasses.field(default_factory=set)  # ops from before the step, neither variable nor input
