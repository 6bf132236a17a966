"""Kernel-internal buffers of CPU convolutions (oneDNN/ideep and the native slow kernels).

Why this exists
---------------
A fake-tensor trace sees the outputs of ``aten.convolution`` / ``aten.convolution_backward`` but
not what the real CPU kernel allocates *inside* the op through PyTorch's CPU allocator. For fp32
those buffers are often as large as the activations themselves:

* oneDNN picks "blocked" layouts (``nChw16c`` ...) for NCHW tensors, so ideep reorders the input /
  grad_output / weight into new buffers, computes into a blocked output buffer, and
  ``mkldnn_to_dense`` copies that into the real (NCHW) output at the end.
* implementations need a scratchpad (im2col columns, per-thread reduction buffers, padded
  bias, ...), allocated by ideep as one ``u8`` tensor.
* the native fallbacks (``_slow_conv2d``, ``slow_conv3d``, dilated and transposed variants, the
  per-group loop) allocate im2col columns and per-group copies.

The two public functions return ``(before, after)``: signed byte counts (+alloc / -free). ``before``
happens before the op's own outputs are allocated, ``after`` after them, and the outputs are
counted as allocated in between, at the point where the kernel allocates its last outputs.
``convolution_backward`` allocates grad_input first and grad_weight/grad_bias only after the
whole backward-weights pass (``slow_conv3d`` allocates grad_input before its grad columns); the
earlier output is represented in ``before`` by a placeholder buffer of the same size, allocated
where the kernel allocates it and freed as the last entry of ``before``. Every negative entry
frees an earlier positive entry of the same size, ``sum(before) + sum(after) == 0``, and the
running sum is the real live-bytes curve inside the op (apart from a momentary dip where the
placeholder is swapped for the traced output), so the in-op peak is reproduced.

Which backend runs (``aten/src/ATen/native/Convolution.cpp``)
-------------------------------------------------------------
``_select_conv_backend`` on CPU, for NCHW (contiguous) tensors:

* ``use_mkldnn`` (oneDNN) when mkldnn is enabled, the output padding of a transposed conv is
  smaller than its stride, and

  - fp32: ``(strided or dilated or N >= 16 or kernel is not 1x1 (last two dims) or
    get_num_threads() > 1) and (groups > 1 or (kh > 3 and kw > 3) or N > 1 or
    N*C*d2*d3 > 20480)`` (d2, d3: the first two spatial dims after conv1d is viewed as 2d;
    so a batch-1 3d conv with small N*C*D*H goes to ``slow_conv3d``);
  - bf16: always, on a CPU with AVX512BW/VL/DQ (``mkldnn_bf16_device_check``);
  - fp16 only with AVX512-FP16/AMX-FP16, fp64 never.

  Transposed convs go to ``MkldnnTranspose`` under the same rule.
* otherwise the native kernels: ``Slow2d`` (``_slow_conv2d_forward``), ``Slow3d``,
  ``SlowDilated2d/3d``, ``SlowTranspose2d/3d``. With ``groups > 1`` these run once per group on
  ``narrow``-ed slices (the input/grad_output slices are copied by ``.contiguous()``) and
  ``cat`` the results. There is no native depthwise kernel on CPU: a depthwise conv that misses
  oneDNN goes through that per-group loop.

``dtype_bytes`` 8 is fp64 (native), 4 fp32, 2 is taken as bf16. bf16 uses the fp32 layout rules
with 2-byte data buffers; that is an approximation (oneDNN has separate bf16 kernels): measured
forwards match, but the bf16 backward-weights scratchpad (f32 reduction and transposition
buffers) is not modelled and backward peaks come out ~15% low.

oneDNN v3.12 (torch 2.13) implementation choice, fp32, plain NCHW inputs
------------------------------------------------------------------------
Sources: ``src/cpu/cpu_convolution_list.cpp`` (order in which implementations are tried),
``src/cpu/x64/jit_avx512_common_conv_kernel.cpp`` (``init_conf``, ``is_1stconv``, bwd-weights
``balance``/``init_scratchpad``), ``jit_avx512_common_1x1_conv_kernel.cpp`` (1x1 ``balance``,
``rtus``), ``jit_uni_dw_conv_kernel_utils``/``jit_uni_dw_convolution`` (depthwise),
``jit_brgemm_conv_utils.cpp`` (``is_any_eligible``: brgemm convs only take ``format_kind::any``
for inference, int8/f16, AMX or plain weights, so for fp32 training they are skipped and the
``jit`` kernels with blocked layouts win), ``gemm_convolution_utils.cpp``, ``cpu_reducer.cpp``
(``reduce_balancer_t``) and ``common/memory_tracking.hpp`` (every scratchpad entry costs
``size + max(alignment, 128)`` bytes; ``PAGE_4K`` entries cost ``size + 4096``). Where a number
could not be derived it is fitted to measurements on this machine and marked ``# fitted``.
Every rule below was also checked against ``ONEDNN_VERBOSE`` output (implementation name and
memory formats) of the real ops.

With B = 16 (AVX512) or 8 (AVX2), C' = round_up(C, B), "sp" = product of the spatial dims:

forward (``mkldnn_convolution``): the kernels tried are, in order,
  depthwise (groups == C_in == C_out): ``jit_dw``, channels padded to B, blocked src/dst; a 3d
    depthwise conv runs ``brdgmm_dw`` in NDHWC (so the double copy described below).
  groups > 1: ``jit`` grouped with block B, then 8, then 4 (AVX512 "lower zmm"; the first block
    that divides C_in/g and C_out/g), blocked, no padding; otherwise ``gemm`` (plain layouts).
  all kernel dims 1, no padding: ``jit_1x1``, src/dst/weights blocked and padded to B; a
    strided 1x1 (2d, stride 2, input == output * 2) also books the "reduce to unit stride"
    buffer ``nthr * (C_in'/B) * B * out_sp * 4 + 128``; other strided 1x1 go to ``jit``.
  else ``jit`` direct, if each padding is smaller than the dilated kernel extent (else ``gemm``):
    C_in < B (AVX512; C_in in 1..3 for AVX2) is the "first convolution": the source stays plain
    NCHW (no input reorder) and only C_out is padded; otherwise src reordered to
    N*C_in'*sp. Scratchpad: the padded bias ``C_out'*4+128`` when C_out % B != 0 and bias.
  ``gemm``: no reorders, plain dst, scratchpad = per-thread im2col
    ``nthr * (C_in/g) * prod(k) * out_sp * 4 + 128``.
  ideep then allocates the (blocked) dst and ``mkldnn_to_dense`` allocates the NCHW output and
  frees the blocked one. Sequence: [+scratch, +src', +wei', +dst', -wei', -src', -scratch],
  output, [-dst'].

transposed forward (``mkldnn_convolution_transpose``, oneDNN deconvolution):
  stride 1: deconv as conv backward-data with the jit kernel, blocked, plus a dst-sized scratch
    when there is a bias.
  stride > 1: ``brg_deconv`` (brgemm strided backward-data) in NHWC: src and dst are NHWC, so
    ``mkldnn_to_dense`` returns an NHWC-strided tensor and ``.contiguous()`` copies it once more:
    [+scratch, +src_nhwc, +wei', +dst_nhwc, -wei', -src_nhwc, -scratch, +dense_nhwc], output,
    [-dense_nhwc, -dst_nhwc].

backward (``mkldnn_convolution_backward``): backward-data first (if mask[0]), then
backward-weights (if mask[1] or mask[2]), each with its own reorders.
  data: depthwise -> ``jit_dw`` (3d: ``gemm``); any stride > 1 without dilation, groups == 1
    (or C/g multiples of 16 with C_out/g >= 32; any groups on AVX2) -> ``brgconv_strided``
    (NHWC, weights ``Bcda{16,32,48,64}b`` i.e. C_in padded to that block, then the double copy
    of ``mkldnn_to_dense``); other grouped -> grouped jit (block B/8/4) else ``gemm``; 1x1 unit
    stride -> ``jit_1x1``; else ``jit`` direct (no first-conv exception: grad_input is padded),
    or ``gemm`` (padding too large, strided + dilated).
  weights: depthwise -> ``jit_dw`` (reduction over minibatch when the channel blocks can't feed
    all threads); 1x1 -> ``jit_1x1``; groups == 1 -> ``jit`` (first conv C_in in 1..3 keeps src
    plain); when the avx512 kernel refuses (4 <= C_in < 16, padding > half the kernel) ->
    ``jit:avx2`` (block 8, no dilation), else ``gemm``; grouped with C/g % 16 == 0 -> ``jit``,
    % 8 == 0 -> ``jit:avx2``, else ``gemm``.
    ideep allocates the blocked grad_weight and the grad_bias before running, and
    ``mkldnn_to_dense`` copies both at the end: [+go', +src', +gw', +scratch, +gb, -scratch,
    -src', -go', +gb_out, +gw_out, -gw', -gb].
  The ``jit`` backward-weights scratchpad follows ``init_scratchpad``/``balance`` exactly:
  ``(nthr_mb-1) * (wei' + bias') * 4 + 128`` plus a barrier (``8064 + 128`` bytes) when the
  minibatch is split, the padded bias, and the bias ``cpu_reducer`` (PAGE_4K entry + barrier)
  when it splits the reduction.

Capabilities: ``"AVX512"`` and ``"AVX2"`` were observed (AVX2 with ``ONEDNN_MAX_CPU_ISA=AVX2``
and ``ATEN_CPU_CAPABILITY=avx2``). Any other value (``"DEFAULT"``, ``"AVX512_VNNI"`` ...) falls
back to the AVX512 rule.

Threads: per-thread scratch, the backward-weights thread balance and the 1x1 backend rule use
``cpu.threads`` and the channel block uses ``cpu.capability``, both from the ``CpuInfo`` the
caller passes (targets/cpu_info.py); nothing here reads the running process.

Where each part lives: ``conv_geometry`` (the geometry and the backend choice),
``conv_data_plans`` (forward and backward-data kernels and their buffers), ``conv_weights_plan``
and ``conv_thread_balance`` (backward-weights), ``conv_mkldnn`` and ``conv_native`` (the real-time
sequences), ``conv_sequence`` (the split around the traced outputs), ``scratchpad`` (booking).

Channels-last convolutions (what Inductor hands the op) run oneDNN in NHWC with the weights reordered only:
conv_channels_last.py, for the plain 2-D ones it measured. Limits: other channels-last convolutions get the NCHW
model below, and mkldnn-layout tensors are not modelled;
scratch sizes of ``brgconv_strided`` (fitted, ~10-20%), ``gemm`` backward-weights (its
spatial blocking is fitted and wrong for large C_in/g * kernel) and the deconvolution bias
handling are approximate. Odd shapes (stride 3, tiny channel counts, dilated + strided,
transposed with few channels) were seen to miss by up to ~10% of the in-op peak.
"""

