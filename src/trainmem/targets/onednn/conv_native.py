"""The real-time allocations of a convolution that misses oneDNN: aten's native CPU kernels.

`_slow_conv2d_forward`, `slow_conv3d`, the dilated and transposed variants allocate im2col columns
(per sample for the dilated and the transposed backward, for the whole batch otherwise). With
groups > 1 they run once per group on `narrow`-ed slices, whose input/grad_output slices
`.contiguous()` copies, and `cat` the results: there is no native depthwise kernel on CPU.
"""

from __future__ import annotations

from trainmem.targets.onednn.conv_geometry import ConvGeometry
from trainmem.targets.onednn.conv_sequence import Output, split_at_outputs


def _columns(kind: str, geometry: ConvGeometry, size: int, per_sample: bool = False) -> int:
    samples = 1 if per_sample else geometry.batch
    if kind == "slow_transpose":
        return samples * geometry.out_per_group * geometry.kernel_points * geometry.in_points * size
    if kind in ("slow2d", "slow3d") and geometry.is_pointwise and not geometry.is_strided:
        return 0
    return samples * geometry.in_per_group * geometry.kernel_points * geometry.out_points * size


def _forward_one_group(kind: str, geometry: ConvGeometry, size: int, output) -> list:
    """One (group's) forward; `output` is an Output marker or, inside the group loop, an int."""
    if kind in ("slow2d", "slow3d"):
        columns = _columns(kind, geometry, size)
        return [columns, output, -columns]
    if kind == "slow_dilated":
        columns = _columns(kind, geometry, size, per_sample=True)
        return [output, columns, -columns]
    columns = _columns(kind, geometry, size)  # slow_transpose: columns for the whole batch
    return [output, columns, -columns]


def _backward_one_group(kind: str, geometry: ConvGeometry, size: int, mask, grad_input, grad_weight,
                        grad_bias) -> list:
    sequence = []
    if kind == "slow2d":
        columns = _columns(kind, geometry, size)
        sequence += [grad_input if mask[0] else 0, grad_bias if mask[2] else 0, grad_weight if mask[1] else 0]
        if mask[1]:
            sequence += [columns, -columns]
    elif kind == "slow3d":
        columns = _columns(kind, geometry, size)
        # grad columns even for 1x1x1 (measured)
        grad_columns = geometry.batch * geometry.in_per_group * geometry.kernel_points * geometry.out_points * size
        if mask[0]:
            sequence += [grad_input, grad_columns, -grad_columns]
        sequence += [grad_bias if mask[2] else 0, grad_weight if mask[1] else 0]
        if mask[1]:
            sequence += [columns, -columns]
    elif kind == "slow_dilated":
        columns = _columns(kind, geometry, size, per_sample=True)
        sequence += [grad_input if mask[0] else 0, grad_weight if mask[1] else 0, grad_bias if mask[2] else 0]
        if mask[1] or mask[2]:
            bias_buffer = geometry.out_per_group * size
            sequence += [columns, bias_buffer, -bias_buffer, -columns]
    else:  # slow_transpose, per-sample columns
        columns = _columns(kind, geometry, size, per_sample=True)
        if mask[0]:
            sequence += [grad_input, columns, -columns]
        sequence += [grad_bias if mask[2] else 0, grad_weight if mask[1] else 0]
        if mask[1]:
            sequence += [columns, -columns]
    return sequence


def forward(kind: str, geometry: ConvGeometry, dtype_bytes: int, output_bytes: int) -> tuple[list[int], list[int]]:
    size = dtype_bytes
    if geometry.groups == 1:
        return split_at_outputs(_forward_one_group(kind, geometry, size, Output("y", output_bytes)))
    group = geometry.one_group()
    input_slice = geometry.batch * geometry.in_per_group * geometry.in_points * size
    group_output = geometry.batch * geometry.out_per_group * geometry.out_points * size
    sequence = []
    for _ in range(geometry.groups):
        sequence += [input_slice] + _forward_one_group(kind, group, size, group_output) + [-input_slice]
    sequence += [Output("y", output_bytes)] + [-group_output] * geometry.groups  # cat, then the parts die
    return split_at_outputs(sequence)


def backward(kind: str, geometry: ConvGeometry, dtype_bytes: int, mask,
             output_bytes: tuple[int, int, int]) -> tuple[list[int], list[int]]:
    size = dtype_bytes
    outputs = (Output("grad_input", output_bytes[0]), Output("grad_weight", output_bytes[1]),
               Output("grad_bias", output_bytes[2]))
    if geometry.groups == 1:
        return split_at_outputs(_backward_one_group(kind, geometry, size, mask, *outputs))
    group = geometry.one_group()
    grad_output_slice = geometry.batch * geometry.out_per_group * geometry.out_points * size
    input_slice = geometry.batch * geometry.in_per_group * geometry.in_points * size
    group_grad_input = geometry.batch * geometry.in_per_group * geometry.in_points * size if mask[0] else 0
    group_grad_weight = geometry.out_per_group * geometry.in_per_group * geometry.kernel_points * size if mask[1] else 0
    group_grad_bias = geometry.out_per_group * size if mask[2] else 0
    sequence = []
    for _ in range(geometry.groups):
        sequence += [grad_output_slice, input_slice]
        sequence += _backward_one_group(kind, group, size, mask, group_grad_input, group_grad_weight, group_grad_bias)
        sequence += [-input_slice, -grad_output_slice]
    sequence += [output for wanted, output in zip(mask, outputs) if wanted]
    sequence += ([-group_grad_input] * geometry.groups + [-group_grad_bias] * geometry.groups
                 + [-group_grad_weight] * geometry.groups)
    return split_at_outputs(sequence)
