"""Build the user's model on the meta device, even where its code names a device.

`with torch.device("meta")` only fills in a device that a constructor was not given: a model written
with `nn.Linear(n, m, device="cpu")` or `torch.zeros(..., device=args.device)` would allocate (and
initialize) its weights for real while we only estimate them — 28 GB for a 7B model written that way.
While the model is built, `MetaEverywhere` sends such a call to meta first, which gives the tensor's size
for free. A small one is then made where the code asked, because construction code may read its values
(`[x.item() for x in torch.linspace(0, rate, depth, device=...)]`, position tables); a large one stays on
meta, and so does everything once the small ones made for real add up to a budget. Parameters and buffers
left on meta are replaced by fake ones before the trace (trace/run.py materialize_fake), as for a model
that names no device; the small real ones are too, or enter the trace as constants.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from trainmem.trace.torch_private import device_constructors, torch_function_modes_off

# A tensor this small is made where the code asked: 64 KiB holds an 8,192-entry int64 position table or a
# drop-path schedule, values construction code reads; no weight matrix worth estimating is this small.
SMALL_TENSOR_BYTES = 64 << 10
# What all the small ones made for real may add up to, so that ten thousand small layers cannot add up to
# gigabytes: 64 MiB is a fifth of the process that imports torch, and a thousand times what real models
# make this way.
REAL_BUDGET_BYTES = 64 << 20


class MetaEverywhere(TorchFunctionMode):
    """Inside `with torch.device("meta")`: a constructor given another device builds on meta unless what it
    makes is small (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.constructors = frozenset(device_constructors())
        self.real_bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func not in self.constructors or device is None or torch.device(device).type == "meta":
            return func(*args, **kwargs)
        on_meta = func(*args, **{**kwargs, "device": "meta"})
        size = on_meta.untyped_storage().nbytes() if isinstance(on_meta, torch.Tensor) else 0
        if size > SMALL_TENSOR_BYTES or self.real_bytes + size > REAL_BUDGET_BYTES:
            return on_meta
        self.real_bytes += size
        return func(*args, **kwargs)


@contextlib.contextmanager
def building_on_meta() -> Iterator[None]:
    """The model's constructors allocate nothing large for real, whether or not they name a device."""
    # torch._dynamo, when the model's code imports it (GenerationMixin does), off meta (torch_private.
    # torch_function_modes_off says why); a model that never imports it is built without its 1-2 s import, which a
    # trace pays anyway (FakeTensorMode) but a run served from the trace cache does not
    deferred = DynamoOffMeta()
    sys.meta_path.insert(0, deferred)
    try:
        with torch.device("meta"), MetaEverywhere():
            yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(deferred)


class DynamoOffMeta(importlib.abc.MetaPathFinder):
    """Finds torch._dynamo where the path finder does, with a loader that runs its import with the building modes
    off: one import, as the interpreter would make it (a second import nested in this one would leave the package
    without the attributes of the submodules its first attempt imported)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch._dynamo":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _ModesOff(spec.loader)
        return spec


class _ModesOff(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # the module keeps its own loader
        with torch_function_modes_off():
            self.loader.exec_module(module)
