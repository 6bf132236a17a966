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

Threads: per-thread scratch and the 1x1 backend rule use ``num_threads`` (default
``torch.get_num_threads()``, imported lazily).

Limits: channels-last inputs (no reorders at all) and mkldnn-layout tensors are not modelled;
scratch sizes of ``brgconv_strided`` (fitted, ~10-20%), ``gemm`` backward-weights (its
spatial blocking is fitted and wrong for large C_in/g * kernel) and the deconvolution bias
handling are approximate. Odd shapes (stride 3, tiny channel counts, dilated + strided,
transposed with few channels) were seen to miss by up to ~10% of the in-op peak.
"""

from __future__ import annotations

from math import prod

__all__ = ["conv_forward_transients", "conv_backward_transients", "conv_backend"]

_ALIGN = 128          # memory_tracking default_alignment: every entry costs size + 128
_PAGE = 4096          # PAGE_4K entries cost size + 4096
_BARRIER = 8064       # sizeof(simple_barrier::ctx_t) in this build: 8064 + 128 = 8192 measured
_F32 = 4              # accumulators / reduction buffers are f32 whatever the data type


# --------------------------------------------------------------------------- small helpers
def _rnd(x: int, b: int) -> int:
    return -(-x // b) * b


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _tup(v, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(x) for x in v)
    return v * n if len(v) == 1 and n > 1 else v


def _entry(nbytes: int, align: int = _ALIGN) -> int:
    """Bytes one scratchpad booking costs (memory_tracking::registry_t::book)."""
    return nbytes + max(align, _ALIGN) if nbytes > 0 else 0


def _threads(num_threads) -> int:
    if num_threads:
        return int(num_threads)
    try:  # lazily: this module does arithmetic only, torch is optional
        import torch
        return int(torch.get_num_threads())
    except Exception:  # pragma: no cover - torch missing
        return 1


def _block(cpu_capability) -> int:
    cap = str(cpu_capability or "").upper()
    return 8 if cap == "AVX2" else 16  # anything not observed -> AVX512 rule


class _Geo:
    """Convolution geometry in the conv (not deconv) sense, conv1d viewed as 2d."""

    def __init__(self, N, IC, OC, isp, osp, k, s, p, d, g):
        self.N, self.IC, self.OC, self.g = N, IC, OC, g
        self.isp, self.osp, self.k, self.s, self.p, self.d = isp, osp, k, s, p, d
        self.ICg, self.OCg = IC // g, OC // g
        self.nd = len(isp)

    @property
    def in_sp(self):
        return prod(self.isp)

    @property
    def out_sp(self):
        return prod(self.osp)

    @property
    def ks(self):
        return prod(self.k)

    @property
    def is_dw(self):
        return self.g > 1 and self.ICg == 1 and self.OCg == 1

    @property
    def is_1x1(self):
        return all(x == 1 for x in self.k) and all(x == 0 for x in self.p)

    @property
    def strided(self):
        return any(x > 1 for x in self.s)

    def pads_ok(self) -> bool:
        """jit direct kernels: each padding < dilated kernel extent (init_conf boundaries)."""
        for i in range(self.nd):
            ext = (self.k[i] - 1) * self.d[i] + 1
            lp = self.p[i]
            rp = (self.osp[i] - 1) * self.s[i] + ext - self.isp[i] - lp
            if lp >= ext or rp >= ext:
                return False
        return True


def _as_2d(isp, osp, k, s, p, d):
    if len(isp) == 1:  # aten views conv1d as conv2d with H == 1
        return (1,) + isp, (1,) + osp, (1,) + k, (1,) + s, (0,) + p, (1,) + d
    return isp, osp, k, s, p, d


def _normalize(input_shape, weight_shape, output_shape, stride, padding, dilation, groups,
               transposed):
    N, C_in = int(input_shape[0]), int(input_shape[1])
    nd = len(input_shape) - 2
    isp = tuple(int(x) for x in input_shape[2:])
    osp = tuple(int(x) for x in output_shape[2:])
    k = tuple(int(x) for x in weight_shape[2:])
    s, p, d = _tup(stride, nd), _tup(padding, nd), _tup(dilation, nd)
    g = int(groups)
    C_out = int(output_shape[1])
    isp, osp, k, s, p, d = _as_2d(isp, osp, k, s, p, d)
    return N, C_in, C_out, isp, osp, k, s, p, d, g


# --------------------------------------------------------------------------- backend choice
def conv_backend(input_shape, weight_shape, output_shape, stride, padding, dilation, groups,
                 transposed, dtype_bytes, cpu_capability, *, num_threads=None) -> str:
    """Which CPU backend aten picks: "mkldnn", "slow2d", "slow3d", "slow_dilated",
    "slow_transpose" (``_select_conv_backend`` for contiguous NCHW CPU tensors)."""
    N, C_in, C_out, isp, osp, k, s, p, d, g = _normalize(
        input_shape, weight_shape, output_shape, stride, padding, dilation, groups, transposed)
    nthr = _threads(num_threads)
    mk = _uses_mkldnn(N, C_in, isp, k, s, p, d, g, transposed, osp, dtype_bytes,
                      cpu_capability, nthr)
    if mk:
        return "mkldnn"
    if transposed:
        return "slow_transpose"
    if any(x > 1 for x in d):
        return "slow_dilated"
    return "slow3d" if len(isp) == 3 else "slow2d"


def _uses_mkldnn(N, C_in, isp, k, s, p, d, g, transposed, osp, dtype_bytes, cap, nthr) -> bool:
    if transposed:
        # output_padding = out - ((in-1)*s - 2p + d(k-1) + 1); "big" when >= stride
        for i in range(len(isp)):
            op = osp[i] - ((isp[i] - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + 1)
            if op >= s[i]:
                return False
    if dtype_bytes == 8:
        return False
    if dtype_bytes == 2:  # taken as bf16 (fp16 needs AVX512-FP16/AMX, not modelled)
        return str(cap or "").upper() not in ("AVX2", "DEFAULT", "")
    strided = any(x > 1 for x in s)
    dilated = any(x > 1 for x in d)
    kw, kh = k[-1], k[-2]
    cond1 = strided or dilated or N >= 16 or kw != 1 or kh != 1 or nthr > 1
    d2, d3 = isp[0], isp[1]
    cond2 = g > 1 or (kw > 3 and kh > 3) or N > 1 or N * C_in * d2 * d3 > 20480
    return cond1 and cond2


# --------------------------------------------------------------------------- event sequences
_OUT = "out"


def _split(seq, out_names=None):
    """Real-time sequence -> (before, after) as described in the module docstring.

    ``seq`` holds ints (transient +alloc/-free) and (_OUT, name, nbytes) markers where the
    kernel really allocates an output. The traced outputs are counted at the last run of
    adjacent markers. An output the kernel allocates earlier (grad_input before the whole
    backward-weights pass) becomes a placeholder: allocated in ``before`` where the kernel
    allocates it and freed at the end of ``before``, just before the traced outputs are counted.
    Every entry is a real alloc or a free of an earlier alloc of the same size, and the running
    sum equals the real live bytes everywhere except for that momentary dip.
    """
    seq = [e for e in seq if e]
    marks = [i for i, e in enumerate(seq) if isinstance(e, tuple)]
    if not marks:
        return seq, []
    last = marks[-1]
    first_of_run = last
    while first_of_run - 1 in marks:
        first_of_run -= 1
    before, held = [], []
    for e in seq[:first_of_run]:
        if isinstance(e, tuple):  # an output allocated earlier than the traced point
            before.append(e[2])
            held.append(e[2])
        else:
            before.append(e)
    before += [-b for b in reversed(held)]
    return before, list(seq[last + 1:])


# --------------------------------------------------------------------------- mkldnn: forward
def _gemm_os_block(G: _Geo) -> int:
    """Output points per im2col block: one depth plane in 3d; in 2d all of them unless the
    block would exceed ~28800 floats (then at least 450). # fitted"""
    if G.nd == 3:
        return G.osp[-2] * G.osp[-1]
    return min(G.out_sp, max(450, 28800 // max(1, G.ICg * G.ks)))


def _gemm_col(G: _Geo, nthr: int) -> int:
    """gemm forward/backward-data scratchpad: per-thread im2col columns (f32)."""
    if G.is_1x1 and not G.strided:
        return 0
    os_b = G.out_sp if G.nd == 2 else _gemm_os_block(G)
    return _entry(nthr * G.ICg * G.ks * os_b * _F32)


def _fwd_plan(G: _Geo, dt: int, B: int, cap: str, nthr: int, has_bias: bool):
    """(scratch, src', wei', dst', dst_is_nhwc) for a forward conv primitive."""
    N = G.N
    avx2 = B == 8
    if G.is_dw and G.nd == 3 and not avx2:  # no 3d jit_dw: brdgmm_dw in NDHWC (measured)
        return (0, N * G.g * G.in_sp * dt, _rnd(G.g, 16) * G.ks * dt, N * G.g * G.out_sp * dt,
                True)
    if G.is_dw and G.pads_ok():
        C = _rnd(G.g, B)
        S = _entry(C * dt) if has_bias and G.g % B else 0
        return S, N * C * G.in_sp * dt, C * G.ks * dt, N * C * G.out_sp * dt, False
    if G.g > 1:
        for blk in ((B,) if avx2 else (B, 8, 4)):
            if G.ICg % blk == 0 and G.OCg % blk == 0 and G.pads_ok():
                return (0, N * G.IC * G.in_sp * dt, G.OC * G.ICg * G.ks * dt,
                        N * G.OC * G.out_sp * dt, False)
        return _gemm_fwd(G, dt, nthr)
    ICp, OCp = _rnd(G.IC, B), _rnd(G.OC, B)
    S = _entry(OCp * dt) if has_bias and G.OC % B else 0
    if _jit_1x1_ok(G):
        if G.strided:  # rtus: nthr * nb_reduce_blocking * ic_block * os
            S += _entry(nthr * (ICp // B) * B * G.out_sp * _F32)
        return S, N * ICp * G.in_sp * dt, OCp * ICp * dt, N * OCp * G.out_sp * dt, False
    if not G.pads_ok():
        return _gemm_fwd(G, dt, nthr)
    first = G.IC in (1, 2, 3) if avx2 else G.IC < B
    if first:
        return S, 0, OCp * G.IC * G.ks * dt, N * OCp * G.out_sp * dt, False
    return S, N * ICp * G.in_sp * dt, OCp * ICp * G.ks * dt, N * OCp * G.out_sp * dt, False


def _jit_1x1_ok(G: _Geo) -> bool:
    """jit_1x1: all kernel dims 1, no padding; a strided one needs the 2d "reduce to unit
    stride" copy, which was only seen taken for stride 2 with input == output * stride (3d,
    stride 3 and odd inputs went to the direct jit kernel)."""
    if not G.is_1x1:
        return False
    if not G.strided:
        return True
    exact = all(G.isp[i] == G.osp[i] * G.s[i] for i in range(G.nd))
    return G.nd == 2 and max(G.s) == 2 and exact


def _gemm_fwd(G: _Geo, dt: int, nthr: int):
    return _gemm_col(G, nthr), 0, 0, G.N * G.OC * G.out_sp * dt, False


def _brg_strided_scratch(C_dd: int, osp, k, nthr: int, s=(), exact=True) -> int:
    """brgconv_strided backward-data scratchpad (also brg_deconv). # fitted

    Three PAGE_4K entries (batch elements, per-thread input buffer and its mask) give the
    constant 3 * 4096; per thread 24 bytes of batch elements, 8192 bytes, and a buffer of about
    one image of diff_dst (C_dd channels) in f32 plus a halo of ~(kh+1) rows, at least 16384
    bytes (34816 for stride 3 or when the input is not output * stride). Fitted on ~40 shapes
    (1x1/3x3/5x5/7x7, conv1d/2d/3d, strides 2-3, 1 and 2 threads): exact for most 1x1, within
    ~10-20% otherwise.
    """
    ow = osp[-1]
    img = prod(osp)
    if k[-2] > 1:  # rows of halo: about kh + 1 output rows for 3x3, kh for 7x7
        img += (k[-2] + 1 if k[-2] <= 3 else k[-2]) * ow
    if len(k) == 3 and k[0] > 1:
        img += (k[0] + 1) * osp[-2] * ow // 4
    if len(osp) == 2 and osp[0] == 1 and k[-1] > 1:  # conv1d: halo along the width
        img += 2 * (k[-1] + 1)
    smax = max(s) if s else 2
    floor = 16384 if smax <= 2 and exact else 34816 if smax <= 3 else 4096 * smax * smax
    per_thr = 24 + 8192 + max(floor, _F32 * C_dd * img)
    return 3 * _PAGE + nthr * per_thr


def _mkldnn_forward(G: _Geo, dt, B, cap, nthr, has_bias, out_bytes):
    S, X, W, Y, nhwc = _fwd_plan(G, dt, B, cap, nthr, has_bias)
    seq = [S, X, W, Y, -W, -X, -S]
    if nhwc:  # mkldnn_to_dense returns NHWC strides, .contiguous() copies once more
        seq += [out_bytes, (_OUT, "y", out_bytes), -out_bytes, -Y]
    else:
        seq += [(_OUT, "y", out_bytes), -Y]
    return _split(seq, ["y"])


def _mkldnn_transposed_forward(G: _Geo, dt, B, cap, nthr, has_bias, out_bytes):
    """G is the deconvolution: IC = deconv input channels, OC = deconv output channels."""
    N = G.N
    if G.strided and G.g == 1:  # brg_deconv == brgconv_strided backward-data, NHWC
        S = _brg_strided_scratch(G.IC, G.isp, G.k, nthr, G.s)
        X = N * G.IC * G.in_sp * dt
        W = _rnd(G.OC, 16) * G.IC * G.ks * dt  # Acdb16a.. # fitted block choice
        Y = N * G.OC * G.out_sp * dt
        seq = [S, X, W, Y, -W, -X, -S, out_bytes, (_OUT, "y", out_bytes), -out_bytes, -Y]
        return _split(seq, ["y"])
    # conv backward-data kernel run "forward": blocked like a bwd-data of the mirrored conv
    mirror = _Geo(N, G.OC, G.IC, G.osp, G.isp, G.k, G.s, G.p, G.d, G.g)
    S, GO, Wd, GI, nhwc = _bwd_data_plan(mirror, dt, B, cap, nthr)
    if has_bias and not nhwc:
        S += _entry(GI)  # deconv bias is added through a dst-sized buffer (measured)
    if nhwc:
        seq = [S, GO, Wd, GI, -Wd, -GO, -S, out_bytes, (_OUT, "y", out_bytes), -out_bytes, -GI]
    else:
        seq = [S, GO, Wd, GI, -Wd, -GO, -S, (_OUT, "y", out_bytes), -GI]
    return _split(seq, ["y"])


# --------------------------------------------------------------------------- mkldnn: backward
def _bwd_data_plan(G: _Geo, dt, B, cap, nthr):
    """(scratch, diff_dst', wei', diff_src', diff_src_is_nhwc) for backward-data."""
    N = G.N
    avx2 = B == 8
    if G.is_dw and G.nd == 3:  # measured: gemm
        return _gemm_col(G, nthr), 0, 0, N * G.IC * G.in_sp * dt, False
    if G.is_dw:
        C = _rnd(G.g, B)
        return 0, N * C * G.out_sp * dt, C * G.ks * dt, N * C * G.in_sp * dt, False
    # avx512 brgconv_strided took groups with C_in/g % 16 == 0 and C_out/g >= 32 (measured;
    # C_out/g == 16 went to the grouped jit kernel)
    brg_groups = G.ICg % 16 == 0 and G.OCg % 16 == 0 and G.OCg >= 32
    if G.g > 1 and not (G.strided and (avx2 or brg_groups)):
        for blk in ((B,) if avx2 else (B, 8, 4)):
            if G.ICg % blk == 0 and G.OCg % blk == 0 and G.pads_ok():
                return (0, N * G.OC * G.out_sp * dt, G.OC * G.ICg * G.ks * dt,
                        N * G.IC * G.in_sp * dt, False)
        return _gemm_col(G, nthr), 0, 0, N * G.IC * G.in_sp * dt, False
    if G.strided and any(x > 1 for x in G.d):  # brgconv_strided has no dilation
        return _gemm_col(G, nthr), 0, 0, N * G.IC * G.in_sp * dt, False
    if G.strided:  # avx2 also takes grouped strided convs here (measured)
        S = _brg_strided_scratch(G.OC, G.osp, G.k, nthr, G.s,
                                 exact=all(G.isp[i] == G.osp[i] * G.s[i] for i in range(G.nd)))
        W = G.OC * _rnd(G.ICg, 8 if avx2 else 16)  # Bcda{16,32,48,64}b # fitted block choice
        return S, N * G.OC * G.out_sp * dt, W * G.ks * dt, N * G.IC * G.in_sp * dt, True
    ICp, OCp = _rnd(G.IC, B), _rnd(G.OC, B)
    if G.is_1x1 or G.pads_ok():
        return 0, N * OCp * G.out_sp * dt, OCp * ICp * G.ks * dt, N * ICp * G.in_sp * dt, False
    return _gemm_col(G, nthr), 0, 0, N * G.IC * G.in_sp * dt, False


def _jit_bwd_w_balance(G: _Geo, ic_block, oc_block, nb_ic, nb_oc, nthreads):
    """jit_avx512_common_conv_bwd_weights_kernel_f32::balance (nthr_mb only)."""
    if nthreads < G.g:
        return 1
    nthr_g = G.g
    nthr = nthreads // nthr_g
    two_d = G.nd == 2 and all(x == 1 for x in G.d) and G.osp[0] > 9  # harness_2d_reduction
    ih, oh = G.isp[-2], G.osp[-2]
    iw, ow = G.isp[-1], G.osp[-1]
    id_ = G.isp[0] if G.nd == 3 else 1
    od = G.osp[0] if G.nd == 3 else 1
    ih_r, oh_r = (ih, oh) if two_d else (1, 1)
    ih_n, oh_n = (1, 1) if two_d else (ih, oh)
    nthr_oh_reduce = max(1, oh_r // 9)
    kh, kw = G.k[-2], G.k[-1]
    kd = G.k[0] if G.nd == 3 else 1
    sd = G.s[0] if G.nd == 3 else 1
    sh, sw = G.s[-2], G.s[-1]
    mb, g = G.N, G.g

    def mem(m, o, i):
        return (_div_up(mb * ih_r, m) * _div_up(g, nthr_g) * _div_up(nb_ic, i) * ic_block
                * ih_n * iw * id_ // sd // sh // sw
                + _div_up(mb * oh_r, m) * _div_up(g, nthr_g) * _div_up(nb_oc, o) * oc_block
                * oh_n * ow * od
                + 8 * _div_up(g, nthr_g) * _div_up(nb_oc, o) * _div_up(nb_ic, i)
                * kh * kw * kd * ic_block * oc_block)

    def comp(m, o, i):
        return _div_up(mb * oh_r, m) * _div_up(g, nthr_g) * _div_up(nb_oc, o) * _div_up(nb_ic, i)

    best = (1, 1, 1)
    best_mem = mem(*best)
    mb_max = min(nthr, mb * od * nthr_oh_reduce)
    for m in range(1, mb_max + 1):
        par = nthr // m
        for o in range(1, min(par, nb_oc) + 1):
            i = min(par // o, nb_ic)
            c = mem(m, o, i)
            if c <= best_mem:
                best_mem, best = c, (m, o, i)
    best_comp = comp(*best)
    for m in range(1, mb_max + 1):
        par = nthr // m
        for o in range(1, min(par, nb_oc) + 1):
            i = min(par // o, nb_ic)
            c_mem, c_comp = mem(m, o, i), comp(m, o, i)
            if (c_comp <= best_comp and c_mem < 1.1 * best_mem) or 4 * c_comp <= 3 * best_comp:
                best_comp, best = c_comp, (m, o, i)
    nthr_mb = best[0]
    if nthreads // 2 < nthr_mb < nthreads:
        nthr_mb = min(mb * od * nthr_oh_reduce, nthreads)
    return nthr_mb


def _bias_reducer(nthr, job, njobs, reduction, max_buf=None) -> int:
    """cpu_reducer_t<f32> scratch (reduce_balancer_t::balance + conf_t::init_scratchpad).
    max_buf: nthr*3*5*5*16*16 for the avx512 kernels, 1 << 21 for jit:avx2."""
    if max_buf is None:
        max_buf = nthr * 3 * 5 * 5 * 16 * 16
    min_jpg = max(1, njobs // nthr)
    max_jpg = max(1, max_buf // (nthr * job))
    ngroups = min(njobs // min_jpg, nthr)
    npg = min(nthr // ngroups, reduction)
    jub = _div_up(njobs, ngroups)
    best = njobs * job * reduction
    for c in range(min_jpg, njobs):
        cg = min(njobs // c, nthr)
        cn = min(nthr // cg, reduction)
        cu = _div_up(njobs, cg)
        if cn > 1 and cu > max_jpg:
            continue
        cc = job * cu * (_div_up(reduction, cn) + (cn != 1))
        if cc < best:
            ngroups, npg, jub, best = cg, cn, cu, cc
    if npg == 1:
        return 0
    return _entry(ngroups * (npg - 1) * jub * job * _F32, _PAGE) + _entry(ngroups * _BARRIER)


def _best_divider(value, lo, hi, find_max):
    hi = max(1, min(hi, value))
    lo = max(1, min(lo, hi))
    best, x = float("inf"), hi
    for dv in range(hi, lo - 1, -1):
        loss = (_rnd(value, dv) - value) / _rnd(value, dv)
        if (find_max and loss < best) or (not find_max and loss <= best):
            best, x = loss, dv
    return x


def _jit_1x1_bwd_w_nthr_mb(G: _Geo, B, nthreads):
    """jit_avx512_common_1x1_conv_kernel::balance (nthr_mb only)."""
    if nthreads < G.g:
        return 1
    os_ = G.out_sp
    rb = _best_divider(os_, 7, 16, True)
    nb_bcast = _div_up(G.ICg, B)
    nb_load = _div_up(G.OCg, B)
    nb_reduce = _div_up(os_, rb)
    nthr = nthreads // G.g
    sh, sw = G.s[-2], G.s[-1]

    def mem(m, o, i):
        return (_div_up(G.N * nb_reduce, m) * _div_up(nb_bcast, i) * B * rb // sh // sw
                + _div_up(G.N * nb_reduce, m) * _div_up(nb_load, o) * B * rb
                + 12 * _div_up(nb_load, o) * _div_up(nb_bcast, i) * B * B)

    best, best_mem = (1, 1, 1), mem(1, 1, 1)
    for m in range(1, min(nthr, G.N * nb_reduce) + 1):
        par = nthr // m
        for o in range(1, min(par, nb_load) + 1):
            i = min(par // o, nb_bcast)
            c = mem(m, o, i)
            if c <= best_mem:
                best_mem, best = c, (m, o, i)
    nthr_mb = best[0]
    if nthreads // 2 < nthr_mb < nthreads:
        nthr_mb = min(G.N, nthreads)
    return nthr_mb


def _bwd_w_plan(G: _Geo, dt, B, cap, nthr, with_bias):
    """(scratch, diff_dst', src', diff_wei') for backward-weights (diff_bias is exact)."""
    N = G.N
    avx2 = B == 8
    if G.is_dw and (G.nd == 3 or not _bwd_w_pads_ok(G)):
        return _gemm_bwd_w(G, dt, nthr)
    if G.is_dw:
        C = _rnd(G.g, B)
        nthr_g = min(nthr, C // B)
        nthr_mb = min(max(1, nthr // nthr_g), N)
        S = 0
        if nthr_mb > 1:
            S += _entry(C * G.ks * (nthr_mb - 1) * _F32)
            if with_bias:
                S += _entry(C * (nthr_mb - 1) * _F32)
        return S, N * C * G.out_sp * dt, N * C * G.in_sp * dt, C * G.ks * dt
    gemm = False
    if G.g > 1:
        if G.ICg % B == 0 and G.OCg % B == 0 and G.pads_ok():
            blk = B
        elif (not avx2 and G.ICg % 8 == 0 and G.OCg % 8 == 0 and G.pads_ok()
              and all(x == 1 for x in G.d)):
            return _avx2_bwd_w(G, dt, nthr, with_bias)  # jit:avx2 (block 8)
        else:
            gemm = True
        if not gemm:
            nb_ic, nb_oc = G.ICg // blk, G.OCg // blk
            nthr_mb = _jit_bwd_w_balance(G, blk, blk, nb_ic, nb_oc, nthr)
            W = G.OC * G.ICg * G.ks
            S = 0
            if nthr_mb > 1 and not avx2:
                S += _entry((nthr_mb - 1) * (W + G.OC) * _F32) + _entry(_BARRIER)
            if with_bias and not avx2:
                S += _bias_reducer(nthr, blk, G.g * nb_oc, N)
            return S, N * G.OC * G.out_sp * dt, N * G.IC * G.in_sp * dt, W * dt
    ICp, OCp = _rnd(G.IC, B), _rnd(G.OC, B)
    if not gemm and _jit_1x1_ok(G):
        nthr_mb = _jit_1x1_bwd_w_nthr_mb(G, B, nthr)
        S = 0
        if nthr_mb > 1:
            n_buf = nthr_mb if avx2 else nthr_mb - 1
            S += _entry(n_buf * OCp * ICp * _F32) + _entry(_BARRIER)
        if with_bias and G.OC % B:
            S += _entry(OCp * _F32)
        if with_bias and not avx2:
            S += _bias_reducer(nthr, B, OCp // B, G.N)
        if G.strided:  # rtus: nthr * nb_bcast_blocking * ic_block * os   (# fitted blocking)
            S += _entry(nthr * min(ICp // B, 8) * B * G.out_sp * _F32)
        return S, N * OCp * G.out_sp * dt, N * ICp * G.in_sp * dt, OCp * ICp * dt
    if not gemm:
        if avx2:  # jit:avx2 bwd-weights: no dilation; measured: the 3d case went to gemm
            if G.nd == 3 or not _avx2_bwd_w_ok(G):
                return _gemm_bwd_w(G, dt, nthr)
            return _avx2_bwd_w(G, dt, nthr, with_bias)
        if (G.IC < B and G.IC not in (1, 2, 3)) or not _bwd_w_pads_ok(G):
            # avx512 jit refuses (1st conv needs C_in <= 3, or padding): next is jit:avx2
            return (_avx2_bwd_w(G, dt, nthr, with_bias) if _avx2_bwd_w_ok(G)
                    else _gemm_bwd_w(G, dt, nthr))
    if gemm:
        return _gemm_bwd_w(G, dt, nthr)
    first = G.IC < B
    ic_block = G.IC if first else B
    ICw = G.IC if first else ICp
    nthr_mb = _jit_bwd_w_balance(G, ic_block, B, _div_up(ICw, ic_block), OCp // B, nthr)
    W = OCp * ICw * G.ks
    S = 0
    if nthr_mb > 1:
        S += _entry((nthr_mb - 1) * (W + OCp) * _F32) + _entry(_BARRIER)
    if with_bias and G.OC % B:
        S += _entry(OCp * _F32)
    if with_bias:
        S += _bias_reducer(nthr, B, OCp // B, G.N)
    X = 0 if first else N * ICp * G.in_sp * dt
    return S, N * OCp * G.out_sp * dt, X, W * dt


def _avx2_bwd_w(G: _Geo, dt, nthr, with_bias):
    """jit:avx2 backward-weights (block 8; C_in == 3 keeps src plain). Its scratchpad is the two
    cpu_reducers of jit_avx2_convolution_bwd_weights_t::init_balancers and the padded bias."""
    flat = G.g == 1 and G.IC == 3
    icp = G.ICg if flat else _rnd(G.ICg, 8)
    ocp = _rnd(G.OCg, 8)
    nb_ic, nb_oc = (1 if flat else icp // 8), ocp // 8
    od = G.osp[0] if G.nd == 3 else 1
    S = 0
    if with_bias and G.OCg % 8:
        S += _entry(G.g * ocp * _F32)
    if with_bias:
        S += _bias_reducer(nthr, 8, G.g * nb_oc, G.N, 1 << 21)
    S += _bias_reducer(nthr, G.ks * (icp if flat else 8) * 8, G.g * nb_ic * nb_oc, G.N * od,
                       1 << 21)
    X = 0 if flat else G.N * G.g * icp * G.in_sp * dt
    return S, G.N * G.g * ocp * G.out_sp * dt, X, G.g * ocp * icp * G.ks * dt


def _avx2_bwd_w_ok(G: _Geo) -> bool:
    """jit_avx2_conv_bwd_weights_kernel_f32::init_conf argument checks."""
    if any(x > 1 for x in G.d) or G.k[-1] >= 14:
        return False
    rp = (G.osp[-1] - 1) * G.s[-1] + G.k[-1] - G.isp[-1] - G.p[-1]
    if G.p[-1] >= G.k[-1] or rp >= G.k[-1]:
        return False
    for i in range(G.nd - 1):  # depth and height
        if G.k[i] > G.p[i] + G.isp[i] or G.k[i] > G.isp[i] or G.p[i] >= G.k[i]:
            return False
    return True


def _bwd_w_pads_ok(G: _Geo) -> bool:
    """Boundary checks of the jit backward-weights init_conf."""
    for i in range(G.nd):
        ext = (G.k[i] - 1) * G.d[i] + 1
        lp = G.p[i]
        rp = (G.osp[i] - 1) * G.s[i] + ext - G.isp[i] - lp
        if i == G.nd - 1:  # width
            if lp >= ext or rp >= ext or lp > 28 or rp > 28 or G.k[i] > 14:
                return False
        elif G.nd == 3 and i == 0:  # depth
            if lp >= ext or rp >= ext:
                return False
        else:  # height
            if lp > ext // 2 or rp > ext // 2:
                return False
    return True


def _gemm_bwd_w(G: _Geo, dt, nthr):
    """gemm backward-weights: per-thread im2col of a block of output points (all of them for
    small 2d images, ~450 for large ones, one depth plane in 3d) plus four weight-sized f32
    buffers. # fitted on 9 shapes (exact for all but the 2d capped one)."""
    os_b = _gemm_os_block(G)
    W = G.OC * G.ICg * G.ks
    per = (G.ICg * G.ks * os_b + 4 * W) * _F32
    reps = nthr if (G.g == 1 or G.ICg >= 4 or G.nd == 3) else 1
    return _entry(reps * per) + _ALIGN, 0, 0, W * dt


def _mkldnn_backward(G: _Geo, dt, B, cap, nthr, mask, outs):
    gi_b, gw_b, gb_b = outs
    seq = []
    if mask[0]:
        S, GO, W, GI, nhwc = _bwd_data_plan(G, dt, B, cap, nthr)
        seq += [S, GO, W, GI, -W, -GO, -S]
        if nhwc:
            seq += [gi_b, (_OUT, "gi", gi_b), -gi_b, -GI]
        else:
            seq += [(_OUT, "gi", gi_b), -GI]
    if mask[1] or mask[2]:
        S, GO, X, GW = _bwd_w_plan(G, dt, B, cap, nthr, bool(mask[2]))
        GB = G.OC * dt if mask[2] else 0
        seq += [GO, X, GW, S, GB, -S, -X, -GO]
        if mask[2]:
            seq.append((_OUT, "gb", gb_b))
        seq.append((_OUT, "gw", gw_b) if mask[1] else 0)
        seq += [-GW, -GB]
    return _split(seq, ["gi", "gw", "gb"])


def _mkldnn_transposed_backward(G: _Geo, dt, B, cap, nthr, mask, outs):
    """G is the deconvolution. Its data gradient is a forward conv of grad_output (OC channels,
    out spatial) into grad_input (IC channels); its weight gradient is a conv backward-weights
    with src and diff_dst swapped."""
    gi_b, gw_b, gb_b = outs
    mirror = _Geo(G.N, G.OC, G.IC, G.osp, G.isp, G.k, G.s, G.p, G.d, G.g)
    seq = []
    if mask[0]:
        S, GO, W, GI, nhwc = _fwd_plan(mirror, dt, B, cap, nthr, False)
        seq += [S, GO, W, GI, -W, -GO, -S]
        seq += ([gi_b, (_OUT, "gi", gi_b), -gi_b, -GI] if nhwc else [(_OUT, "gi", gi_b), -GI])
    if mask[1] or mask[2]:
        S, X, GOb, GW = _bwd_w_plan(mirror, dt, B, cap, nthr, False)
        if mask[2]:
            S += 0 if B == 8 else 128  # deconv's own diff_bias handling # fitted (measured)
        GB = G.OC * dt if mask[2] else 0
        seq += [X, GOb, GW, S, GB, -S, -GOb, -X]
        if mask[2]:
            seq.append((_OUT, "gb", gb_b))
        seq.append((_OUT, "gw", gw_b) if mask[1] else 0)
        seq += [-GW, -GB]
    return _split(seq, ["gi", "gw", "gb"])


# --------------------------------------------------------------------------- native kernels
def _slow_cols(kind, G: _Geo, dt, per_sample=False) -> int:
    n = 1 if per_sample else G.N
    if kind == "slow_transpose":
        return n * G.OCg * G.ks * G.in_sp * dt
    if kind in ("slow2d", "slow3d") and G.is_1x1 and not G.strided:
        return 0
    return n * G.ICg * G.ks * G.out_sp * dt


def _slow_forward_group(kind, G: _Geo, dt, out_g):
    """Real-time events of one (group's) native forward; out_g is an (_OUT, ...) marker or int."""
    if kind in ("slow2d", "slow3d"):
        c = _slow_cols(kind, G, dt)
        return [c, out_g, -c]
    if kind == "slow_dilated":
        c = _slow_cols(kind, G, dt, per_sample=True)
        return [out_g, c, -c]
    c = _slow_cols(kind, G, dt)  # slow_transpose: columns for the whole batch
    return [out_g, c, -c]


def _slow_backward_group(kind, G: _Geo, dt, mask, gi, gw, gb):
    seq = []
    if kind == "slow2d":
        c = _slow_cols(kind, G, dt)
        seq += [gi if mask[0] else 0, gb if mask[2] else 0, gw if mask[1] else 0]
        if mask[1]:
            seq += [c, -c]
    elif kind == "slow3d":
        c = _slow_cols(kind, G, dt)
        c_gi = G.N * G.ICg * G.ks * G.out_sp * dt  # grad columns even for 1x1x1 (measured)
        if mask[0]:
            seq += [gi, c_gi, -c_gi]
        seq += [gb if mask[2] else 0, gw if mask[1] else 0]
        if mask[1]:
            seq += [c, -c]
    elif kind == "slow_dilated":
        c = _slow_cols(kind, G, dt, per_sample=True)
        seq += [gi if mask[0] else 0, gw if mask[1] else 0, gb if mask[2] else 0]
        if mask[1] or mask[2]:
            seq += [c, G.OCg * dt, -G.OCg * dt, -c]
    else:  # slow_transpose, per-sample columns
        c = _slow_cols(kind, G, dt, per_sample=True)
        if mask[0]:
            seq += [gi, c, -c]
        seq += [gb if mask[2] else 0, gw if mask[1] else 0]
        if mask[1]:
            seq += [c, -c]
    return seq


def _group_geo(G: _Geo):
    return _Geo(G.N, G.ICg, G.OCg, G.isp, G.osp, G.k, G.s, G.p, G.d, 1)


def _slow_forward(kind, G: _Geo, dt, out_bytes):
    if G.g == 1:
        return _split(_slow_forward_group(kind, G, dt, (_OUT, "y", out_bytes)), ["y"])
    Gg = _group_geo(G)
    in_g = G.N * G.ICg * G.in_sp * dt
    out_g = G.N * G.OCg * G.out_sp * dt
    seq = []
    for _ in range(G.g):
        seq += [in_g] + _slow_forward_group(kind, Gg, dt, out_g) + [-in_g]
    seq += [(_OUT, "y", out_bytes)] + [-out_g] * G.g
    return _split(seq, ["y"])


def _slow_backward(kind, G: _Geo, dt, mask, outs):
    gi_b, gw_b, gb_b = outs
    if G.g == 1:
        seq = _slow_backward_group(kind, G, dt, mask, (_OUT, "gi", gi_b), (_OUT, "gw", gw_b),
                                   (_OUT, "gb", gb_b))
        return _split(seq, ["gi", "gw", "gb"])
    Gg = _group_geo(G)
    go_g = G.N * G.OCg * G.out_sp * dt
    in_g = G.N * G.ICg * G.in_sp * dt
    gi_g = G.N * G.ICg * G.in_sp * dt if mask[0] else 0
    gw_g = G.OCg * G.ICg * G.ks * dt if mask[1] else 0
    gb_g = G.OCg * dt if mask[2] else 0
    seq = []
    for _ in range(G.g):
        seq += [go_g, in_g] + _slow_backward_group(kind, Gg, dt, mask, gi_g, gw_g, gb_g)
        seq += [-in_g, -go_g]
    for m, name, b in ((mask[0], "gi", gi_b), (mask[1], "gw", gw_b), (mask[2], "gb", gb_b)):
        if m:
            seq.append((_OUT, name, b))
    seq += [-gi_g] * G.g + [-gb_g] * G.g + [-gw_g] * G.g
    return _split(seq, ["gi", "gw", "gb"])


# --------------------------------------------------------------------------- public API
def conv_forward_transients(input_shape, weight_shape, output_shape, stride, padding, dilation,
                            groups, transposed, dtype_bytes, cpu_capability, *,
                            has_bias: bool = True, num_threads: int | None = None,
                            ) -> tuple[list[int], list[int]]:
    """Kernel-internal buffers of one CPU ``aten.convolution`` forward.

    Shapes are those of the op (``weight_shape`` is ``[C_in, C_out/g, *k]`` when
    ``transposed``). Returns ``(before, after)``; the op's output (``prod(output_shape) *
    dtype_bytes``) is counted as allocated between them. ``has_bias`` only changes a few hundred
    bytes (padded bias), except for a stride-1 transposed conv where oneDNN adds the bias through
    a dst-sized buffer. ``num_threads`` defaults to ``torch.get_num_threads()`` (per-thread
    scratch and the 1x1-kernel backend rule depend on it). ``cpu_capability`` is
    ``torch.backends.cpu.get_cpu_capability()``; "AVX2" and "AVX512" were observed, anything
    else uses the AVX512 rule.
    """
    nthr = _threads(num_threads)
    dt = int(dtype_bytes)
    N, C_in, C_out, isp, osp, k, s, p, d, g = _normalize(
        input_shape, weight_shape, output_shape, stride, padding, dilation, groups, transposed)
    out_bytes = prod(int(x) for x in output_shape) * dt
    if N == 0 or out_bytes == 0:
        return [], []
    G = _Geo(N, C_in, C_out, isp, osp, k, s, p, d, g)
    if _uses_mkldnn(N, C_in, isp, k, s, p, d, g, transposed, osp, dt, cpu_capability, nthr):
        B = _block(cpu_capability)
        if transposed:
            return _mkldnn_transposed_forward(G, dt, B, cpu_capability, nthr, has_bias,
                                              out_bytes)
        return _mkldnn_forward(G, dt, B, cpu_capability, nthr, has_bias, out_bytes)
    kind = conv_backend(input_shape, weight_shape, output_shape, stride, padding, dilation,
                        groups, transposed, dt, cpu_capability, num_threads=nthr)
    return _slow_forward(kind, G, dt, out_bytes)


def conv_backward_transients(grad_output_shape, input_shape, weight_shape, stride, padding,
                             dilation, groups, transposed, output_mask, dtype_bytes,
                             cpu_capability, *, num_threads: int | None = None,
                             ) -> tuple[list[int], list[int]]:
    """Kernel-internal buffers of one CPU ``aten.convolution_backward``.

    ``output_mask`` is (grad_input, grad_weight, grad_bias). The op's outputs (grad_input =
    input-sized, grad_weight = weight-sized, grad_bias = C_out) are counted as allocated between
    ``before`` and ``after``; grad_input, which the kernel allocates before the whole
    backward-weights pass, appears in ``before`` as a same-size placeholder (see the module
    docstring). Other arguments as in :func:`conv_forward_transients`.
    """
    nthr = _threads(num_threads)
    dt = int(dtype_bytes)
    mask = tuple(bool(m) for m in output_mask)
    N, C_in, C_out, isp, osp, k, s, p, d, g = _normalize(
        input_shape, weight_shape, grad_output_shape, stride, padding, dilation, groups,
        transposed)
    if N == 0 or not any(mask):
        return [], []
    G = _Geo(N, C_in, C_out, isp, osp, k, s, p, d, g)
    outs = (prod(int(x) for x in input_shape) * dt, prod(int(x) for x in weight_shape) * dt,
            C_out * dt)
    if _uses_mkldnn(N, C_in, isp, k, s, p, d, g, transposed, osp, dt, cpu_capability, nthr):
        B = _block(cpu_capability)
        if transposed:
            return _mkldnn_transposed_backward(G, dt, B, cpu_capability, nthr, mask, outs)
        return _mkldnn_backward(G, dt, B, cpu_capability, nthr, mask, outs)
    kind = conv_backend(input_shape, weight_shape, grad_output_shape, stride, padding, dilation,
                        groups, transposed, dt, cpu_capability, num_threads=nthr)
    return _slow_backward(kind, G, dt, mask, outs)
