"""The checkpoint a run loads before training (--load, --resume), run as the user's code on the fake tensors.

The code it stands for (setup/loading.py):

    checkpoint = torch.load(path, map_location=...)        # {"model": ..., "optimizer": ...} with --resume
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])      # --resume
    del checkpoint

What each line allocates, and why it is traced rather than counted:
- torch.load makes one storage per storage the file holds, in the order the pickle names them (the state dict's
  order; tied weights are one storage in the file and one when loaded). Here: `empty_like` of each distinct storage
  of `model.state_dict()` in that order, in the checkpoint's dtype. These are the allocations of phase "load",
  category "checkpoint".
- load_state_dict copies each tensor into the parameter in place (`param.copy_(input)` under no_grad, the copy
  converting dtypes in its kernel): it runs as torch's own code here, so whatever it allocates is recorded.
- the optimizer's state as saved is what the optimizer holds after a step: one throw-away step is taken with the
  recorder muted, its state_dict() taken and the state dropped; the checkpoint holds a copy of each tensor of it.
  optimizer.load_state_dict (torch's code) casts each to its parameter's dtype and device
  (Optimizer._process_value_according_to_param_policy): the same dtype and device keeps the loaded tensor itself,
  so the optimizer's state is allocated here, before the first step, and the first step allocates none.
- map_location="cpu" on a GPU target: the checkpoint lives in host RAM (Trace.host_storages), and that cast is a
  copy onto the device, made here per state tensor in the order torch's cast visits them.
- `del checkpoint` frees what nothing else holds: the model's copies, in the order Python drops a dict's values.
"""

from __future__ import annotations

from typing import Any

import torch

from trainmem.setup import Load, TrainingSetup
from trainmem.trace.events import Phase
from trainmem.trace.torch_private import tree_leaves

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_checkpoint(prepared: Any, setup: TrainingSetup, recorder: Any) -> None:
    """Trace the load of `setup` into the prepared model (and optimizer), as phase "load"."""
    if setup.load == Load.NONE:
        return
    model, optimizer = prepared.model, prepared.optimizer
    saved_state = _optimizer_state_as_saved(optimizer, recorder) if setup.resume else None
    on_host = setup.load == Load.STATE_DICT_CPU and prepared.cuda_semantics
    recorder.phase = Phase.LOAD
    checkpoint = {"model": _loaded(model.state_dict(), _DTYPES.get(setup.checkpoint_dtype or ""))}
    if saved_state is not None:
        checkpoint["optimizer"] = _loaded(saved_state, None)
    if on_host:
        tensors = [leaf for leaf in tree_leaves(checkpoint) if isinstance(leaf, torch.Tensor)]
        recorder.trace.host_storages.update(recorder.storage_ids_of(tensors))
    model.load_state_dict(checkpoint["model"])
    if saved_state is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        if on_host:
            _copied_to_device(optimizer)
    del checkpoint
    recorder.phase = Phase.INIT


def _optimizer_state_as_saved(optimizer: torch.optim.Optimizer, recorder: Any) -> dict:
    """The optimizer's state_dict() after one step, made with the recorder muted; the optimizer is left as it was
    (no state). Gradients are zeros: the state's shapes and dtypes do not depend on their values."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    recorder.muted = True
    try:
        for param in params:
            param.grad = torch.zeros_like(param)
        optimizer.step()
        saved = optimizer.state_dict()
        for param in params:
            param.grad = None
        optimizer.state.clear()
    finally:
        recorder.muted = False
    return saved


def _loaded(value: Any, dtype: torch.dtype | None, seen: dict | None = None) -> Any:
    """`value` as torch.load returns it: each distinct storage made once, floating tensors in `dtype` when given."""
    seen = {} if seen is None else seen
    if isinstance(value, torch.Tensor):
        key = (id(value.untyped_storage()), value.storage_offset(), tuple(value.shape))
        if key not in seen:
            cast = dtype if dtype is not None and value.is_floating_point() else value.dtype
            # a copy, not empty_like: a 0-dim step counter keeps its value, which the optimizer's next step reads
            seen[key] = value.to(dtype=cast, memory_format=torch.contiguous_format, copy=True)
        return seen[key]
    if isinstance(value, dict):
        return type(value)((k, _loaded(v, dtype, seen)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_loaded(v, dtype, seen) for v in value)
    return value


def _copied_to_device(optimizer: torch.optim.Optimizer) -> None:
    """A CUDA run's cast of host state onto its parameter's device: a device copy per tensor (step counters
    excepted: torch keeps them where they were unless the optimizer is capturable or fused)."""
    for state in optimizer.state.values():
        for key, value in list(state.items()):
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.clone()
