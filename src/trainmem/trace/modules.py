"""Which module is running: a forward-hook stack in forward, and in backward the module whose
forward created the autograd node now executing.

Backward attribution works through autograd sequence numbers: a node created in forward keeps the
sequence number of the forward op that made it, and `torch._C._current_autograd_node()` names the
node running in backward. Outputs seen by the dispatch mode get their `grad_fn` only after the mode
returns (autograd sets it above us), so they are noted and resolved at the next dispatch. A node no
noted output claims — a DTensor op's (the mode sees only the ops on its local tensors, whose outputs
never get a grad_fn), DTensor's redistribute Function's — is the module's that was innermost when the
node was numbered: the tracker marks the sequence number at each module entry and exit (_made_in).
Without it, tensor-parallel backward ran "outside every module" and its ranks' traces did not compose
from a few blocks (Llama-3.1-70B, FSDP with tp 2: 34.9 s traced whole, 8.0 s composed, block_reuse.md).

What each dispatch costs does not grow with the trace (it used to: every output that never gets a
grad_fn, such as a GRU's detached time steps, was looked at again on every dispatch until its module
returned). A noted output now waits (is looked at on every dispatch) only until its own op has
returned: autograd sets an output's grad_fn inside the op's autograd kernel, whose only dispatches after
ours are device queries (`prim.device`, asked while it records each output's metadata), so the next
dispatch of any other op comes after that kernel returned. An output still without a grad_fn then is
*settled*: only an in-place op on its storage can give it one (autograd rebases its history), and that
op is dispatched here with the storage among the arguments it writes, so the settled outputs of that
storage wait again. Outputs made with grad disabled keep waiting until their module returns, as all did
before: an autograd.Function gives the outputs of its forward their grad_fn when the forward returns.
Outputs are looked at in the order they were noted, so the first module to claim a sequence number keeps
it, as a rescan of all of them at every dispatch has it; tests/test_trace_cost.py checks both against
such a rescan and counts the work, benchmarks/speed.py measures the recorder's cost per op.
"""

from __future__ import annotations

import bisect
import contextlib
import weakref
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from trainmem.trace.compiled import compiled_trace_active
from trainmem.trace.torch_private import current_autograd_node, sequence_nr, tree_leaves

# the attribute FSDP1's FullyShardedDataParallel keeps the module it wraps under (torch/distributed/fsdp/_common_utils.py
# FSDP_WRAPPED_MODULE)
FSDP1_WRAPPER = "_fsdp_wrapped_module"
# (note order, the output, the module that made it, whether it waits until its module returns, the op
# call that made it: outputs of one call share this number)
_Noted = tuple[int, weakref.ref, str, bool, int]


