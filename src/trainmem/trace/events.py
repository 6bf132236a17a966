"""The trace: ordered alloc/free events over storages, with what each storage is for.

A storage's category can only be known after the fact (a forward output is an *activation* if it is
still alive when backward starts, a *temporary* if it died before; a backward output is a
*gradient* if it ends up in `param.grad`), so events point at a StorageRecord whose category the
recorder settles later. No torch here.
"""

from __future__ import annotations

import dataclasses
import enum


class Category(enum.StrEnum):
    PARAMETERS = "parameters"
    BUFFERS = "buffers"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"  # per-parameter buffers: momentum, exp_avg, exp_avg_sq…
    OPTIMIZER_SCALARS = "optimizer_scalars"  # 0-dim bookkeeping: Adam's step counts, GradScaler's scale
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    INPUTS = "inputs"
    RUNTIME = "runtime"  # allocations below the dispatcher: kernel scratch, workspaces
    COMMUNICATION = "communication"  # collective buffers: all-gather / reduce-scatter staging, DDP buckets
    CHECKPOINT = "checkpoint"  # a loaded checkpoint's tensors until they are copied in and dropped (--load)


class Phase(enum.StrEnum):
    INIT = "init"
    LOAD = "load"  # the checkpoint loaded before training (--load; trace/checkpoint_load.py)
    INPUTS = "inputs"
    FORWARD = "forward"
    LOSS = "loss"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    ZERO_GRAD = "zero_grad"


@dataclasses.dataclass
class StorageRecord:
    sid: int
    nbytes: int
    category: Category
    phase: Phase
    module: str
    op: str
    step: int
    dtype: str = ""
    shape: tuple[int, ...] = ()
    # the stream the storage was allocated on: 0 the default stream, n > 0 the n-th other stream selected when an
    # allocation was made (FSDP2's all-gather / reduce-scatter streams); the caching allocator keeps a block in
    # its allocation stream's pool (alloc/cuda_caching.py)
    stream: int = 0


@dataclasses.dataclass(frozen=True)
class Event:
    seq: int
    action: str  # "alloc" or "free"
    nbytes: int
    sid: int
    phase: Phase
    module: str
    op: str
    step: int


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    itemsize: int
    dtype: str
    contiguous: bool = True
    storage_key: int = 0  # id of the storage during the call: equal keys in one call share storage
    channels_last: bool = False  # a 4-d tensor in channels-last strides (convolution kernels keep that layout)


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """An op whose kernel a target may know to allocate below the dispatcher. Its outputs' alloc
    events are events[at_seq : at_seq + outputs_allocated]; args keep tensor metadata and plain values."""

    op: str
    at_seq: int
    outputs_allocated: int
    args: tuple
    outputs: tuple  # TensorMeta or None per output, in the op's output order
    output_sids: tuple  # sid per output (None when the output reused a storage)


@dataclasses.dataclass
class Trace:
    events: list[Event] = dataclasses.field(default_factory=list)
    storages: dict[int, StorageRecord] = dataclasses.field(default_factory=dict)
    kernel_calls: list[KernelCall] = dataclasses.field(default_factory=list)
    # storages a CUDA run would keep in host memory (the optimizers' step counters, unless fused)
    host_storages: set[int] = dataclasses.field(default_factory=set)
    # storages a CUDA run allocates outside PyTorch's caching allocator (paged optimizer state: managed memory)
    managed_storages: set[int] = dataclasses.field(default_factory=set)
    # many ranks with --offload: storages the strategy keeps in host RAM (also in host_storages)
    offloaded_storages: set[int] = dataclasses.field(default_factory=set)
    # the lean loop's trace only: where its names were bound and dropped (trace/loop_twin.py derives the inline
    # loop's trace from them); plain lists, [kind, position in events, phase, module, step, sids]
    loop_marks: list[list] = dataclasses.field(default_factory=list)
    # sid -> the module an allocation made outside every module was computed from (an optimizer temporary from
    # its parameter's state): what trace/block_compose.py attributes it to a repeated block by. Not cached.
    owner_hints: dict[int, str] = dataclasses.field(default_factory=dict, compare=False)
