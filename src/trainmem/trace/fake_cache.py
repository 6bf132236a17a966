"""FakeTensorMode's dispatch cache, made safe for a memory trace, and fake tensors' data pointers. Private PyTorch
APIs are gathered here and in trace/torch_private.py only (tests/test_private_apis.py): this module holds the cache's
key and entry hooks, and `fake_data_pointers` (a storage's `_cdata` as its address).

FakeTensorMode caches each op's output metadata by (op, argument shapes, dtypes, ...) and, on a hit, makes the
outputs from the metadata instead of running the meta kernel again; that is most of an op's cost under fake
tensors (the traced step runs about twice as fast with it). Two things make a plain cache wrong for us:

- a hit makes every output that is neither the op's in-place argument nor a view op's result on a storage of
  its own. A meta kernel that returns outputs sharing a storage (mkldnn_rnn_layer_backward's two bias
  gradients are one tensor) or an output on an input's storage without being a view op would then trace one
  way at the first call of a shape and another at the next: `TracingFakeTensorMode` refuses to cache such an
  op's result, so every call runs the meta kernel, as it does with the cache off;
- the cache is one dictionary shared by every FakeTensorMode in the process, so an entry another mode made
  (a user's torch.compile, a plain FakeTensorMode) would be served to ours without that check. Our keys carry
  a marker of their own, so only entries this mode checked are ever served to it.

The key itself is most of a hit's cost: FakeTensorMode flattens each tensor argument's metadata (TensorMetadata)
into the key value by value, each shape and stride element with its type (a fifth of a traced step's time on
Llama-3.1-70B ranks, 2026-12-07). Our keys hold a dense tensor's metadata as one tuple of the same fields instead
(`_tensor_key`, where TensorMetadata has the fields read below; other arguments as FakeTensorMode keys them): two
keys are equal exactly when FakeTensorMode's would be (tests/test_fake_cache.py holds the two to each other).

Higher-order operators are never cached here: their keys can hold objects hashed by id, which torch evicts
by the unmarked key. Where this torch's cache hooks are not the ones read below, `tracing_fake_mode()` returns
a FakeTensorMode with the cache off, which traces the same bytes, only slower. Checked with tests/test_fake_cache.py
on torch 2.13.0 and 2.14.1; the other supported releases were not run with it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from torch._prims_common import suggest_memory_format
from torch._subclasses import fake_tensor

from trainmem.trace.torch_private import FakeTensor, FakeTensorMode

_KEY_MARK = "trainmem: outputs checked for shared storages"
_TENSOR_MARK = "trainmem: dense fake tensor"  # a tensor argument's entry in our keys (_tensor_key)
# TensorMetadata's fields as torch 2.6-2.15 name them: _tensor_key covers these, for a strided tensor without
# symbolic sizes (is_sparse False, is_coalesced, dense_dim and sparse_dim None); another set turns it off
_METADATA_FIELDS = ("dtype", "shape", "stride", "device", "layout", "memory_format", "storage_offset", "storage_bytes",
                    "requires_grad", "is_quantized", "is_conj", "is_neg", "is_inference", "is_sparse", "is_coalesced",
                    "dense_dim", "sparse_dim")
_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})
# the signatures the overrides below are written against
_CACHE_KEY_PARAMETERS = ("self", "state", "func", "args", "kwargs")
_ENTRY_PARAMETERS = ("self", "state", "key", "func", "args", "kwargs", "output")


@functools.cache  # probed once a process: every rank trace of a plan asks
def _has_cache_hooks() -> bool:
    if not all(hasattr(fake_tensor, name) for name in ("_DispatchCacheKey", "_BypassDispatchCache")):
        return False
    hooks = {"_cache_key": _CACHE_KEY_PARAMETERS, "_make_cache_entry": _ENTRY_PARAMETERS}
    return all(tuple(inspect.signature(getattr(FakeTensorMode, name, None) or (lambda: None)).parameters) == names
               for name, names in hooks.items())


@functools.cache
def _has_fast_keys() -> bool:
    """Whether this torch's TensorMetadata is the one _tensor_key covers and its argument flattening is hookable."""
    import dataclasses

    metadata = getattr(fake_tensor, "TensorMetadata", None)
    names = tuple(field.name for field in dataclasses.fields(metadata)) if dataclasses.is_dataclass(metadata) else ()
    prep = getattr(FakeTensorMode, "_prep_args_for_hash", None)
    return names == _METADATA_FIELDS and prep is not None and \
        tuple(inspect.signature(prep).parameters)[:4] == ("self", "result", "args", "state")


def _storage_ids(values) -> set[int]:
    ids = set()
    for value in values:
        if isinstance(value, torch.Tensor):
            ids.add(id(value.untyped_storage()))
        elif isinstance(value, (list, tuple)):
            ids |= _storage_ids(value)
    return ids


