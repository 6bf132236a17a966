"""The recorder: a TorchDispatchMode that sees every op's outputs and turns new storages into
alloc events, and a weak reference on each storage whose callback turns its death into a free event.

It sits *above* FakeTensorMode (entered after it), so `func(*args)` below returns fake tensors:
shapes, dtypes and storages exist, bytes do not. Autograd runs above both modes, so saved tensors
stay alive exactly as long as autograd keeps them, and free events come in the real order.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import Counter
from typing import Any

import torch

from trainmem.errors import TraceError
from trainmem.trace.compiled import compiled_trace_active
from trainmem.trace.events import Category, Event, KernelCall, Phase, StorageRecord, TensorMeta, Trace
from trainmem.trace.modules import FSDP1_WRAPPER, ModuleTracker
from trainmem.trace.rules import DataDependentRules
from trainmem.trace.torch_private import FakeTensor, TorchDispatchMode, schema_arguments, storage_tensors, tree_leaves

_PROVISIONAL = {
    Phase.INIT: Category.PARAMETERS, Phase.LOAD: Category.CHECKPOINT, Phase.INPUTS: Category.INPUTS, Phase.FORWARD: Category.ACTIVATIONS,
    Phase.LOSS: Category.ACTIVATIONS, Phase.BACKWARD: Category.TEMPORARIES,
    Phase.OPTIMIZER: Category.TEMPORARIES, Phase.ZERO_GRAD: Category.TEMPORARIES,
}


def _meta_of(values: Any) -> tuple:
    """Tensor metadata and plain values of an op's arguments, without holding the tensors."""
    out = []
    for value in values:
        if isinstance(value, torch.Tensor):
            contiguous = value.is_contiguous()
            out.append(TensorMeta(tuple(value.shape), value.element_size(), str(value.dtype).removeprefix("torch."),
                                  contiguous, id(value.untyped_storage()),
                                  not contiguous and value.dim() == 4
                                  and value.is_contiguous(memory_format=torch.channels_last)))
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            out.append(_meta_of(value))
        else:
            out.append(value)
    return tuple(out)


_DEVICE_QUERY = torch.ops.prim.device.default
_DEFAULT_CPU_STREAM = torch.cpu.current_stream()  # torch/cpu/__init__.py: _default_cpu_stream


@dataclasses.dataclass(frozen=True)
class _OpFacts:
    """What the recorder needs to know of an op, worked out at its first call."""

    name: str  # 'add' for aten.add.Tensor: the key of op_counts and of the kernel rules
    written: tuple[int | str, ...]  # where the arguments it writes in place are: position, or keyword name
    recorded_call: bool  # the target's kernel rules want to see its calls
    communication: bool = False  # a collective's op (c10d, _c10d_functional) or FSDP's copy-in/out (fsdp)


