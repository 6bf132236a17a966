"""Every private PyTorch API trainmem uses, imported here and nowhere else (torch 2.13), so that a
torch upgrade that moves one breaks in one place."""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings

import torch
from torch._subclasses.fake_tensor import (  # noqa: F401 - re-exported
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401 - re-exported
from torch.utils._python_dispatch import _disable_current_modes as disable_current_modes  # noqa: F401 - parallel/ddp.py
from torch.utils._pytree import tree_leaves  # noqa: F401 - re-exported

FAKE_TENSOR_LOG = logging.getLogger("torch._subclasses.fake_tensor")
# an op on fake tensors whose answer needs values (.item(), nonzero, an op without a meta kernel)
FAKE_LIMITATIONS = (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException)


def module_tensor_tables(module: torch.nn.Module) -> tuple[dict, dict]:
    """A module's own parameter and buffer tables (name → tensor or None), to replace entries in place:
    `_parameters` and `_buffers` are what register_parameter/register_buffer fill."""
    return module._parameters, module._buffers


def is_view(tensor: torch.Tensor) -> bool:
    """Whether the tensor is a view of another's storage (autocast's cast cache skips views)."""
    return tensor._is_view()


def schema_arguments(op) -> list:
    """An OpOverload's schema arguments (name, kwarg_only), from its private `_schema`."""
    return op._schema.arguments


def destroy_library(library: torch.library.Library) -> None:
    """Remove the kernels a torch.library.Library registered (torch has no public unregister)."""
    library._destroy()


def rnn_kernels():
    """torch._VF, the ATen entry points of nn.LSTM / nn.GRU: `.lstm(...)` and `.gru(...)`."""
    return torch._VF


def current_autograd_node():
    """The autograd Node executing now in backward, or None (in forward)."""
    return torch._C._current_autograd_node()


def sequence_nr(node) -> int:
    """A Node's sequence number: the same as the forward op that created it."""
    return node._sequence_nr()


def profiler_memory_events(prof) -> list[tuple[int, int]]:
    """(start_ns, signed nbytes) of every CPU [memory] event a torch.profiler run recorded. The kineto
    results object is not a public API; the events include allocations made inside kernels."""
    return [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]


def profiler_memory_events_threads(prof) -> list[tuple[int, int, int]]:
    """The same with the profiler's id of the thread that made each event (measure/dist_child.py: gloo
    allocates on its worker threads)."""
    return [(e.start_ns(), e.nbytes(), e.start_thread_id()) for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]


# ---- dispatcher internals for CUDA autocast on a CPU trace (trace/cuda_autocast.py) ----
def call_as_fallthrough(op, args: tuple, kwargs: dict):
    """Call `op` as if its AutocastCPU kernel were a fallthrough: a composite op is decomposed with
    autocast still on (its inner ops meet autocast again); any other op runs with AutocastCPU excluded,
    which is the same for a kernel that calls no autocast-listed op."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), torch._C.DispatchKey.CompositeImplicitAutograd):
        return op.decompose(*args, **kwargs)
    with exclude_autocast_cpu():
        return op(*args, **kwargs)


def exclude_autocast_cpu():
    """What autocast's C++ wrapper does around the op it calls: ExcludeDispatchKeyGuard(AutocastCPU)."""
    return torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU))


@functools.cache
def _ops_with_kernel(key: str) -> frozenset[str]:
    names = set()
    for name in torch._C._dispatch_get_all_op_names():
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            names.add(name[len("aten::"):])
    return frozenset(names)


def ops_with_kernel(key: str) -> set[str]:
    """aten op names ('linear', 'pow.Scalar') with a kernel registered for dispatch key `key`."""
    return set(_ops_with_kernel(key))


@contextlib.contextmanager
def quiet_kernel_override():
    """Registering a Python kernel over a C++ one warns once per op; the override is deliberate."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def device_constructors() -> set:
    """The torch functions that take a `device=` and allocate: what `with torch.device(...)` redirects
    when no device is given (torch.utils._device)."""
    from torch.utils._device import _device_constructors

    return _device_constructors()


# ---- the fake process group (parallel/world.py) ----
def fake_store():
    """The in-memory store of the "fake" process-group backend: every collective returns at once without
    touching data (torch.testing._internal.distributed.fake_pg, which also registers the backend)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def flatten_mesh(mesh, name: str):
    """A multi-dimensional DeviceMesh as one dimension (DeviceMesh._flatten, what FSDP2's HSDP uses itself)."""
    return mesh._flatten(name)


# ---- wrapper subclasses (DTensor) and storage resizes, for the per-rank trace (trace/distributed.py) ----
from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402,F401 - re-exported


def storage_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold a tensor's storage: a wrapper subclass (DTensor: its local shard) is
    flattened through __tensor_flatten__, recursively; a plain or fake tensor is itself."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    inner = [getattr(tensor, name) for name in names]
    return [leaf for value in inner if isinstance(value, torch.Tensor) for leaf in storage_tensors(value)]


@contextlib.contextmanager
def storage_resizes_reported(callback):
    """While open, every `UntypedStorage.resize_` (FSDP2 frees and re-allocates unsharded parameters this way,
    torch/distributed/fsdp/_fully_shard/_fsdp_common.py free_storage / alloc_storage; no dispatcher op sees
    it) calls `callback(storage)` after resizing. Undone at exit."""
    original = torch.UntypedStorage.resize_

    def resize_(self, size):
        result = original(self, size)
        callback(self)
        return result

    torch.UntypedStorage.resize_ = resize_
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original


@contextlib.contextmanager
def dtensor_shape_propagation_muted(recorder):
    """DTensor works out an op's global output shape by running the op on throw-away fake tensors of the
    global shapes (torch/distributed/tensor/_sharding_prop.py _propagate_tensor_meta_non_cached), inside
    `ShardingPropagator._fake_mode_lock` (a nullcontext by default). Those tensors are no rank's memory:
    the lock is replaced by a context that mutes the recorder while it is held. Undone at exit."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    class _Muted:
        def __init__(self):
            self.before: list[bool] = []

        def __enter__(self):
            self.before.append(recorder.muted)
            recorder.muted = True

        def __exit__(self, *exc):
            recorder.muted = self.before.pop()

    original = ShardingPropagator._fake_mode_lock
    ShardingPropagator._fake_mode_lock = _Muted()
    try:
        yield
    finally:
        ShardingPropagator._fake_mode_lock = original


def is_wrapper_subclass(tensor: torch.Tensor) -> bool:
    """A tensor subclass that wraps others (DTensor) rather than holding a storage of its own."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return is_traceable_wrapper_subclass(tensor)


def clear_dtensor_caches() -> None:
    """DTensor caches each op's sharding decision, keyed by specs that compare meshes by shape and names, and the
    decision keeps the mesh it was made on (with that world's process-group names). A later fake world builds an
    equal mesh over new groups: the cached decision would name groups that no longer exist. Cleared when a fake
    world ends (torch.distributed.tensor.debug._clear_sharding_prop_cache, 'the recommended way')."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
