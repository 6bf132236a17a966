"""Which oneDNN kernel runs a convolution's backward-weights pass, and the buffers it takes.

jit_dw for depthwise; jit_1x1 for pointwise; the avx512 `jit` kernel for groups == 1 (a first conv
with C_in in 1..3 keeps src plain), falling back to `jit:avx2` (block 8, no dilation) where the
avx512 kernel refuses (4 <= C_in < 16, padding over half the kernel), else `gemm`; grouped convs
with C/g % 16 == 0 take `jit`, % 8 == 0 `jit:avx2`, else `gemm`. The `jit` scratchpad follows
`init_scratchpad`/`balance`: `(nthr_mb-1) * (wei' + bias') * 4 + 128` plus a barrier when the
minibatch is split, the padded bias, and the bias `cpu_reducer` when it splits the reduction.
"""

from __future__ import annotations

import dataclasses

from trainmem.targets.onednn.conv_data_plans import gemm_output_block, pointwise_kernel_fits
from trainmem.targets.onednn.conv_geometry import ConvGeometry
from trainmem.targets.onednn.conv_thread_balance import (
    jit_minibatch_threads,
    pointwise_minibatch_threads,
    reducer_scratchpad,
)
from trainmem.targets.onednn.scratchpad import BARRIER_BYTES, F32_BYTES, REGISTRY_ALIGNMENT, book, div_up, round_up

_AVX2_REDUCER_BUFFER = 1 << 21  # jit:avx2's cpu_reducer max_buffer_size


@dataclasses.dataclass(frozen=True)
class WeightsPlan:
    """The buffers of one backward-weights primitive: its scratchpad, the reordered diff_dst and
    src, and its blocked diff_weights (diff_bias is exact). For a deconvolution's weight gradient
    the geometry is mirrored and diff_dst and src trade places."""

    scratchpad: int
    diff_dst: int
    source: int
    diff_weights: int