from __future__ import annotations

from math import prod

from trainmem.targets.cpu_info import CpuInfo
from trainmem.targets.onednn import conv_channels_last, conv_mkldnn, conv_native
from trainmem.targets.onednn.conv_geometry import ConvGeometry, backend_of, channel_block, uses_mkldnn

__all__ = ["conv_forward_transients", "conv_backward_transients", "conv_backend"]


def conv_backend(input_shape, weight_shape, output_shape, stride, padding, dilation, groups,
                 transposed, dtype_bytes, cpu: CpuInfo) -> str:
    """Which CPU backend aten picks: "mkldnn", "slow2d", "slow3d", "slow_dilated",
    "slow_transpose" (``_select_conv_backend`` for contiguous NCHW CPU tensors)."""
    geometry = ConvGeometry.from_op(input_shape, weight_shape, output_shape, stride, padding, dilation, groups)
    return backend_of(geometry, transposed, dtype_bytes, cpu)


def conv_forward_transients(input_shape, weight_shape, output_shape, stride, padding, dilation,
                            groups, transposed, dtype_bytes, cpu: CpuInfo, *,
                            has_bias: bool = True, channels_last: bool = False) -> tuple[list[int], list[int]]:
    """Kernel-internal buffers of one CPU ``aten.convolution`` forward.

    Shapes are those of the op (``weight_shape`` is ``[C_in, C_out/g, *k]`` when
    ``transposed``). Returns ``(before, after)``; the op's output (``prod(output_shape) *
    dtype_bytes``) is counted as allocated between them. ``has_bias`` only changes a few hundred
    bytes (padded bias), except for a stride-1 transposed conv where oneDNN adds the bias through
    a dst-sized buffer. ``cpu.threads`` sizes the per-thread scratch and enters the 1x1-kernel
    backend rule; ``cpu.capability`` "AVX2" and "AVX512" were observed, anything else uses the
    AVX512 rule.
    """
    size = int(dtype_bytes)
    geometry = ConvGeometry.from_op(input_shape, weight_shape, output_shape, stride, padding, dilation, groups)
    output_bytes = prod(int(dim) for dim in output_shape) * size
    if geometry.batch == 0 or output_bytes == 0:
        return [], []
    if channels_last and conv_channels_last.channels_last_applies(geometry, transposed, size, cpu):
        return conv_channels_last.forward(weight_shape, size)
    if uses_mkldnn(geometry, transposed, size, cpu):
        block = channel_block(cpu.capability)
        if transposed:
            return conv_mkldnn.transposed_forward(geometry, size, block, cpu.threads, has_bias, output_bytes)
        return conv_mkldnn.forward(geometry, size, block, cpu.threads, has_bias, output_bytes)
    return conv_native.forward(backend_of(geometry, transposed, size, cpu), geometry, size, output_bytes)


