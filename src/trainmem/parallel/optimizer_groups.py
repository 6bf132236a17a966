"""Optimizer parameter groups by tensor kind: one group per DTensor mesh, one for plain tensors.

A foreach or fused optimizer step (torch's default with every parameter on CUDA, torch/optim/optimizer.py
_default_to_fused_or_foreach) runs one multi-tensor kernel per parameter group and device/dtype bucket
(torch/optim/adam.py _multi_tensor_adam groups with Optimizer._group_tensors_by_device_and_dtype, which does not
look at the tensor subclass). A bucket mixing DTensors with plain tensors fails in DTensor's dispatch
("aten._foreach_lerp_.Scalar: got mixed torch.Tensor and DTensor"), and one mixing DTensors of different meshes
is refused as cross-mesh. That happens for real whenever some parameters stay plain beside sharded ones: FSDP2's
`ignored_params` (our ZeRO-3 persistence threshold) or a tensor-parallel module left unsplit. Separate groups
are what a user of those has to write too; each group's kernels then see one kind. The per-parameter state is
unchanged; the step's foreach temporaries (e.g. _foreach_sqrt of every exp_avg_sq) are made per group, so the
largest group's, not the whole list's, are live at once, as in the real run with these groups.
"""

from __future__ import annotations

import sys
from typing import Any


def by_tensor_kind(params: Any) -> Any:
    """`params` unchanged when all are of one kind (or already given as groups), else a list of parameter groups
    ({"params": [...]}), one per kind (None for plain tensors, else the DTensor's mesh; meshes compare by their
    ranks, shape and names), in the order each kind first appears."""
    params = list(params)
    # no DTensor exists unless its module was imported; importing it here would cost a single-process run the
    # seconds torch.distributed.tensor takes to import (it pulls in torch._dynamo)
    module = sys.modules.get("torch.distributed.tensor")
    if not params or isinstance(params[0], dict) or module is None:
        return params
    groups: dict[Any, list[Any]] = {}
    for param in params:
        groups.setdefault(param.device_mesh if isinstance(param, module.DTensor) else None, []).append(param)
    if len(groups) == 1:
        return params
    return [{"params": members} for members in groups.values()]
