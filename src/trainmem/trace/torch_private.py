"""Every private PyTorch API trainmem uses, imported here and nowhere else, so that a torch upgrade that moves one breaks
in one place.

Checked against the sources of torch 2.6.0, 2.7.0, 2.8.0, 2.9.0, 2.10.0, 2.11.0, 2.12.0, 2.13.0 and 2.15.0: every name
imported at the top of this module is in all of them (FakeStore moved to C++ in 2.15 and is re-exported where it was).
Three internals moved within that range; each is probed once, on first use (importing torch.distributed.tensor costs
seconds, so not at trainmem's import), and served by the first way this torch has, named in `private_api_ways()`:

- clearing DTensor's sharding-decision cache (`clear_dtensor_caches`): torch.distributed.tensor.debug.
  _clear_sharding_prop_cache from 2.11; before it (2.6-2.10) the propagator's own lru cache,
  `DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding` (`.cache_clear()` from 2.10, `.cache.cache_clear()`
  of its thread-local LocalLRUCache before), and the C++ fast path's cache where torch._C has
  `_clear_DTensor_sharding_propagator_cache` (2.10 on); and on every torch the redistribute plans' cache, which none of
  those clears (`_clear_redistribute_plans`);
- muting DTensor's global-shape fake ops (`dtensor_shape_propagation_muted`): `ShardingPropagator._fake_mode_lock` from
  2.12; before it (2.6-2.11) `_propagate_tensor_meta_non_cached` itself is wrapped;
- counting a pipeline stage's micro-batches in flight (`pipeline_chunks_in_flight`): PipelineStage.fwd_cache up to 2.14,
  `_forward_chunk_states` from 2.15 (probed on the first stage, where the attribute lives, so neither in
  `private_api_ways()` nor refused before the trace).

A torch with neither way refuses in one line (TorchVersionError), before any rank is traced; so does a layout this torch
cannot trace for other reasons (require_torch_for: FSDP, ZeRO, DDP and pipelines need torch 2.7, HSDP 2.8, found by
tracing each strategy on 2.6.0, 2.7.0, 2.8.0 and 2.13.0)."""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import warnings
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException  # noqa: F401
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, UnsupportedOperatorException  # noqa: F401
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes as disable_current_modes  # noqa
from torch.utils._pytree import tree_leaves, tree_map  # noqa: F401 - re-exported

from trainmem.errors import TorchVersionError, TrainmemError

FAKE_TENSOR_LOG = logging.getLogger("torch._subclasses.fake_tensor")
# an op on fake tensors whose answer needs values (.item(), nonzero, an op without a meta kernel)
FAKE_LIMITATIONS = (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException)


@contextlib.contextmanager
def torch_function_modes_off():
    """No TorchFunctionMode (the meta device's, MetaEverywhere) sees what runs inside: torch._dynamo's import makes and
    reads tensors, which fails on meta. Popped, not disabled: torch 2.8's import asserts a mode of its own saw calls."""
    popped = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
    try:
        yield
    finally:
        for mode in reversed(popped):
            torch._C._push_on_torch_function_stack(mode)


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


def sequence_nr(node=None) -> int:
    """A Node's sequence number (the forward op's that made it); with none, the one this thread's next Node takes
    (torch/csrc/autograd/function.h: a Node is numbered as it is made, before its op's kernel runs)."""
    return node._sequence_nr() if node is not None else torch._C._autograd._get_sequence_nr()


def profiler_memory_events_threads(prof) -> list[tuple[int, int, int]]:
    """(start_ns, signed nbytes, thread id) of every CPU [memory] event a torch.profiler run recorded (gloo allocates
    on its worker threads). The kineto results object is not a public API; the events include kernels' own."""
    return [(e.start_ns(), e.nbytes(), e.start_thread_id()) for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]


