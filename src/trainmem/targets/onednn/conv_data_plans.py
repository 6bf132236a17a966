"""Which oneDNN kernel runs a convolution's forward or backward-data pass, and the buffers it takes.

oneDNN v3.12 (torch 2.13), fp32, plain NCHW inputs; the kernel order is src/cpu/cpu_convolution_list.cpp
and the rules are written out in targets/onednn/conv.py. A plan is in bytes; `block` is the channel
block (16 on AVX512, 8 on AVX2) and `threads` the primitive's thread count (per-thread im2col
columns and the strided kernels' per-thread buffers grow with it).
"""

from __future__ import annotations

import dataclasses
from math import prod

from trainmem.targets.onednn.conv_geometry import ConvGeometry
from trainmem.targets.onednn.scratchpad import F32_BYTES, PAGE_BYTES, book, round_up


@dataclasses.dataclass(frozen=True)
class DataPlan:
    """The buffers of one forward (or backward-data) primitive: its scratchpad, the reordered
    (blocked) copies of its data input (src, or diff_dst) and of the weights, and its blocked result
    (dst, or diff_src). `nhwc`: the result is NHWC, so `mkldnn_to_dense` returns NHWC strides and
    `.contiguous()` copies it once more."""

    scratchpad: int
    data_in: int
    weights: int
    result: int
    nhwc: bool = False


