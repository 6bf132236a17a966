"""Which module is running: a forward-hook stack in forward, and in backward the module whose
forward created the autograd node now executing.

Backward attribution works through autograd sequence numbers: a node created in forward keeps the
sequence number of the forward op that made it, and `torch._C._current_autograd_node()` names the
node running in backward. Outputs seen by the dispatch mode get their `grad_fn` only after the mode
returns (autograd sets it above us), so they are noted and resolved at the next op.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from trainmem.trace.torch_private import current_autograd_node, sequence_nr, tree_leaves


class ModuleTracker:
    def __init__(self, model: torch.nn.Module) -> None:
        self._names = {id(m): name for name, m in model.named_modules()}
        self._by_name = {name: m for name, m in model.named_modules()}
        self._stack: list[str] = []
        self._pending: list[tuple[weakref.ref, str]] = []
        self._by_sequence_nr: dict[int, str] = {}
        self._handles: list[Any] = []
        self.output_elements: dict[str, int] = {}  # module -> elements of its first forward's output

    def __enter__(self) -> ModuleTracker:
        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(self._pre),
                         hooks.register_module_forward_hook(self._post)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        name = self._names.get(id(module))
        if name is not None:
            self._stack.append(name)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._names.get(id(module)) is not None and self._stack:
            name = self._stack[-1]
            if name not in self.output_elements:
                self.output_elements[name] = sum(t.numel() for t in tree_leaves(output) if isinstance(t, torch.Tensor))
            self.resolve_pending()
            self._pending.clear()  # what has no grad_fn by now never gets one
            self._stack.pop()

    def current_module(self) -> torch.nn.Module | None:
        """The innermost module running its forward now (None in backward or outside any module)."""
        return self._by_name.get(self._stack[-1]) if self._stack else None

    def current(self) -> str:
        if self._stack:
            return self._stack[-1]
        node = current_autograd_node()
        if node is not None:
            return self._by_sequence_nr.get(sequence_nr(node), "")
        return ""

    def note_outputs(self, out: Any) -> None:
        if self._stack:
            name = self._stack[-1]
            self._pending.extend((weakref.ref(t), name) for t in tree_leaves(out) if isinstance(t, torch.Tensor))

    def resolve_pending(self) -> None:
        """Map the grad_fn of noted outputs to their module. An output may get its grad_fn only after
        a few more dispatches (autograd kernels call `prim.device` before they set it): keep those."""
        unresolved = []
        for ref, name in self._pending:
            tensor = ref()
            if tensor is None:
                continue
            grad_fn = tensor.grad_fn
            if grad_fn is not None:
                self._by_sequence_nr.setdefault(sequence_nr(grad_fn), name)
            else:
                unresolved.append((ref, name))
        self._pending = unresolved