def profiler_memory_events(prof) -> list[tuple[int, int]]:
    """profiler_memory_events_threads without the thread."""
    return [(start, nbytes) for start, nbytes, _ in profiler_memory_events_threads(prof)]


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
    """The torch functions that take a `device=` and allocate: what `with torch.device(...)` redirects when no
    device is given (torch.utils._device)."""
    from torch.utils._device import _device_constructors

    return _device_constructors()


# ---- the fake process group (parallel/world.py) ----
def fake_store(layout=None):
    """The in-memory store of the "fake" process-group backend: every collective returns at once without
    touching data (torch.testing._internal.distributed.fake_pg, which also registers the backend). A fake
    world starts here, so what its traces need of this torch is checked here too (the DTensor internals, the
    layout's strategy: require_torch_for): a torch without it refuses before any rank is traced."""
    _sharding_cache_clearing()
    _shape_propagation_muting()
    if layout is not None:
        require_torch_for(layout)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore()


def flatten_mesh(mesh, name: str):
    """A multi-dimensional DeviceMesh as one dimension (DeviceMesh._flatten, what FSDP2's HSDP uses itself)."""
    return mesh._flatten(name)


# ---- wrapper subclasses (DTensor) and storage resizes, for the per-rank trace (parallel/rank_trace.py) ----
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
    """DTensor works out an op's global output shape by running the op on throw-away fake tensors of the global shapes
    (torch/distributed/tensor/_sharding_prop.py _propagate_tensor_meta_non_cached). Those tensors are no rank's memory:
    the recorder is muted while that runs (the way this torch allows, _shape_propagation_muting). Undone at exit."""
    _, mute = _shape_propagation_muting()
    with mute(recorder):
        yield


class _Muted:
    """A context that mutes the recorder while open, re-entrant."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.before: list[bool] = []

    def __enter__(self):
        self.before.append(self.recorder.muted)
        self.recorder.muted = True

    def __exit__(self, *exc):
        self.recorder.muted = self.before.pop()


@contextlib.contextmanager
def _mute_by_lock(recorder):
    """torch 2.12 on: the propagation runs inside `ShardingPropagator._fake_mode_lock` (a nullcontext by
    default, meant for a threading.Lock), which is replaced by a context that mutes the recorder."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = ShardingPropagator._fake_mode_lock
    ShardingPropagator._fake_mode_lock = _Muted(recorder)
    try:
        yield
    finally:
        ShardingPropagator._fake_mode_lock = original


@contextlib.contextmanager
def _mute_by_wrapping(recorder):
    """torch 2.6-2.11 (no lock): `_propagate_tensor_meta_non_cached` itself is wrapped; its cached callers look it
    up on the instance, so they reach the wrapper."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = ShardingPropagator.__dict__["_propagate_tensor_meta_non_cached"]

    @functools.wraps(original)
    def muted(self, *args, **kwargs):
        with _Muted(recorder):
            return original(self, *args, **kwargs)

    ShardingPropagator._propagate_tensor_meta_non_cached = muted
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original


def is_wrapper_subclass(tensor: torch.Tensor) -> bool:
    """A tensor subclass that wraps others (DTensor) rather than holding a storage of its own."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return is_traceable_wrapper_subclass(tensor)


def clear_dtensor_caches() -> None:
    """DTensor caches each op's sharding decision, keyed by specs that compare meshes by shape and names, and the
    decision keeps the mesh it was made on (with that world's process-group names). A later fake world builds an
    equal mesh over new groups: the cached decision would name groups that no longer exist. Cleared when a fake
    world ends, the way this torch allows (_sharding_cache_clearing)."""
    _, clear = _sharding_cache_clearing()
    clear()
    _clear_redistribute_plans()