def backward_weights_plan(geometry: ConvGeometry, dtype_bytes: int, block: int, threads: int,
                          with_bias: bool) -> WeightsPlan:
    batch, size = geometry.batch, dtype_bytes
    avx2 = block == 8
    if geometry.is_depthwise:
        if geometry.spatial_dims == 3 or not _jit_pads_fit(geometry):
            return _gemm(geometry, size, threads)
        return _depthwise(geometry, size, block, threads, with_bias)
    if geometry.groups > 1:
        if (geometry.in_per_group % block == 0 and geometry.out_per_group % block == 0
                and geometry.pads_fit_kernel()):
            return _grouped_jit(geometry, size, block, threads, with_bias)
        if (not avx2 and geometry.in_per_group % 8 == 0 and geometry.out_per_group % 8 == 0
                and geometry.pads_fit_kernel() and not geometry.is_dilated):
            return _avx2(geometry, size, threads, with_bias)  # jit:avx2 (block 8)
        return _gemm(geometry, size, threads)
    if pointwise_kernel_fits(geometry):
        return _pointwise(geometry, size, block, threads, with_bias)
    if avx2:  # jit:avx2 bwd-weights: no dilation; measured: the 3d case went to gemm
        if geometry.spatial_dims == 3 or not _avx2_fits(geometry):
            return _gemm(geometry, size, threads)
        return _avx2(geometry, size, threads, with_bias)
    if (geometry.in_channels < block and geometry.in_channels not in (1, 2, 3)) or not _jit_pads_fit(geometry):
        # the avx512 jit refuses (a first conv needs C_in <= 3, or the padding): next is jit:avx2
        return _avx2(geometry, size, threads, with_bias) if _avx2_fits(geometry) else _gemm(geometry, size, threads)
    first = geometry.in_channels < block  # the first conv keeps src plain
    ic_block = geometry.in_channels if first else block
    in_padded, out_padded = round_up(geometry.in_channels, block), round_up(geometry.out_channels, block)
    in_weights = geometry.in_channels if first else in_padded
    minibatch_threads = jit_minibatch_threads(geometry, ic_block, block, div_up(in_weights, ic_block),
                                              out_padded // block, threads)
    weights = out_padded * in_weights * geometry.kernel_points
    scratchpad = 0
    if minibatch_threads > 1:
        scratchpad += book((minibatch_threads - 1) * (weights + out_padded) * F32_BYTES) + book(BARRIER_BYTES)
    if with_bias and geometry.out_channels % block:
        scratchpad += book(out_padded * F32_BYTES)  # padded bias
    if with_bias:
        scratchpad += reducer_scratchpad(threads, block, out_padded // block, batch)
    source = 0 if first else batch * in_padded * geometry.in_points * size
    return WeightsPlan(scratchpad, batch * out_padded * geometry.out_points * size, source, weights * size)


def _depthwise(geometry: ConvGeometry, size: int, block: int, threads: int, with_bias: bool) -> WeightsPlan:
    """jit_dw: reduces over the minibatch when the channel blocks cannot feed every thread."""
    channels = round_up(geometry.groups, block)
    channel_threads = min(threads, channels // block)
    minibatch_threads = min(max(1, threads // channel_threads), geometry.batch)
    scratchpad = 0
    if minibatch_threads > 1:
        scratchpad += book(channels * geometry.kernel_points * (minibatch_threads - 1) * F32_BYTES)
        if with_bias:
            scratchpad += book(channels * (minibatch_threads - 1) * F32_BYTES)
    return WeightsPlan(scratchpad, geometry.batch * channels * geometry.out_points * size,
                       geometry.batch * channels * geometry.in_points * size,
                       channels * geometry.kernel_points * size)


def _grouped_jit(geometry: ConvGeometry, size: int, block: int, threads: int, with_bias: bool) -> WeightsPlan:
    avx2 = block == 8
    ic_blocks, oc_blocks = geometry.in_per_group // block, geometry.out_per_group // block
    minibatch_threads = jit_minibatch_threads(geometry, block, block, ic_blocks, oc_blocks, threads)
    weights = geometry.out_channels * geometry.in_per_group * geometry.kernel_points
    scratchpad = 0
    if minibatch_threads > 1 and not avx2:
        scratchpad += (book((minibatch_threads - 1) * (weights + geometry.out_channels) * F32_BYTES)
                       + book(BARRIER_BYTES))
    if with_bias and not avx2:
        scratchpad += reducer_scratchpad(threads, block, geometry.groups * oc_blocks, geometry.batch)
    return WeightsPlan(scratchpad, geometry.batch * geometry.out_channels * geometry.out_points * size,
                       geometry.batch * geometry.in_channels * geometry.in_points * size, weights * size)


def _pointwise(geometry: ConvGeometry, size: int, block: int, threads: int, with_bias: bool) -> WeightsPlan:
    avx2 = block == 8
    in_padded, out_padded = round_up(geometry.in_channels, block), round_up(geometry.out_channels, block)
    minibatch_threads = pointwise_minibatch_threads(geometry, block, threads)
    scratchpad = 0
    if minibatch_threads > 1:
        buffers = minibatch_threads if avx2 else minibatch_threads - 1
        scratchpad += book(buffers * out_padded * in_padded * F32_BYTES) + book(BARRIER_BYTES)
    if with_bias and geometry.out_channels % block:
        scratchpad += book(out_padded * F32_BYTES)
    if with_bias and not avx2:
        scratchpad += reducer_scratchpad(threads, block, out_padded // block, geometry.batch)
    if geometry.is_strided:  # rtus: nthr * nb_bcast_blocking * ic_block * os   (# fitted blocking)
        scratchpad += book(threads * min(in_padded // block, 8) * block * geometry.out_points * F32_BYTES)
    return WeightsPlan(scratchpad, geometry.batch * out_padded * geometry.out_points * size,
                       geometry.batch * in_padded * geometry.in_points * size, out_padded * in_padded * size)


def _avx2(geometry: ConvGeometry, size: int, threads: int, with_bias: bool) -> WeightsPlan:
    """jit:avx2 backward-weights (block 8; C_in == 3 keeps src plain). Its scratchpad is the two
    cpu_reducers of jit_avx2_convolution_bwd_weights_t::init_balancers and the padded bias."""
    groups = geometry.groups
    flat = groups == 1 and geometry.in_channels == 3
    in_padded = geometry.in_per_group if flat else round_up(geometry.in_per_group, 8)
    out_padded = round_up(geometry.out_per_group, 8)
    ic_blocks, oc_blocks = (1 if flat else in_padded // 8), out_padded // 8
    out_depth = geometry.out_spatial[0] if geometry.spatial_dims == 3 else 1
    scratchpad = 0
    if with_bias and geometry.out_per_group % 8:
        scratchpad += book(groups * out_padded * F32_BYTES)
    if with_bias:
        scratchpad += reducer_scratchpad(threads, 8, groups * oc_blocks, geometry.batch, _AVX2_REDUCER_BUFFER)
    scratchpad += reducer_scratchpad(threads, geometry.kernel_points * (in_padded if flat else 8) * 8,
                                     groups * ic_blocks * oc_blocks, geometry.batch * out_depth, _AVX2_REDUCER_BUFFER)
    source = 0 if flat else geometry.batch * groups * in_padded * geometry.in_points * size
    return WeightsPlan(scratchpad, geometry.batch * groups * out_padded * geometry.out_points * size, source,
                       groups * out_padded * in_padded * geometry.kernel_points * size)


def _avx2_fits(geometry: ConvGeometry) -> bool:
    """jit_avx2_conv_bwd_weights_kernel_f32::init_conf argument checks."""
    kernel_w, pad_w = geometry.kernel[-1], geometry.padding[-1]
    if geometry.is_dilated or kernel_w >= 14:
        return False
    if pad_w >= kernel_w or geometry.right_padding(-1, kernel_w) >= kernel_w:
        return False
    for dim in range(geometry.spatial_dims - 1):  # depth and height
        kernel, pad, size = geometry.kernel[dim], geometry.padding[dim], geometry.in_spatial[dim]
        if kernel > pad + size or kernel > size or pad >= kernel:
            return False
    return True


def _jit_pads_fit(geometry: ConvGeometry) -> bool:
    """Boundary checks of the jit backward-weights init_conf."""
    for dim in range(geometry.spatial_dims):
        extent = geometry.dilated_extent(dim)
        left, right = geometry.padding[dim], geometry.right_padding(dim, extent)
        if dim == geometry.spatial_dims - 1:  # width
            if left >= extent or right >= extent or left > 28 or right > 28 or geometry.kernel[dim] > 14:
                return False
        elif geometry.spatial_dims == 3 and dim == 0:  # depth
            if left >= extent or right >= extent:
                return False
        elif left > extent // 2 or right > extent // 2:  # height
            return False
    return True


def _gemm(geometry: ConvGeometry, size: int, threads: int) -> WeightsPlan:
    """gemm backward-weights: per-thread im2col of a block of output points (all of them for
    small 2d images, ~450 for large ones, one depth plane in 3d) plus four weight-sized f32
    buffers. # fitted on 9 shapes (exact for all but the 2d capped one)."""
    block = gemm_output_block(geometry)
    weights = geometry.out_channels * geometry.in_per_group * geometry.kernel_points
    per_thread = (geometry.in_per_group * geometry.kernel_points * block + 4 * weights) * F32_BYTES
    copies = threads if (geometry.groups == 1 or geometry.in_per_group >= 4 or geometry.spatial_dims == 3) else 1
    return WeightsPlan(book(copies * per_thread) + REGISTRY_ALIGNMENT, 0, 0, weights * size)