class ModuleTracker:
    active: ClassVar[ModuleTracker | None] = None  # the tracker entered now (checkpointing.py's recomputation asks)

    def __init__(self, model: torch.nn.Module) -> None:
        self._names = {id(m): name for name, m in model.named_modules()}
        self._by_name = {name: m for name, m in model.named_modules()}
        self._stack: list[str] = []
        self._waiting: list[_Noted] = []  # looked at on every dispatch, in note order
        self._settled: dict[int, list[_Noted]] = {}  # id(storage) -> outputs without grad_fn after their op
        self._noted = 0  # outputs noted so far: each one's place in the note order
        self._calls = 0  # op calls whose outputs were noted: the latest one's outputs may still be getting grad_fns
        self._by_sequence_nr: dict[int, str] = {}
        # the autograd sequence numbers at which the innermost module changed, and the module from each on (_moved)
        self._marks: list[int] = []
        self._mark_names: list[str] = []
        self._handles: list[Any] = []
        self.output_elements: dict[str, int] = {}  # module -> elements of its first forward's output
        self.outputs_looked_at = 0  # how many times an output's grad_fn was read (tests/test_trace_cost.py)

    def __enter__(self) -> ModuleTracker:
        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(self._pre),
                         hooks.register_module_forward_hook(self._post)]
        ModuleTracker.active = self
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        ModuleTracker.active = None

    @contextlib.contextmanager
    def running(self, module: torch.nn.Module) -> Iterator[None]:
        """`module`'s forward run by a caller that bypasses its hooks (torch.utils.checkpoint recomputing a block in
        backward, trace/checkpointing.py): its ops are attributed to it, as when it is called. The recomputation
        stops as soon as it has remade the tensors backward needs (non-reentrant checkpoint raises inside the
        forward): the submodules it was in never return, so their entries are dropped here with the block's."""
        depth = len(self._stack)
        self._pre(module, ())
        try:
            yield
        finally:
            del self._stack[depth + 1:]
            self._post(module, (), None)

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if compiled_trace_active() and torch.compiler.is_compiling():  # dynamo traces the hooks of a --compile
            return  # forward: they add nothing to its graph (trace/compiled.py)
        name = self._name_of(module)
        if name is not None:
            self._stack.append(name)
            self._moved()

    def _name_of(self, module: torch.nn.Module) -> str | None:
        """The module's name in the model; a wrapper FSDP1 put around a module after the tracker was made takes the
        wrapped module's (its forward gathers the unit's parameters before the inner forward, and frees them after:
        that is the unit's work, not its parent's)."""
        name = self._names.get(id(module))
        inner = getattr(module, FSDP1_WRAPPER, None) if name is None else None
        return self._names.get(id(inner)) if inner is not None else name

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if compiled_trace_active() and torch.compiler.is_compiling():
            return
        if self._name_of(module) is not None and self._stack:
            name = self._stack[-1]
            if name not in self.output_elements:
                self.output_elements[name] = sum(t.numel() for t in tree_leaves(output) if isinstance(t, torch.Tensor))
            self._resolve(self._waiting)
            self._waiting.clear()  # what has no grad_fn by now never gets one
            self._settled.clear()
            self._stack.pop()
            self._moved()

    def current_module(self) -> torch.nn.Module | None:
        """The innermost module running its forward now (None in backward or outside any module)."""
        return self._by_name.get(self._stack[-1]) if self._stack else None

    def current(self) -> str:
        if self._stack:
            return self._stack[-1]
        node = current_autograd_node()
        if node is not None:
            number = sequence_nr(node)
            name = self._by_sequence_nr.get(number)
            return name if name is not None else self._made_in(number)
        return ""

    def _moved(self) -> None:
        """The innermost module changed: nodes numbered from here on are made in the new one (or in none). The
        numbers are a per-thread counter; the steps run on one thread (CPU fake tensors: autograd runs backward, and
        a checkpointed block's recomputation, on the calling thread), so they only grow. Should they not, the
        marks would no longer be sorted: that change is not marked, and its nodes keep the module before it."""
        number, name = sequence_nr(), self._stack[-1] if self._stack else ""
        if self._marks and self._marks[-1] == number:
            self._mark_names[-1] = name
        elif not self._marks or self._marks[-1] < number:
            self._marks.append(number)
            self._mark_names.append(name)

    def _made_in(self, number: int) -> str:
        """The module that was innermost when the node numbered `number` was made: for nodes no output claimed (a
        DTensor op's, whose local outputs the recorder sees never get one; DTensor's redistribute Function's)."""
        at = bisect.bisect_right(self._marks, number) - 1
        return self._mark_names[at] if at >= 0 else ""

    def note_outputs(self, out: Any) -> None:
        if self._stack:
            name = self._stack[-1]
            until_module_returns = not torch.is_grad_enabled()  # inside an autograd.Function's forward, say
            self._calls += 1
            for tensor in tree_leaves(out):
                if isinstance(tensor, torch.Tensor):
                    self._waiting.append((self._noted, weakref.ref(tensor), name, until_module_returns, self._calls))
                    self._noted += 1

    def resolve_pending(self) -> None:
        """Map the grad_fn of waiting outputs to their module; keep those without one waiting (an output
        may get its grad_fn only after a few more dispatches: autograd kernels ask `prim.device` first).
        Autograd gives the outputs of the op in progress their grad_fn one after the other, in output
        order (set_history), asking each one's device first: past the first of them without a grad_fn,
        the rest have none yet and are not looked at (an op with n outputs would cost n² otherwise)."""
        if self._waiting:
            self._waiting = self._resolve(self._waiting, in_order_call=self._calls)

    def before_op(self, written_storages: list[int]) -> None:
        """At the dispatch of an op other than a device query: the ops before it have returned, so what
        they made without a grad_fn settles; outputs on a storage this op writes wait again."""
        if self._waiting:
            waiting = []
            for noted in self._resolve(self._waiting):
                if noted[3]:
                    waiting.append(noted)
                else:
                    self._settle(noted)
            self._waiting = waiting
        if written_storages and self._settled:
            woken = [noted for key in written_storages for noted in self._settled.pop(key, ())]
            if woken:
                self._waiting = sorted(self._waiting + woken)

    def _resolve(self, noted_outputs: list[_Noted], in_order_call: int = 0) -> list[_Noted]:
        """Record the module of each output's grad_fn; return the live ones that have none (in order).
        Outputs of call `in_order_call` after the first of them without a grad_fn are kept unread."""
        unresolved = []
        unread_call = 0
        for noted in noted_outputs:
            if noted[4] == unread_call:
                unresolved.append(noted)
                continue
            self.outputs_looked_at += 1
            tensor = noted[1]()
            if tensor is None:
                continue
            grad_fn = tensor.grad_fn
            if grad_fn is not None:
                self._by_sequence_nr.setdefault(sequence_nr(grad_fn), noted[2])
            else:
                unresolved.append(noted)
                if noted[4] == in_order_call:
                    unread_call = in_order_call
        return unresolved

    def _settle(self, noted: _Noted) -> None:
        tensor = noted[1]()
        if tensor is not None:  # keyed by the storage it has now (set_ may have changed it)
            self._settled.setdefault(id(tensor.untyped_storage()), []).append(noted)