def _clear_redistribute_plans() -> None:
    """DTensor's redistribute plans (_redistribute._gen_transform_infos, a functools cache in torch 2.6-2.15 that
    no clearing of torch's own empties) keep the placement objects of the world they were planned in. On torch
    2.8 (and older) an embedding's _MaskPartial placement carries the mask its lookup fills: a later world's plan
    from the cache reduces with the old placement, whose mask was never filled (AssertionError in _reduce_value:
    every tensor-parallel Llama after the first trace of a process, plan's layouts)."""
    from torch.distributed.tensor import _redistribute

    plans = getattr(_redistribute, "_gen_transform_infos", None)
    if hasattr(plans, "cache_clear"):
        plans.cache_clear()


def _clear_propagator_cache() -> None:
    """torch 2.6-2.10: what _clear_sharding_prop_cache does from 2.11, by hand. The Python cache is an lru_cache
    behind a thread-local LocalLRUCache (`.cache_clear()` from 2.10, `.cache.cache_clear()` before); 2.10 adds
    a C++ fast path with a cache of its own."""
    from torch.distributed.tensor import DTensor

    cache = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding
    (cache.cache_clear if hasattr(cache, "cache_clear") else cache.cache.cache_clear)()
    fast = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if fast is not None:
        fast()


def pipeline_chunks_in_flight(stage) -> int:
    """Micro-batches whose forward ran on this PipelineStage and whose backward has not: the entries of the stage's
    forward cache (outputs and inputs kept for backward), named as this torch names it (_pipeline_forward_cache)."""
    return len(getattr(stage, _pipeline_forward_cache(stage)))


# ---- probes: which way each moved private use takes on this torch, decided once ----
MULTI_RANK = "tracing the ranks of a multi-GPU layout (--strategy, --dp, --tp, --pp, plan)"
OLDEST_TORCH = (2, 6)  # the oldest torch whose sources were checked (module docstring), pyproject's floor