def gemm_output_block(geometry: ConvGeometry) -> int:
    """Output points per im2col block: one depth plane in 3d; in 2d all of them unless the
    block would exceed ~28800 floats (then at least 450). # fitted"""
    if geometry.spatial_dims == 3:
        return geometry.out_spatial[-2] * geometry.out_spatial[-1]
    return min(geometry.out_points, max(450, 28800 // max(1, geometry.in_per_group * geometry.kernel_points)))


def gemm_columns(geometry: ConvGeometry, threads: int) -> int:
    """gemm forward/backward-data scratchpad: per-thread im2col columns (f32)."""
    if geometry.is_pointwise and not geometry.is_strided:
        return 0
    block = geometry.out_points if geometry.spatial_dims == 2 else gemm_output_block(geometry)
    return book(threads * geometry.in_per_group * geometry.kernel_points * block * F32_BYTES)


def pointwise_kernel_fits(geometry: ConvGeometry) -> bool:
    """jit_1x1: all kernel dims 1, no padding; a strided one needs the 2d "reduce to unit
    stride" copy, which was only seen taken for stride 2 with input == output * stride (3d,
    stride 3 and odd inputs went to the direct jit kernel)."""
    if not geometry.is_pointwise:
        return False
    if not geometry.is_strided:
        return True
    return (geometry.spatial_dims == 2 and max(geometry.stride) == 2
            and geometry.input_is_output_times_stride())


def _group_blocks(block: int) -> tuple[int, ...]:
    """The blocks a grouped jit kernel tries, in order: AVX512 falls back to "lower zmm" 8 and 4."""
    return (block,) if block == 8 else (block, 8, 4)


def _grouped_jit_fits(geometry: ConvGeometry, block: int) -> bool:
    return any(geometry.in_per_group % group_block == 0 and geometry.out_per_group % group_block == 0
               and geometry.pads_fit_kernel() for group_block in _group_blocks(block))


def forward_plan(geometry: ConvGeometry, dtype_bytes: int, block: int, threads: int, has_bias: bool) -> DataPlan:
    """The forward primitive oneDNN picks (jit_dw, grouped jit, jit_1x1, jit direct or gemm) and its buffers."""
    batch, size = geometry.batch, dtype_bytes
    avx2 = block == 8
    if geometry.is_depthwise and geometry.spatial_dims == 3 and not avx2:  # no 3d jit_dw: brdgmm_dw in NDHWC (measured)
        return DataPlan(0, batch * geometry.groups * geometry.in_points * size,
                        round_up(geometry.groups, 16) * geometry.kernel_points * size,
                        batch * geometry.groups * geometry.out_points * size, nhwc=True)
    if geometry.is_depthwise and geometry.pads_fit_kernel():
        channels = round_up(geometry.groups, block)
        scratchpad = book(channels * size) if has_bias and geometry.groups % block else 0
        return DataPlan(scratchpad, batch * channels * geometry.in_points * size,
                        channels * geometry.kernel_points * size, batch * channels * geometry.out_points * size)
    if geometry.groups > 1:
        if _grouped_jit_fits(geometry, block):
            return DataPlan(0, batch * geometry.in_channels * geometry.in_points * size,
                            geometry.out_channels * geometry.in_per_group * geometry.kernel_points * size,
                            batch * geometry.out_channels * geometry.out_points * size)
        return _gemm_forward(geometry, size, threads)
    in_padded, out_padded = round_up(geometry.in_channels, block), round_up(geometry.out_channels, block)
    scratchpad = book(out_padded * size) if has_bias and geometry.out_channels % block else 0  # padded bias
    if pointwise_kernel_fits(geometry):
        if geometry.is_strided:  # rtus: nthr * nb_reduce_blocking * ic_block * os
            scratchpad += book(threads * (in_padded // block) * block * geometry.out_points * F32_BYTES)
        return DataPlan(scratchpad, batch * in_padded * geometry.in_points * size, out_padded * in_padded * size,
                        batch * out_padded * geometry.out_points * size)
    if not geometry.pads_fit_kernel():
        return _gemm_forward(geometry, size, threads)
    # the "first convolution": a source with fewer channels than a block stays plain NCHW
    first = geometry.in_channels in (1, 2, 3) if avx2 else geometry.in_channels < block
    if first:
        return DataPlan(scratchpad, 0, out_padded * geometry.in_channels * geometry.kernel_points * size,
                        batch * out_padded * geometry.out_points * size)
    return DataPlan(scratchpad, batch * in_padded * geometry.in_points * size,
                    out_padded * in_padded * geometry.kernel_points * size,
                    batch * out_padded * geometry.out_points * size)


def _gemm_forward(geometry: ConvGeometry, dtype_bytes: int, threads: int) -> DataPlan:
    return DataPlan(gemm_columns(geometry, threads), 0, 0,
                    geometry.batch * geometry.out_channels * geometry.out_points * dtype_bytes)


def brgemm_strided_scratchpad(channels: int, image: tuple[int, ...], kernel: tuple[int, ...],
                              stride: tuple[int, ...], threads: int, exact: bool = True) -> int:
    """brgconv_strided backward-data scratchpad (also brg_deconv). # fitted

    Three PAGE_4K entries (batch elements, per-thread input buffer and its mask) give the
    constant 3 * 4096; per thread 24 bytes of batch elements, 8192 bytes, and a buffer of about
    one image of diff_dst (`channels` channels, `image` points) in f32 plus a halo of ~(kh+1)
    rows, at least 16384 bytes (34816 for stride 3 or when the input is not output * stride).
    Fitted on ~40 shapes (1x1/3x3/5x5/7x7, conv1d/2d/3d, strides 2-3, 1 and 2 threads): exact
    for most 1x1, within ~10-20% otherwise.
    """
    width = image[-1]
    points = prod(image)
    if kernel[-2] > 1:  # rows of halo: about kh + 1 output rows for 3x3, kh for 7x7
        points += (kernel[-2] + 1 if kernel[-2] <= 3 else kernel[-2]) * width
    if len(kernel) == 3 and kernel[0] > 1:
        points += (kernel[0] + 1) * image[-2] * width // 4
    if len(image) == 2 and image[0] == 1 and kernel[-1] > 1:  # conv1d: halo along the width
        points += 2 * (kernel[-1] + 1)
    largest_stride = max(stride)
    if largest_stride <= 2 and exact:
        floor = 16384
    else:
        floor = 34816 if largest_stride <= 3 else 4096 * largest_stride * largest_stride
    per_thread = 24 + 8192 + max(floor, F32_BYTES * channels * points)
    return 3 * PAGE_BYTES + threads * per_thread


def backward_data_plan(geometry: ConvGeometry, dtype_bytes: int, block: int, threads: int) -> DataPlan:
    """The backward-data primitive (jit_dw, brgconv_strided, grouped jit, jit_1x1, jit direct or
    gemm) and its buffers: `data_in` is diff_dst', `result` diff_src'."""
    batch, size = geometry.batch, dtype_bytes
    avx2 = block == 8
    plain_grad_input = batch * geometry.in_channels * geometry.in_points * size
    if geometry.is_depthwise and geometry.spatial_dims == 3:  # measured: gemm
        return DataPlan(gemm_columns(geometry, threads), 0, 0, plain_grad_input)
    if geometry.is_depthwise:
        channels = round_up(geometry.groups, block)
        return DataPlan(0, batch * channels * geometry.out_points * size, channels * geometry.kernel_points * size,
                        batch * channels * geometry.in_points * size)
    # avx512 brgconv_strided took groups with C_in/g % 16 == 0 and C_out/g >= 32 (measured;
    # C_out/g == 16 went to the grouped jit kernel)
    brgemm_groups = (geometry.in_per_group % 16 == 0 and geometry.out_per_group % 16 == 0
                     and geometry.out_per_group >= 32)
    if geometry.groups > 1 and not (geometry.is_strided and (avx2 or brgemm_groups)):
        if _grouped_jit_fits(geometry, block):
            return DataPlan(0, batch * geometry.out_channels * geometry.out_points * size,
                            geometry.out_channels * geometry.in_per_group * geometry.kernel_points * size,
                            plain_grad_input)
        return DataPlan(gemm_columns(geometry, threads), 0, 0, plain_grad_input)
    if geometry.is_strided and geometry.is_dilated:  # brgconv_strided has no dilation
        return DataPlan(gemm_columns(geometry, threads), 0, 0, plain_grad_input)
    if geometry.is_strided:  # avx2 also takes grouped strided convs here (measured)
        scratchpad = brgemm_strided_scratchpad(geometry.out_channels, geometry.out_spatial, geometry.kernel,
                                               geometry.stride, threads,
                                               exact=geometry.input_is_output_times_stride())
        # weights Bcda{16,32,48,64}b: C_in/g padded to the block # fitted block choice
        weights = geometry.out_channels * round_up(geometry.in_per_group, 8 if avx2 else 16)
        return DataPlan(scratchpad, batch * geometry.out_channels * geometry.out_points * size,
                        weights * geometry.kernel_points * size, plain_grad_input, nhwc=True)
    in_padded, out_padded = round_up(geometry.in_channels, block), round_up(geometry.out_channels, block)
    if geometry.is_pointwise or geometry.pads_fit_kernel():
        return DataPlan(0, batch * out_padded * geometry.out_points * size,
                        out_padded * in_padded * geometry.kernel_points * size,
                        batch * in_padded * geometry.in_points * size)
    return DataPlan(gemm_columns(geometry, threads), 0, 0, plain_grad_input)
