"""The real-time allocations of a convolution that aten hands to oneDNN (through ideep).

Each pass allocates its scratchpad and its reordered inputs, computes into a blocked result and
frees the rest; `mkldnn_to_dense` then allocates the plain output and frees the blocked one (an
NHWC result is copied once more by `.contiguous()`). Backward runs backward-data first, then
backward-weights; ideep allocates the blocked grad_weight and the grad_bias before running, and
`mkldnn_to_dense` copies both at the end.
"""

from __future__ import annotations

from trainmem.targets.onednn.conv_data_plans import (
    DataPlan,
    backward_data_plan,
    brgemm_strided_scratchpad,
    forward_plan,
)
from trainmem.targets.onednn.conv_geometry import ConvGeometry
from trainmem.targets.onednn.conv_sequence import Output, split_at_outputs
from trainmem.targets.onednn.conv_weights_plan import WeightsPlan, backward_weights_plan
from trainmem.targets.onednn.scratchpad import book, round_up


def _data_pass(plan: DataPlan, output: Output) -> list:
    """[+scratch, +in', +wei', +result', -wei', -in', -scratch], the dense output, [-result']."""
    sequence = [plan.scratchpad, plan.data_in, plan.weights, plan.result, -plan.weights, -plan.data_in,
                -plan.scratchpad]
    if plan.nhwc:  # mkldnn_to_dense returns NHWC strides, .contiguous() copies once more
        return sequence + [output.nbytes, output, -output.nbytes, -plan.result]
    return sequence + [output, -plan.result]


def _weights_pass(plan: WeightsPlan, grad_bias_bytes: int, mask, outputs: tuple[Output, Output, Output]) -> list:
    """[+go', +src', +gw', +scratch, +gb, -scratch, -src', -go'], the dense grad_bias and
    grad_weight, [-gw', -gb]."""
    grad_bias = grad_bias_bytes if mask[2] else 0
    sequence = [plan.diff_dst, plan.source, plan.diff_weights, plan.scratchpad, grad_bias,
                -plan.scratchpad, -plan.source, -plan.diff_dst]
    if mask[2]:
        sequence.append(outputs[2])
    sequence.append(outputs[1] if mask[1] else 0)
    return sequence + [-plan.diff_weights, -grad_bias]


def forward(geometry: ConvGeometry, dtype_bytes: int, block: int, threads: int, has_bias: bool,
            output_bytes: int) -> tuple[list[int], list[int]]:
    plan = forward_plan(geometry, dtype_bytes, block, threads, has_bias)
    return split_at_outputs(_data_pass(plan, Output("y", output_bytes)))


def transposed_forward(geometry: ConvGeometry, dtype_bytes: int, block: int, threads: int, has_bias: bool,
                       output_bytes: int) -> tuple[list[int], list[int]]:
    """`geometry` is the deconvolution's: in_channels are the deconv's input channels."""
    size = dtype_bytes
    if geometry.is_strided and geometry.groups == 1:  # brg_deconv == brgconv_strided backward-data, NHWC
        plan = DataPlan(
            brgemm_strided_scratchpad(geometry.in_channels, geometry.in_spatial, geometry.kernel, geometry.stride,
                                      threads),
            geometry.batch * geometry.in_channels * geometry.in_points * size,
            # Acdb16a..: output channels padded to 16 # fitted block choice
            round_up(geometry.out_channels, 16) * geometry.in_channels * geometry.kernel_points * size,
            geometry.batch * geometry.out_channels * geometry.out_points * size, nhwc=True)
        return split_at_outputs(_data_pass(plan, Output("y", output_bytes)))
    # a conv backward-data kernel run "forward": blocked like the backward-data of the mirrored conv
    plan = backward_data_plan(geometry.mirrored(), size, block, threads)
    if has_bias and not plan.nhwc:  # the deconv bias is added through a dst-sized buffer (measured)
        plan = DataPlan(plan.scratchpad + book(plan.result), plan.data_in, plan.weights, plan.result, plan.nhwc)
    return split_at_outputs(_data_pass(plan, Output("y", output_bytes)))


def _outputs(output_bytes: tuple[int, int, int]) -> tuple[Output, Output, Output]:
    grad_input, grad_weight, grad_bias = output_bytes
    return Output("grad_input", grad_input), Output("grad_weight", grad_weight), Output("grad_bias", grad_bias)


def backward(geometry: ConvGeometry, dtype_bytes: int, block: int, threads: int, mask,
             output_bytes: tuple[int, int, int]) -> tuple[list[int], list[int]]:
    outputs = _outputs(output_bytes)
    sequence = []
    if mask[0]:
        sequence += _data_pass(backward_data_plan(geometry, dtype_bytes, block, threads), outputs[0])
    if mask[1] or mask[2]:
        plan = backward_weights_plan(geometry, dtype_bytes, block, threads, bool(mask[2]))
        sequence += _weights_pass(plan, geometry.out_channels * dtype_bytes, mask, outputs)
    return split_at_outputs(sequence)


def transposed_backward(geometry: ConvGeometry, dtype_bytes: int, block: int, threads: int, mask,
                        output_bytes: tuple[int, int, int]) -> tuple[list[int], list[int]]:
    """`geometry` is the deconvolution's. Its data gradient is a forward conv of grad_output (its
    output channels and points) into grad_input; its weight gradient is a conv backward-weights
    with src and diff_dst swapped."""
    outputs = _outputs(output_bytes)
    mirror = geometry.mirrored()
    sequence = []
    if mask[0]:
        sequence += _data_pass(forward_plan(mirror, dtype_bytes, block, threads, False), outputs[0])
    if mask[1] or mask[2]:
        plan = backward_weights_plan(mirror, dtype_bytes, block, threads, False)
        if mask[2]:  # the deconv's own diff_bias handling # fitted (measured)
            plan = WeightsPlan(plan.scratchpad + (0 if block == 8 else 128), plan.diff_dst, plan.source,
                               plan.diff_weights)
        sequence += _weights_pass(plan, geometry.out_channels * dtype_bytes, mask, outputs)
    return split_at_outputs(sequence)
