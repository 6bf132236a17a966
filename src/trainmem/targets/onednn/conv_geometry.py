"""A CPU convolution's geometry, and which backend aten runs it with.

The geometry is in the convolution (not deconvolution) sense, with conv1d viewed as conv2d of height
1, as aten does before it calls oneDNN or the native kernels. The backend choice is
`_select_conv_backend` (aten/src/ATen/native/Convolution.cpp) for contiguous NCHW CPU tensors; see
targets/onednn/conv.py for the rule in words.
"""

from __future__ import annotations

import dataclasses
from math import prod

from trainmem.targets.cpu_info import CpuInfo


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    batch: int
    in_channels: int
    out_channels: int
    in_spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    @classmethod
    def from_op(cls, input_shape, weight_shape, output_shape, stride, padding, dilation,
                groups) -> ConvGeometry:
        """From the shapes and arguments of `aten.convolution` (or its backward)."""
        spatial_dims = len(input_shape) - 2
        geometry = cls(
            batch=int(input_shape[0]), in_channels=int(input_shape[1]), out_channels=int(output_shape[1]),
            in_spatial=tuple(int(size) for size in input_shape[2:]),
            out_spatial=tuple(int(size) for size in output_shape[2:]),
            kernel=tuple(int(size) for size in weight_shape[2:]),
            stride=_per_dim(stride, spatial_dims), padding=_per_dim(padding, spatial_dims),
            dilation=_per_dim(dilation, spatial_dims), groups=int(groups))
        if spatial_dims == 1:  # aten views conv1d as conv2d with H == 1
            geometry = dataclasses.replace(
                geometry, in_spatial=(1,) + geometry.in_spatial, out_spatial=(1,) + geometry.out_spatial,
                kernel=(1,) + geometry.kernel, stride=(1,) + geometry.stride,
                padding=(0,) + geometry.padding, dilation=(1,) + geometry.dilation)
        return geometry

    @property
    def in_per_group(self) -> int:
        return self.in_channels // self.groups

    @property
    def out_per_group(self) -> int:
        return self.out_channels // self.groups

    @property
    def spatial_dims(self) -> int:
        return len(self.in_spatial)

    @property
    def in_points(self) -> int:
        return prod(self.in_spatial)

    @property
    def out_points(self) -> int:
        return prod(self.out_spatial)

    @property
    def kernel_points(self) -> int:
        return prod(self.kernel)

    @property
    def is_depthwise(self) -> bool:
        return self.groups > 1 and self.in_per_group == 1 and self.out_per_group == 1

    @property
    def is_pointwise(self) -> bool:
        """Every kernel dim 1 and no padding (oneDNN's "1x1" convolution)."""
        return all(size == 1 for size in self.kernel) and all(pad == 0 for pad in self.padding)

    @property
    def is_strided(self) -> bool:
        return any(step > 1 for step in self.stride)

    @property
    def is_dilated(self) -> bool:
        return any(step > 1 for step in self.dilation)

    def input_is_output_times_stride(self) -> bool:
        return all(self.in_spatial[dim] == self.out_spatial[dim] * self.stride[dim]
                   for dim in range(self.spatial_dims))

    def right_padding(self, dim: int, extent: int) -> int:
        """The padding past the input's end that the output needs along `dim`, for a kernel `extent`."""
        return ((self.out_spatial[dim] - 1) * self.stride[dim] + extent - self.in_spatial[dim]
                - self.padding[dim])

    def dilated_extent(self, dim: int) -> int:
        return (self.kernel[dim] - 1) * self.dilation[dim] + 1

    def pads_fit_kernel(self) -> bool:
        """The jit direct kernels' init_conf boundaries: each padding is below the dilated kernel extent."""
        for dim in range(self.spatial_dims):
            extent = self.dilated_extent(dim)
            if self.padding[dim] >= extent or self.right_padding(dim, extent) >= extent:
                return False
        return True

    def mirrored(self) -> ConvGeometry:
        """Input and output swapped: a deconvolution as the convolution whose backward-data it runs."""
        return dataclasses.replace(self, in_channels=self.out_channels, out_channels=self.in_channels,
                                   in_spatial=self.out_spatial, out_spatial=self.in_spatial)

    def one_group(self) -> ConvGeometry:
        """One group's convolution, as the native kernels' per-group loop runs it."""
        return dataclasses.replace(self, in_channels=self.in_per_group, out_channels=self.out_per_group,
                                   groups=1)


def _per_dim(value, spatial_dims: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * spatial_dims
    values = tuple(int(item) for item in value)
    return values * spatial_dims if len(values) == 1 and spatial_dims > 1 else values


def channel_block(capability: str) -> int:
    """oneDNN's channel block: 8 floats per vector register on AVX2, 16 on AVX512. A capability not
    observed ("DEFAULT", "AVX512_VNNI", ...) takes the AVX512 rule."""
    return 8 if str(capability or "").upper() == "AVX2" else 16


def uses_mkldnn(geometry: ConvGeometry, transposed: bool, dtype_bytes: int, cpu: CpuInfo) -> bool:
    """`use_mkldnn` of `_select_conv_backend` for contiguous NCHW CPU tensors."""
    if transposed:
        # output_padding = out - ((in-1)*s - 2p + d(k-1) + 1); a "big" one (>= stride) misses oneDNN
        for dim in range(geometry.spatial_dims):
            output_padding = geometry.out_spatial[dim] - (
                (geometry.in_spatial[dim] - 1) * geometry.stride[dim] - 2 * geometry.padding[dim]
                + geometry.dilation[dim] * (geometry.kernel[dim] - 1) + 1)
            if output_padding >= geometry.stride[dim]:
                return False
    if dtype_bytes == 8:
        return False
    if dtype_bytes == 2:  # taken as bf16 (fp16 needs AVX512-FP16/AMX, not modelled)
        return str(cpu.capability or "").upper() not in ("AVX2", "DEFAULT", "")
    kernel_h, kernel_w = geometry.kernel[-2], geometry.kernel[-1]
    batch = geometry.batch
    worth_it = (geometry.is_strided or geometry.is_dilated or batch >= 16 or kernel_w != 1 or kernel_h != 1
                or cpu.threads > 1)
    first_two = geometry.in_spatial[0] * geometry.in_spatial[1]  # d2, d3 of the 2d-viewed input
    large_enough = (geometry.groups > 1 or (kernel_w > 3 and kernel_h > 3) or batch > 1
                    or batch * geometry.in_channels * first_two > 20480)
    return worth_it and large_enough


def backend_of(geometry: ConvGeometry, transposed: bool, dtype_bytes: int, cpu: CpuInfo) -> str:
    """"mkldnn", "slow2d", "slow3d", "slow_dilated" or "slow_transpose"."""
    if uses_mkldnn(geometry, transposed, dtype_bytes, cpu):
        return "mkldnn"
    if transposed:
        return "slow_transpose"
    if geometry.is_dilated:
        return "slow_dilated"
    return "slow3d" if geometry.spatial_dims == 3 else "slow2d"
