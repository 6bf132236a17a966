"""Every private PyTorch API trainmem uses, imported here and nowhere else (torch 2.13), so that a
torch upgrade that moves one breaks in one place."""

from __future__ import annotations

import logging

import torch
from torch._subclasses.fake_tensor import (  # noqa: F401 - re-exported
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401 - re-exported
from torch.utils._pytree import tree_leaves  # noqa: F401 - re-exported

FAKE_TENSOR_LOG = logging.getLogger("torch._subclasses.fake_tensor")
# an op on fake tensors whose answer needs values (.item(), nonzero, an op without a meta kernel)
FAKE_LIMITATIONS = (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException)


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
