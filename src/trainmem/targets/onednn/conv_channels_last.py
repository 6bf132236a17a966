"""Kernel-internal buffers of oneDNN convolutions on channels-last tensors (what Inductor hands `convolution`).

aten's mkldnn convolution keeps the channels-last layout when the input or the weight is channels-last
(`mkldnn_conv_use_channels_last`, aten/src/ATen/native/ConvUtils.h): ideep then runs oneDNN in NHWC, so the
activations are never reordered to a blocked layout and no `mkldnn_to_dense` copy follows, unlike the plain
NCHW path of conv.py. What is left is the weights: oneDNN still reorders them to its blocked layout. Measured on
the Sapphire Rapids machine (torch 2.13, oneDNN 3.12, AVX512, fp32, 2 threads) with the profiler's memory events
inside single `aten.convolution` / `aten.convolution_backward` calls, 11 shapes (3 to 256 channels, 3x3 and 1x1,
stride 1 and 2, with and without bias, every output mask), each sequence below held exactly:

- forward: the output first, then a 12,336 B scratchpad and the weights reordered (weight-sized), both freed;
- backward-data (mask[0]): grad_input first, then the weights reordered as the NCHW backward-data plan pads them
  (C_in to the channel block for the jit kernel), and a scratchpad: brgconv_strided's (conv_data_plans.py
  `brgemm_strided_scratchpad`, to the byte) for strided convolutions, 12,464 B for stride 1;
- backward-weights (mask[1] or [2]): the blocked diff_weights (the NCHW plan's, conv_weights_plan.py), its
  scratchpad (the NCHW plan's without the bias reducer, to the byte), the blocked diff_bias, then the
  weight-sized dense copy that becomes the channels-last grad_weight: three weight-sized buffers at once, which
  for a deep layer (256 channels, 2.25 MiB of weights) outweighs the activations' share.

Only plain 2-D convolutions were measured (groups 1, no dilation, not transposed, fp32 or bf16 sizes):
`channels_last_applies` says so, and other convolutions keep conv.py's NCHW model.
"""

from __future__ import annotations

from math import prod

from trainmem.targets.cpu_info import CpuInfo
from trainmem.targets.onednn.conv_data_plans import backward_data_plan
from trainmem.targets.onednn.conv_geometry import ConvGeometry, channel_block, uses_mkldnn
from trainmem.targets.onednn.conv_weights_plan import backward_weights_plan

FORWARD_SCRATCHPAD = 12336  # measured: every forward above, with or without bias
BACKWARD_DATA_SCRATCHPAD = 12464  # measured: every stride-1 backward-data above


def channels_last_applies(geometry: ConvGeometry, transposed: bool, dtype_bytes: int, cpu: CpuInfo) -> bool:
    """The convolutions whose channels-last sequences were measured (the module docstring)."""
    return (geometry.spatial_dims == 2 and geometry.groups == 1 and not transposed and not geometry.is_dilated
            and uses_mkldnn(geometry, transposed, dtype_bytes, cpu))


def forward(weight_shape, dtype_bytes: int) -> tuple[list[int], list[int]]:
    """(before, after) around the output: everything comes after it."""
    weights = prod(int(dim) for dim in weight_shape) * int(dtype_bytes)
    return [], [FORWARD_SCRATCHPAD, weights, -weights, -FORWARD_SCRATCHPAD]


def backward(geometry: ConvGeometry, dtype_bytes: int, cpu: CpuInfo, mask: tuple[bool, bool, bool],
             output_bytes: tuple[int, int, int]) -> tuple[list[int], list[int]]:
    """(before, after) around the outputs; grad_input, allocated first by the kernel, is a placeholder in
    `before` (as in conv.py), swapped for the traced output when the outputs are allocated."""
    block, threads = channel_block(cpu.capability), cpu.threads
    before: list[int] = []
    if mask[0]:
        data = backward_data_plan(geometry, dtype_bytes, block, threads)
        scratchpad = data.scratchpad if geometry.is_strided else BACKWARD_DATA_SCRATCHPAD
        before += [output_bytes[0], data.weights, scratchpad, -scratchpad, -data.weights]
    after: list[int] = []
    if mask[1] or mask[2]:
        weights = backward_weights_plan(geometry, dtype_bytes, block, threads, with_bias=False)
        diff_bias = geometry.out_channels * dtype_bytes if mask[2] else 0
        dense = output_bytes[1] if mask[1] else 0
        steps = [weights.diff_weights, weights.scratchpad, diff_bias, -weights.scratchpad, dense]
        before += [step for step in steps if step]
        after += [-step for step in (dense, weights.diff_weights, diff_bias) if step]
    if mask[0]:
        before.append(-output_bytes[0])
    return before, after