def conv_backward_transients(grad_output_shape, input_shape, weight_shape, stride, padding,
                             dilation, groups, transposed, output_mask, dtype_bytes,
                             cpu: CpuInfo, channels_last: bool = False) -> tuple[list[int], list[int]]:
    """Kernel-internal buffers of one CPU ``aten.convolution_backward``.

    ``output_mask`` is (grad_input, grad_weight, grad_bias). The op's outputs (grad_input =
    input-sized, grad_weight = weight-sized, grad_bias = C_out) are counted as allocated between
    ``before`` and ``after``; grad_input, which the kernel allocates before the whole
    backward-weights pass, appears in ``before`` as a same-size placeholder (see the module
    docstring). Other arguments as in :func:`conv_forward_transients`.
    """
    size = int(dtype_bytes)
    mask = tuple(bool(wanted) for wanted in output_mask)
    geometry = ConvGeometry.from_op(input_shape, weight_shape, grad_output_shape, stride, padding, dilation,
                                    groups)
    if geometry.batch == 0 or not any(mask):
        return [], []
    output_bytes = (prod(int(dim) for dim in input_shape) * size, prod(int(dim) for dim in weight_shape) * size,
                    geometry.out_channels * size)
    if channels_last and conv_channels_last.channels_last_applies(geometry, transposed, size, cpu):
        return conv_channels_last.backward(geometry, size, cpu, mask, output_bytes)
    if uses_mkldnn(geometry, transposed, size, cpu):
        block = channel_block(cpu.capability)
        if transposed:
            return conv_mkldnn.transposed_backward(geometry, size, block, cpu.threads, mask, output_bytes)
        return conv_mkldnn.backward(geometry, size, block, cpu.threads, mask, output_bytes)
    return conv_native.backward(backend_of(geometry, transposed, size, cpu), geometry, size, mask, output_bytes)