def _op_facts(func: Any, kernel_ops: frozenset[str]) -> _OpFacts:
    name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
    try:
        arguments = schema_arguments(func)
    except AttributeError:  # not an OpOverload (a higher-order operator): it writes nothing we track
        arguments = []
    written: list[int | str] = []
    for position, argument in enumerate(arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            written.append(argument.name if argument.kwarg_only else position)
    namespace = getattr(func, "namespace", "")
    if namespace == "c10d" and not written and arguments and not name.startswith("send"):
        # c10d's schemas mark no argument as written (torch/csrc/distributed/c10d/Ops.cpp); by its convention the
        # first argument is what the collective fills: allreduce_'s tensors, _allgather_base_'s output, recv_'s
        written = [0]
    return _OpFacts(name, tuple(written), name in kernel_ops, namespace in COMMUNICATION_NAMESPACES)


# The op namespaces of torch.distributed's collectives (torch/csrc/distributed/c10d/Ops.cpp: c10d;
# Functional.cpp: _c10d_functional) and of FSDP2's copy-in/out ops (torch/distributed/fsdp/_fully_shard/
# _fsdp_collectives.py registers the fsdp library): what they allocate are collective buffers.
COMMUNICATION_NAMESPACES = frozenset({"c10d", "_c10d_functional", "fsdp"})
# FSDP2's copy-out writes the all-gathered values into the unsharded parameters (_fsdp_collectives.py
# foreach_all_gather_copy_out): those storages are parameters, whenever FSDP re-allocates them.
UNSHARDED_PARAMETER_OPS = frozenset({"split_with_sizes_copy"})


def _written_storages(facts: _OpFacts, args: tuple, kwargs: dict) -> list[int]:
    """ids of the storages an op writes in place (`self` of add_, `out=`, each tensor of a _foreach_ list)."""
    keys = []
    for where in facts.written:
        value = kwargs.get(where) if isinstance(where, str) else (args[where] if where < len(args) else None)
        for tensor in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(tensor, torch.Tensor):
                keys.append(id(tensor.untyped_storage()))
    return keys


# what a buffer a collective fills may have been labelled before (made by aten.empty in forward or backward);
# parameters, inputs and settled categories are never relabelled by a collective that reads or writes them
_WORKING_CATEGORIES = frozenset({Category.ACTIVATIONS, Category.TEMPORARIES})


def _wrapper_types(types: Any) -> bool:
    """Whether an op's tensor types include a traceable wrapper subclass (DTensor: it defines
    __tensor_flatten__); FakeTensor and nn.Parameter are not wrappers."""
    return any(t is not torch.Tensor and not issubclass(t, FakeTensor) and hasattr(t, "__tensor_flatten__")
               for t in types)


def _tensor_leaves(out: Any) -> list:
    """tree_leaves of an op's output, without the pytree walk for the usual shapes (a tensor, a flat tuple)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if type(out) in (tuple, list) and all(isinstance(leaf, torch.Tensor) for leaf in out):
        return list(out)
    return tree_leaves(out)


class TraceRecorder(TorchDispatchMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """In a --compile trace, off while dynamo and Inductor compile, on when the compiled code runs (compiled.py)."""
        return compiled_trace_active()

    def __init__(self, modules: ModuleTracker, kernel_ops: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.kernel_ops = kernel_ops  # ops whose calls the target wants to see (kernel-internal buffers)
        self.trace = Trace()
        self.phase = Phase.INIT
        self.step = 0
        self.modules = modules
        self.rules = DataDependentRules()
        self.op_counts: Counter[str] = Counter()
        self._live: dict[int, tuple[int, int]] = {}  # id(storage) -> (sid, nbytes)
        self._deaths: dict[int, weakref.ref] = {}  # sid -> the weak reference whose callback frees it
        self._facts: dict[Any, _OpFacts] = {}
        self.closed = False  # set when the recorded steps end: later deaths are not part of the run
        # many ranks (parallel/rank_trace.py): ops on wrapper subclasses (DTensor) are left to the subclass, whose
        # ops on the local tensors come back here; categories that outlive a storage's resize (FSDP frees and
        # re-allocates unsharded parameters by resizing one storage); `muted` while DTensor works out the
        # global shapes of an op's output on throw-away fake tensors
        self.distributed = False
        self.muted = False
        self._sticky: dict[int, Category] = {}  # id(storage) -> category its next allocations get
        self._streams: list[Any] = []  # streams other than the default one, in order of first allocation

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE_QUERY and hasattr(args[0], "fake_device"):
            # autograd asking a fake tensor's device, a few times per op: the answer FakeTensorMode's
            # prim.device handler gives is the tensor's `device` property, and there is no output to record
            self.op_counts["device"] += 1
            self.modules.resolve_pending()
            return args[0].device
        kwargs = kwargs or {}
        if self.muted or (self.distributed and _wrapper_types(types)):
            # a DTensor op: returning NotImplemented lets DTensor run it on its local tensors, whose ops come
            # back to this mode and are recorded as the memory they are (the DTensor itself holds none); muted:
            # throw-away work that is not part of the run (DTensor's shape propagation, checkpoint_load.py)
            return func(*args, **kwargs) if self.muted else NotImplemented
        facts = self._facts.get(func)
        if facts is None:
            facts = self._facts[func] = _op_facts(func, self.kernel_ops)
        op_name = facts.name
        self.op_counts[op_name] += 1
        self.modules.before_op(_written_storages(facts, args, kwargs) if facts.written else [])
        try:
            out = func(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - every failure gets a deliberate rule or a clear error
            out = self.rules.handle(func, args, kwargs, error, self.modules.current(), self.modules.current_module())
        self.rules.observe(op_name, args, out)  # where routing masks come from (trace/rules.py)
        at_seq = len(self.trace.events)
        sids = [self._track(leaf, op_name) if isinstance(leaf, torch.Tensor) else None for leaf in _tensor_leaves(out)]
        if facts.communication:
            self._label_communication(facts, args, kwargs, sids)
        if not self.modules.current() and any(sid is not None for sid in sids):
            self._hint_owners(args, sids)
        if facts.recorded_call:
            self.trace.kernel_calls.append(KernelCall(op_name, at_seq, len(self.trace.events) - at_seq,
                                                      _meta_of(args), _meta_of(_tensor_leaves(out)), tuple(sids)))
        if self.phase in (Phase.FORWARD, Phase.LOSS):
            self.modules.note_outputs(out)
        return out

    def _track(self, tensor: torch.Tensor, op_name: str) -> int | None:
        """Register the tensor's storage if it is new; return its sid when this op allocated it."""
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        key = id(storage)
        known = self._live.get(key)
        if known is not None:
            if known[1] == nbytes:
                return None
            self._free(key)  # resized in place (out= ops, resize_): old block gone, new one made
        sid = len(self.trace.storages)
        category = self._sticky.get(key, _PROVISIONAL[self.phase]) if self._sticky else _PROVISIONAL[self.phase]
        record = StorageRecord(sid, nbytes, category, self.phase, self.modules.current(),
                               op_name, self.step, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape),
                               self._stream())
        self.trace.storages[sid] = record
        self._live[key] = (sid, nbytes)
        self._emit("alloc", record)
        # the storage's death frees it: a weak reference's callback (what weakref.finalize does, without
        # its registry), kept until it fires
        self._deaths[sid] = weakref.ref(storage, lambda _, key=key, sid=sid: self._died(key, sid))
        return sid

    def _owner_of(self, value: Any) -> str:
        known = self._live.get(id(value.untyped_storage())) if isinstance(value, torch.Tensor) else None
        if known is None:
            return ""
        return self.trace.storages[known[0]].module or self.trace.owner_hints.get(known[0], "")

    def _hint_owners(self, args: tuple, sids: list[int | None]) -> None:
        """New storages made outside every module (the optimizer's temporaries) are hinted with the module of
        what they were computed from: a foreach op's output i from element i of its first list argument of the
        same length, any other op's outputs from its first argument with an owner."""
        lists = [arg for arg in args if isinstance(arg, (list, tuple)) and len(arg) == len(sids)]
        if lists:
            owners = [self._owner_of(value) for value in lists[0]]
        else:
            flat = [v for arg in args for v in (arg if isinstance(arg, (list, tuple)) else (arg,))]
            owners = [next((o for o in map(self._owner_of, flat) if o), "")] * len(sids)
        for sid, owner in zip(sids, owners):
            if sid is not None and owner:
                self.trace.owner_hints[sid] = owner

    def _stream(self) -> int:
        """The stream an allocation is made on now: 0 for the default one, else the n-th other stream seen. The trace
        runs on the CPU, where `with torch.cpu.stream(s)` (what FSDP2's `device_handle.stream(...)` is there) makes
        `s` torch.cpu.current_stream() exactly as a CUDA stream context does; the streams are held so that ids
        stay unique."""
        current = torch.cpu.current_stream()
        if current is _DEFAULT_CPU_STREAM:
            return 0
        for number, stream in enumerate(self._streams, 1):
            if stream is current:
                return number
        self._streams.append(current)
        return len(self._streams)

    def _died(self, key: int, sid: int) -> None:
        self._deaths.pop(sid, None)
        if self._sticky:  # the storage is gone: a later one at the same address is another storage
            self._sticky.pop(key, None)
        self._free(key, sid)

    def _free(self, key: int, sid: int | None = None) -> None:
        known = self._live.get(key)
        if self.closed or known is None or (sid is not None and known[0] != sid):
            return
        del self._live[key]
        self._emit("free", self.trace.storages[known[0]])

    def _emit(self, action: str, record: StorageRecord) -> None:
        events = self.trace.events
        events.append(Event(len(events), action, record.nbytes, record.sid, self.phase,
                            self.modules.current(), record.op, self.step))

    # ---- many ranks: collective buffers and storages resized in place -----------------------
    def _label_communication(self, facts: _OpFacts, args: tuple, kwargs: dict, sids: list[int | None]) -> None:
        """What a collective allocates is a communication buffer; FSDP's copy-out fills unsharded parameters.
        Storages it writes in place keep a category already settled (a gradient, a parameter)."""
        if facts.name in UNSHARDED_PARAMETER_OPS:
            for key in _written_storages(facts, args, kwargs):
                self._sticky[key] = Category.PARAMETERS
                known = self._live.get(key)
                if known is not None:
                    self.trace.storages[known[0]].category = Category.PARAMETERS
            return
        for sid in sids:
            if sid is not None:
                self.trace.storages[sid].category = Category.COMMUNICATION
        for key in _written_storages(facts, args, kwargs) if facts.written else []:
            known = self._live.get(key)
            if known is not None and self.trace.storages[known[0]].category in _WORKING_CATEGORIES:
                self.trace.storages[known[0]].category = Category.COMMUNICATION

    def storage_resized(self, storage: Any) -> None:
        """`storage.resize_(n)` (FSDP2's free_storage / alloc_storage of unsharded parameters): the old block
        is freed and, for n > 0, a new one of n bytes is made, as the allocator sees it."""
        if self.closed:
            return
        key, nbytes = id(storage), storage.nbytes()
        known = self._live.get(key)
        if known is not None and known[1] == nbytes:
            return
        if known is not None:
            self._free(key)
        if nbytes == 0:
            return
        old = self.trace.storages[known[0]] if known is not None else None
        category = self._sticky.get(key, old.category if old is not None else _PROVISIONAL[self.phase])
        sid = len(self.trace.storages)
        record = StorageRecord(sid, nbytes, category, self.phase, self.modules.current(),
                               old.op if old is not None else "resize_", self.step, old.dtype if old else "", (),
                               self._stream())
        self.trace.storages[sid] = record
        self._live[key] = (sid, nbytes)
        self._emit("alloc", record)
        self._deaths[sid] = weakref.ref(storage, lambda _, key=key, sid=sid: self._died(key, sid))

    # ---- settling categories after the fact -------------------------------------------------
    def storage_ids_of(self, tensors: Any) -> set[int]:
        ids = set()
        for outer in tensors:
            if not isinstance(outer, torch.Tensor):
                continue
            for tensor in storage_tensors(outer) if self.distributed else (outer,):
                known = self._live.get(id(tensor.untyped_storage()))
                if known is not None:
                    ids.add(known[0])
        return ids

    def set_category(self, sids: set[int], category: Category) -> None:
        for sid in sids:
            self.trace.storages[sid].category = category

    def set_owner(self, tensors_by_name: dict[str, list]) -> None:
        """Attribute storages to the module that owns them: 'blocks.0.qkv.weight' -> 'blocks.0.qkv'. FSDP1's wrappers
        add a `_fsdp_wrapped_module` level to every name ('_fsdp_wrapped_module.2._flat_param'): the module is
        named as the user's model names it ('2')."""
        for name, tensors in tensors_by_name.items():
            owner = name.replace(FSDP1_WRAPPER + ".", "").replace("." + FSDP1_WRAPPER, "").rpartition(".")[0]
            for sid in self.storage_ids_of(tensors):
                self.trace.storages[sid].module = owner

    def settle_forward(self, since_seq: int) -> set[int]:
        """Forward/loss outputs still alive when backward starts are saved activations; the ones that
        died before are temporaries (returned)."""
        alive = {sid for sid, _ in self._live.values()}
        demoted = set()
        for event in self.trace.events[since_seq:]:
            record = self.trace.storages[event.sid]
            if event.action == "alloc" and record.category == Category.ACTIVATIONS and event.sid not in alive:
                record.category = Category.TEMPORARIES
                demoted.add(event.sid)
        return demoted

    def fail(self, error: Exception) -> TraceError:
        where = self.modules.current() or "model"
        # a wrapper whose first line is empty says nothing there (torch.distributed.pipelining's stage re-raises
        # the model's error as `RuntimeError("\n  [Stage 0] failed to run forward: …") from e`): the error it
        # wraps does
        while not str(error).partition("\n")[0].strip() and isinstance(error.__cause__, Exception):
            error = error.__cause__
        return TraceError(f"the training step failed in phase {self.phase} "
                          f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})",
                          where=where)