def torch_release(version: str | None = None) -> tuple[int, ...]:
    """(2, 8, 0) for "2.8.0+cu128" (this torch's when no version is given)."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version or torch.__version__)
    return tuple(int(part) for part in found.groups(default="0")) if found else (0, 0, 0)


def torch_refusal(feature: str, lacking: str) -> TorchVersionError:
    """'… needs torch >= 2.6 (this is torch 2.4.1: …)' below the oldest checked torch; on a newer torch than any
    checked, the way it lacks is named instead."""
    oldest = ".".join(map(str, OLDEST_TORCH))
    if torch_release()[:2] < OLDEST_TORCH:
        return TorchVersionError(f"{feature} needs torch >= {oldest} (this is torch {torch.__version__}: {lacking})")
    return TorchVersionError(f"{feature} needs a torch with {lacking}, as torch {oldest} to 2.15 have "
                             f"(this is torch {torch.__version__})")


@functools.cache
def _sharding_cache_clearing() -> tuple[str, Callable[[], None]]:
    """(the way's name, the function) that clears DTensor's sharding caches on this torch."""
    import torch.distributed.tensor.debug as debug

    if hasattr(debug, "_clear_sharding_prop_cache"):
        return "torch.distributed.tensor.debug._clear_sharding_prop_cache", debug._clear_sharding_prop_cache
    from torch.distributed.tensor import DTensor

    propagator = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    cache = getattr(propagator, "propagate_op_sharding", None)
    if hasattr(cache, "cache_clear") or hasattr(getattr(cache, "cache", None), "cache_clear"):
        return "DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding (cleared by hand)", \
            _clear_propagator_cache
    raise torch_refusal(MULTI_RANK, "a way to clear DTensor's sharding cache "
                        "(torch.distributed.tensor.debug._clear_sharding_prop_cache)")


@functools.cache
def _shape_propagation_muting() -> tuple[str, Callable]:
    """(the way's name, a context manager taking the recorder) that mutes DTensor's global-shape fake ops."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    if hasattr(ShardingPropagator, "_fake_mode_lock"):
        return "ShardingPropagator._fake_mode_lock", _mute_by_lock
    if callable(ShardingPropagator.__dict__.get("_propagate_tensor_meta_non_cached")):
        return "ShardingPropagator._propagate_tensor_meta_non_cached (wrapped)", _mute_by_wrapping
    raise torch_refusal(MULTI_RANK, "DTensor's ShardingPropagator._propagate_tensor_meta_non_cached")


# PipelineStage's per-micro-batch forward cache (torch/distributed/pipelining/stage.py), set in __init__: `fwd_cache`
# to 2.14, `_forward_chunk_states` from 2.15; dicts keyed by chunk id, filled by forward_one_chunk, popped by backward
_PIPELINE_FORWARD_CACHES = ("fwd_cache", "_forward_chunk_states")
_PIPELINE_FORWARD_CACHE_NAME: dict[type, str] = {}  # stage class -> the name found on its first stage


def _pipeline_forward_cache(stage) -> str:
    """The forward cache's attribute name on this torch's stages, decided once per stage class on the first
    stage seen (an instance attribute: the class alone does not have it)."""
    known = _PIPELINE_FORWARD_CACHE_NAME.get(type(stage))
    if known is not None:
        return known
    for name in _PIPELINE_FORWARD_CACHES:
        if isinstance(getattr(stage, name, None), dict):
            _PIPELINE_FORWARD_CACHE_NAME[type(stage)] = name
            return name
    raise torch_refusal("--pp", "a forward cache on PipelineStage (fwd_cache; _forward_chunk_states from 2.15)")


# Layouts whose per-rank trace needs a later torch than the oldest supported one, found by tracing every strategy
# on torch 2.6.0, 2.7.0, 2.8.0 and 2.13.0 (2.8 and 2.13 give the same figures to the byte): torch 2.6's fake
# tensors have no kernel for c10d's collectives (c10d._allgather_base_, c10d.send: UnsupportedOperatorException)
# and its DistributedDataParallel takes no init_sync (parallel/ddp.py); on 2.7, HSDP's backward fails inside
# FSDP2 (an AssertionError). Tensor parallelism alone runs on 2.6. FSDP1 (fsdp1) fails on 2.6 the same way
# (c10d.allgather_, 2026-12-06) and runs on 2.13; 2.7 to 2.12, 2.14 and 2.15 were not run with it.
_C10D = "fake tensors have kernels for c10d's collectives from torch 2.7"
_DDP = "DistributedDataParallel takes init_sync from torch 2.7"
LATER_TORCH = {"ddp": ((2, 7), _DDP), "zero1": ((2, 7), _DDP), "zero2": ((2, 7), _C10D), "zero3": ((2, 7), _C10D),
               "fsdp": ((2, 7), _C10D), "fsdp1": ((2, 7), _C10D), "pp": ((2, 7), _C10D),
               "hsdp": ((2, 8), "on torch 2.7 HSDP's backward fails inside FSDP2, on 2.6 c10d's collectives")}


def require_torch_for(layout) -> None:
    """Refuse, in one line, a layout this torch cannot trace (LATER_TORCH): "--strategy fsdp needs torch >= 2.7
    (this is torch 2.6.0; …)"."""
    here, strategy = torch_release()[:2], str(layout.strategy)
    needs = [(f"--strategy {strategy}", *LATER_TORCH[strategy])] if strategy in LATER_TORCH and strategy != "pp" else []
    needs += [("--pp", *LATER_TORCH["pp"])] if layout.pp > 1 else []
    for flag, version, why in needs:
        if here < version:
            raise TorchVersionError(f"{flag} needs torch >= {'.'.join(map(str, version))} (this is torch "
                                    f"{torch.__version__}; {why})")


def private_api_ways() -> dict[str, str]:
    """Each probed private use and the way this torch serves it (a refusal's message where none does)."""
    out = {}
    for name, probe in (("clear_dtensor_caches", _sharding_cache_clearing),
                        ("dtensor_shape_propagation_muted", _shape_propagation_muting)):
        try:
            out[name] = probe()[0]
        except TrainmemError as refusal:
            out[name] = f"refused: {refusal}"
    return out