def shares_storage_unlike_a_hit(func, args, kwargs, output) -> bool:
    """Whether an op's fresh output shares a storage the way a cache hit would not rebuild it: two outputs on
    one storage, or an output on an input's storage that is neither the in-place argument itself (a hit
    returns that argument) nor the result of a view op (a hit views the input again)."""
    if getattr(func, "is_view", False):
        return False
    outputs = [out for out in (output if isinstance(output, tuple) else (output,)) if isinstance(out, torch.Tensor)]
    inputs = _storage_ids(args) | _storage_ids(kwargs.values())
    seen: set[int] = set()
    for out in outputs:
        if any(out is arg for arg in args):
            continue
        storage = id(out.untyped_storage())
        if storage in seen or storage in inputs:
            return True
        seen.add(storage)
    return False


class TracingFakeTensorMode(FakeTensorMode):
    """FakeTensorMode whose dispatch cache serves only entries it checked (the module docstring says why)."""

    def _cache_key(self, state, func, args, kwargs):
        if isinstance(func, torch._ops.HigherOrderOperator):
            raise fake_tensor._BypassDispatchCache("trainmem: higher-order operator")
        key = super()._cache_key(state, func, args, kwargs)
        return fake_tensor._DispatchCacheKey((_KEY_MARK, *key.key))

    def _prep_args_for_hash(self, result, args, state, *rest):
        """FakeTensorMode's flattening of the arguments into the key, with each dense fake tensor one tuple
        (_tensor_key) and plain values kept as they are; anything else FakeTensorMode's own way."""
        if not isinstance(args, (list, tuple)) or not _has_fast_keys():
            return super()._prep_args_for_hash(result, args, state, *rest)
        result.append(type(args))
        result.append(len(args))
        for arg in args:
            kind = type(arg)
            if kind in _PLAIN:
                result.append(kind)
                result.append(arg)
            elif isinstance(arg, FakeTensor) and arg.layout == torch.strided and not arg._has_symbolic_sizes_strides:
                result.append(self._tensor_key(arg))
            elif kind is list or kind is tuple or kind is torch.Size:
                self._prep_args_for_hash(result, arg, state, *rest)
            else:
                super()._prep_args_for_hash(result, (arg,), state, *rest)
        return None

    def _tensor_key(self, tensor) -> tuple:
        """extract_tensor_metadata's fields of a strided fake tensor, as one tuple (its bypasses kept)."""
        if not self.is_our_fake(tensor):
            raise fake_tensor._BypassDispatchCache("not our fake")
        if tensor.constant is not None:
            raise fake_tensor._BypassDispatchCache("constant attribute")
        memory_format = suggest_memory_format(tensor)
        if not tensor.is_contiguous(memory_format=memory_format):
            memory_format = None
        return (_TENSOR_MARK, tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.device, memory_format,
                tensor.storage_offset(), tensor.untyped_storage().nbytes(), tensor.requires_grad,
                tensor.is_quantized, tensor.is_conj(), tensor.is_neg(), tensor.is_inference())

    def _make_cache_entry(self, state, key, func, args, kwargs, output):
        entry = super()._make_cache_entry(state, key, func, args, kwargs, output)
        if shares_storage_unlike_a_hit(func, args, kwargs, output):
            raise fake_tensor._BypassDispatchCache("trainmem: outputs share a storage")
        return entry


def uncached_fake_mode() -> FakeTensorMode:
    """A FakeTensorMode with its dispatch cache off: every op runs its meta kernel (the trace before the checked
    cache, and its reference in tests/test_fake_cache.py)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    mode.cache_enabled = False
    return mode


def tracing_fake_mode() -> FakeTensorMode:
    """The FakeTensorMode a trace runs under: the checked cache where this torch has its hooks, else none."""
    return TracingFakeTensorMode(allow_non_fake_inputs=True) if _has_cache_hooks() else uncached_fake_mode()


@contextlib.contextmanager
def fake_data_pointers():
    """While open, a fake tensor's `data_ptr()` and its storage's are the storage's own address (its StorageImpl,
    `_cdata`, unique while it lives) plus the tensor's offset, and 0 for an empty storage, as a real tensor's are.
    Fake storages live on the meta device, whose pointers are all 0: FSDP1 compares storages by pointer
    (torch/distributed/fsdp/_flat_param.py _same_storage, _data_ptr_allocated; _runtime_utils.py
    _catch_all_reshard), and with every pointer 0 it takes every storage for the same one and every freed one for
    allocated (SHARD_GRAD_OP with use_orig_params then fails an assertion in backward)."""
    storage_pointer = torch.UntypedStorage.data_ptr
    had_own = "data_ptr" in FakeTensor.__dict__
    tensor_pointer = FakeTensor.__dict__.get("data_ptr")

    def storage_data_ptr(self) -> int:
        if self.device.type != "meta":
            return storage_pointer(self)
        return self._cdata if self.nbytes() else 0

    def tensor_data_ptr(self) -> int:
        base = storage_data_ptr(self.untyped_storage())
        return base + self.storage_offset() * self.element_size() if base else 0

    torch.UntypedStorage.data_ptr = storage_data_ptr
    FakeTensor.data_ptr = tensor_data_ptr
    try:
        yield
    finally:
        torch.UntypedStorage.data_ptr = storage_pointer
        if had_own:
            FakeTensor.data_ptr = tensor_pointer
        else:
            del FakeTensor.data_ptr
