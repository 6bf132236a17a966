"""Size of the oneDNN (MKL-DNN) LSTM *workspace* that PyTorch keeps alive for backward on CPU.

Why this exists
---------------
On CPU, ``nn.LSTM`` in grad mode runs ``aten.mkldnn_rnn_layer`` once per (layer, direction).
Its 4th output is a ``uint8`` workspace tensor that autograd saves for
``mkldnn_rnn_layer_backward``. PyTorch's meta kernel (``torch/_meta_registrations.py``,
``mkldnn_rnn_layer``) returns a workspace with 0 elements, so a fake-tensor trace undercounts
memory. The real kernel (``aten/src/ATen/native/mkldnn/RNN.cpp``, ``mkldnn_rnn_layer``) allocates
``ideep::lstm_forward_training::prepare(...).workspace_desc().get_size()`` bytes, but only when
``at::GradMode::is_enabled()``. Otherwise it returns an undefined tensor (no workspace). The
``train`` argument of the op has no effect on this.

How PyTorch calls the primitive (RNN.cpp, ``mkldnn_rnn``)
----------------------------------------------------------
* One primitive per layer and per direction: ``n_layer = 1``, ``n_dir = 1``. The backward
  direction of a bidirectional LSTM is a separate call with ``reverse=True``, which becomes
  ``unidirectional_right2left`` and gives the same workspace size. The op's ``bidirectional``
  argument is only used for an output size that ``mkldnn_rnn_layer`` ignores, so it does not
  change the workspace.
* src_layer is ``[T, B, I]`` in ``tnc`` layout. The op always treats dim 0 as T, even when its
  ``batch_first`` flag is set (``mkldnn_rnn`` has already transposed). For layers after the first,
  ``I`` is ``H``, or ``2*H`` when bidirectional.
* Cell kind is ``vanilla_lstm`` with 4 gates and 2 states, no projection and no peephole.
  PyTorch always passes a bias; ``has_biases=False`` passes zeros.

Where the formula comes from (oneDNN 3.x, the v3.12 bundled with torch 2.13)
----------------------------------------------------------------------------
``src/cpu/rnn/rnn_utils.hpp``:
  * ``init_conf``: the leading dimensions (lds) of the workspace regions. The ``get_good_ld`` helper
    it uses is in ``rnn_utils.cpp``.
  * ``set_workspace_sizes``: the byte size of each region.
``src/cpu/rnn/rnn_utils.cpp``:
  * ``get_good_ld(dim, sizeof_dt)``: ``ld = rnd_up(dim, 64 / sizeof_dt)``, plus ``64 / sizeof_dt``
    more when ``ld % 256 == 0``. This keeps rows 64-byte aligned and avoids 4K aliasing.
  * ``set_offsets``: ``register_space`` rounds the running offset up to ``page_size = 4096``
    before each region. The regions, in order, are ws_gates, ws_ht, ws_states_layer,
    ws_states_iter_c, ws_diff_states_layer, ws_diff_states_iter, ws_diff_states_iter_c and
    ws_grid_comp. ``ws_states_iter`` aliases ``ws_states_layer``. The last ``register_space``
    (ws_grid_comp, size 0 for LSTM) rounds the end up to a page again. So
    ``workspace = sum(rnd_up(region_bytes, 4096))``. ws_bias is not in the workspace: it goes to
    the scratchpad, and only for int8.
``src/cpu/rnn/ref_rnn.cpp`` ``pd_t::init``: ``ws_md_ = {ws_sz} u8`` only when ``is_training``
(prop_kind forward_training; ideep's ``lstm_forward_training`` uses it). ``init_brgemm`` and
``init_ref`` both call ``set_workspace_sizes`` after ``init_conf``. ``configure_brgemm``
(``src/cpu/x64/rnn/rnn_brgemm_utils.cpp``) does not touch any workspace ld. So the size is the
same whichever implementation (ref, matmul or brgemm) is picked, and it doesn't depend on thread
count or cache heuristics.

Element types (``ref_rnn.hpp``, ``ref_rnn_common_t``): ``gates_t``, ``ht_t`` and ``src_layer_t``
are the source type. ``gemm_acc_t`` is f32 for both the f32 and bf16 primitives
(``ref_rnn_*_bf16_t = <bf16, bf16, f32>``). The c-state type is the data type of the ``cx``
tensor (``src_iter_c_dt``).

With T=seq_len, B=batch, I=input_size, H=hidden_size, s=dtype_bytes, c=cell_state_bytes and
``ld(d, e) = get_good_ld(d, e)``, the regions in bytes are:
  ws_gates              = T     * B * ld(4H, s)        * s
  ws_ht                 = T     * B * ld(H, s)         * s   (proj_ht_ld; allocated even without projection)
  ws_states_layer       = 2(T+1)* B * ld(max(I,H), s)  * s   (n_layer+1 = 2)
  ws_states_iter_c      = 2(T+1)* B * H                * c   (no padding: "not involved in GEMM")
  ws_diff_states_layer  = 2(T+1)* B * ld(max(I,H), 4)  * 4   (gemm_acc_t = f32)
  ws_diff_states_iter   = 2(T+1)* B * ld(max(I,H), 4)  * 4
  ws_diff_states_iter_c = 2(T+1)* B * H                * 4

f16 is not covered: oneDNN's CPU reference RNN refuses f16 training, and PyTorch only sends f16
LSTMs to oneDNN when grad mode is off, which allocates no workspace.

The second half of the module models the buffers the two ops allocate internally besides their
outputs (``lstm_forward_transients`` / ``lstm_backward_transients``; see the comment block there).

This module is plain arithmetic and does not import torch.
"""

from __future__ import annotations

# rnn_utils.cpp, set_offsets: `const size_t page_size = 4096;`
PAGE_SIZE = 4096
# rnn_utils.cpp, get_good_ld: rows are padded to 64 bytes, and an ld that is a multiple of 256
# elements gets one more 64-byte chunk.
_LD_ALIGN_BYTES = 64
_LD_ALIAS_ELEMS = 256
# rnn_utils.hpp: LSTM has n_gates = 4. PyTorch uses n_layer = n_dir = 1 per primitive, and
# (n_layer + 1) state slots hold the input and output of the layer.
_LSTM_GATES = 4
_N_LAYER = 1
_N_DIR = 1
# ref_rnn.hpp: gemm_acc_t is f32 for both the f32 and the bf16 primitives.
_ACC_BYTES = 4


def _rnd_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def get_good_ld(dim: int, sizeof_dt: int) -> int:
    """The ``rnn_utils::get_good_ld`` function from oneDNN (``src/cpu/rnn/rnn_utils.cpp``)."""
    ld = _rnd_up(dim, _LD_ALIGN_BYTES // sizeof_dt)
    return ld + _LD_ALIGN_BYTES // sizeof_dt if ld % _LD_ALIAS_ELEMS == 0 else ld


def lstm_workspace_regions(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    dtype_bytes: int = 4,
    cell_state_bytes: int | None = None,
) -> dict[str, int]:
    """Return the unrounded byte size of each workspace region, in ``set_offsets`` order."""
    T, B, I, H = seq_len, batch, input_size, hidden_size
    s = dtype_bytes
    c = dtype_bytes if cell_state_bytes is None else cell_state_bytes
    LD = _N_LAYER * _N_DIR  # cells that save gates: n_layer * n_dir * n_iter
    S = (_N_LAYER + 1) * _N_DIR * (T + 1)  # state slots: (n_layer+1) * n_dir * (n_iter+1)
    # init_conf: slc = I, sic = dhc = dlc = dic = H (no projection).
    states_ld = get_good_ld(max(H, I, H), s)  # max(sic, max(slc, dlc))
    diff_ld = get_good_ld(max(max(I, H), max(H, H)), _ACC_BYTES)  # max(slc,dic,sic,dhc)
    return {
        "ws_gates": LD * T * B * get_good_ld(H * _LSTM_GATES, s) * s,
        "ws_ht": LD * T * B * get_good_ld(H, s) * s,
        "ws_states_layer": S * B * states_ld * s,
        "ws_states_iter_c": S * B * H * c,
        "ws_diff_states_layer": S * B * diff_ld * _ACC_BYTES,
        "ws_diff_states_iter": S * B * diff_ld * _ACC_BYTES,
        "ws_diff_states_iter_c": S * B * H * _ACC_BYTES,
        "ws_grid_comp": 0,  # lbr-GRU only
    }


def lstm_workspace_bytes(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    bidirectional: bool = False,
    dtype_bytes: int = 4,
    cell_state_bytes: int | None = None,
) -> int:
    """Return the workspace bytes of one ``aten.mkldnn_rnn_layer`` call (LSTM, grad mode on).

    The arguments describe one call: ``input`` is ``[seq_len, batch, input_size]``.
    ``dtype_bytes`` is 4 for float32 or 2 for bfloat16. ``cell_state_bytes`` is the element size
    of ``cx`` and defaults to ``dtype_bytes``. ``bidirectional`` mirrors the op's argument and
    does not change the size: PyTorch runs each direction as its own unidirectional primitive
    (``reverse=True`` for the backward direction). A bidirectional module makes two calls per
    layer, and later layers see ``input_size = 2 * hidden_size``.
    """
    del bidirectional  # no effect on the size: n_dir is always 1 per call
    if dtype_bytes not in (2, 4):
        raise ValueError(f"dtype_bytes must be 4 (float32) or 2 (bfloat16), got {dtype_bytes}")
    if min(seq_len, batch, input_size, hidden_size) <= 0:
        raise ValueError("all sizes must be positive")
    regions = lstm_workspace_regions(
        seq_len, batch, input_size, hidden_size, dtype_bytes, cell_state_bytes
    )
    # set_offsets: each register_space rounds the running offset up to a page before adding the
    # region. The final (empty) ws_grid_comp registration rounds the total up once more.
    return sum(_rnd_up(size, PAGE_SIZE) for size in regions.values())


def lstm_module_workspace_bytes(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    num_layers: int = 1,
    bidirectional: bool = False,
    dtype_bytes: int = 4,
) -> list[int]:
    """Return the workspace of each ``mkldnn_rnn_layer`` call an ``nn.LSTM`` forward makes, in order."""
    dirs = 2 if bidirectional else 1
    out = []
    for layer in range(num_layers):
        in_size = input_size if layer == 0 else hidden_size * dirs
        for _ in range(dirs):
            out.append(
                lstm_workspace_bytes(
                    seq_len, batch, in_size, hidden_size, bidirectional, dtype_bytes
                )
            )
    return out


# ---------------------------------------------------------------------------------------------------
# Kernel-internal buffers of aten.mkldnn_rnn_layer (grad mode) and aten.mkldnn_rnn_layer_backward
# ---------------------------------------------------------------------------------------------------
#
# Besides its outputs, each op allocates buffers through PyTorch's CPU allocator that a dispatch
# mode never sees. They come from three places:
#
# 1. aten/src/ATen/native/mkldnn/RNN.cpp itself:
#    * forward, after output/hy/cy: ``bias = b_ih + b_hh`` (or ``at::zeros`` when
#      ``has_biases=False``): 4H elements of the weight dtype. Freed when the op returns.
#    * backward, before the outputs: ``grad_output.contiguous()`` or ``at::zeros_like(output)``
#      (T*B*H elements) and the same for grad_hy / grad_cy (B*H each) when the grad is undefined
#      or not contiguous; ``bias`` as above; ``at::clone(cx)`` when hx and cx share a storage.
#    * backward, for a non-f32 input, right after the outputs diff_x, diff_hx, diff_cx, diff_w1,
#      diff_w2, diff_b: f32 copies of grad_y, grad_hy and grad_cy (oneDNN wants f32 diffs).
#    * backward, last output: ``diff_b2_ = at::clone(diff_b_)``, allocated after the oneDNN call.
#      These functions treat it as an output, so the modelled peak is high by at most 16*H bytes.
# 2. ideep (include/ideep/operators/lstm.hpp), in ``lstm_forward_training::compute`` and
#    ``lstm_backward::compute``:
#    * ``weights_{layer,iter}.reorder_if_differ_in(pd.weights_*_desc())``: a copy in the
#      primitive's weight layout, only when that layout differs from PyTorch's ``ldgoi``.
#    * backward only: ``zero_init`` of diff_weights_layer, diff_weights_iter and diff_bias in the
#      primitive's layout (always new buffers), copied into the PyTorch outputs afterwards.
#    * ``tensor scratchpad(pd.scratchpad_desc())``: ideep uses ``scratchpad_mode::user``.
#    All are freed, in reverse order, when compute() returns.
# 3. oneDNN v3.12 decides those layouts and the scratchpad size:
#    * ``ref_rnn.cpp`` ``pd_t::init`` tries ``init_brgemm`` and falls back to ``init_ref``.
#      ``init_brgemm`` refuses f32 training ("f32 datatype in brgemm-based implementation"), so
#      f32 uses the ref (gemm / matmul) path. bf16 training uses brgemm (avx512_core_bf16 here).
#    * ``rnn_utils.cpp`` ``set_expected_desc``: ref path: ``ldigo`` (fwd) / ``ldgoi`` (bwd)
#      with the leading stride padded by ``set_good_strides`` = ``get_good_ld``. brgemm path:
#      ``ldgOI32o2i`` (fwd, n_block 32 = 2 * simd_w) and ``ldgIO32i2o`` (bwd, xf16).
#    * ``rnn_utils.hpp`` ``init_conf`` / ``set_workspace_sizes`` and ``rnn_utils.cpp``
#      ``set_offsets``: the scratchpad's ``key_rnn_space`` = scratch_gates, scratch_ht,
#      scratch_diff_ht (training), scratch_cell (0 for LSTM), each starting on a 4096 boundary,
#      the end rounded to 4096 too. scratch_gates holds n_iter_scratch_gates = T time steps when
#      the layer (or iter) GEMM is merged across time, else 1. ``scratch_t`` is the acc type
#      (f32) in forward and the src type in backward (``ref_rnn.hpp``, ``scratch_type``).
#    * ``ref_rnn.cpp`` ``init_scratchpad`` books key_rnn_space (perf_align 4096), three weight
#      pointer arrays (one float* each), the bias pointer array (``bias_dt_size`` void*) and the
#      nested matmul scratchpad (0 in every measured case). ``rnn_brgemm_utils.cpp``
#      ``init_scratchpad`` adds the brgemm batch (40-byte ``brgemm_batch_element_t`` per K block
#      per thread) and, for backward, the gates_blocked / src_layer / src_iter transposition
#      buffers. ``memory_tracking.hpp`` ``registry_t::book``: every entry costs its size plus
#      max(alignment, 128) bytes.
#
# Not covered (not measurable on the validation machine, an AVX512-BF16 CPU without AMX):
# AMX (bf16 uses n_block 64, K blocks of 32 and a per-thread accumulator buffer there), f16,
# int8, and the no-grad inference path (``lstm_forward_inference``: no workspace, so the states
# go into the scratchpad instead).

# memory_tracking.hpp: `enum { default_alignment = 128 };` and capacity = size + alignment.
_REGISTRY_ALIGN = 128
# ref_rnn.cpp init_scratchpad: key_rnn_space is booked with perf_align = 4096.
_RNN_SPACE_ALIGN = 4096
_PTR_BYTES = 8
# brgemm_types.hpp: brgemm_batch_element_t = {A, B} pointers + vvpad {top, bottom}
# + has_s8s8_comp_batch_pad, all 8 bytes.
_BRGEMM_BATCH_ELEM_BYTES = 40
# rnn_brgemm_utils.cpp brgemm_calc_n_block: 2 * simd_w = 2 * 64 / sizeof(float) on avx512.
_BRGEMM_FWD_N_BLOCK = 32
# rnn_brgemm_utils.cpp rnn_brgemm_t<backward>::configure_brgemm: diff_src n_block = 32 and
# diff_wei n_block = 32 without AMX; ldgIO32i2o blocks the input channels by 32.
_BRGEMM_BWD_N_BLOCK = 32
_XF16_VNNI = 2  # bf16 pairs: the "2i" / "2o" inner block and the K padding


def _num_threads(num_threads: int | None) -> int:
    """oneDNN's ``dnnl_get_max_threads()``: PyTorch's intra-op thread count."""
    if num_threads is not None:
        return int(num_threads)
    import sys

    torch = sys.modules.get("torch")  # use it if loaded; this module never imports torch
    if torch is not None:
        return int(torch.get_num_threads())
    import os

    return os.cpu_count() or 1


def _book(nbytes: int, alignment: int = _REGISTRY_ALIGN) -> int:
    """``registry_t::book``: a non-empty entry takes size + max(alignment, 128) bytes."""
    return nbytes + max(alignment, _REGISTRY_ALIGN) if nbytes else 0


def _f32(x: float) -> float:
    import struct

    return struct.unpack("f", struct.pack("f", x))[0]


def _adjust_m_block_lstm(nthr: int, M: int, N_blocks: int) -> int:
    """rnn_brgemm_utils.cpp ``adjust_m_block_lstm`` (no AMX)."""
    max_m_blocks = 4 * -(-nthr // N_blocks)
    max_M = min(24, max(1, M // max_m_blocks))
    for m in range(max_M, 3, -1):
        if M % m == 0:
            return m
    return M


def _m_block_vanilla_rnn(nthr: int, M: int, N_blocks: int, As: int, l2_bytes: int) -> int:
    """rnn_brgemm_utils.cpp ``brgemm_calc_m_block_vanilla_rnn`` (no AMX); LSTM backward uses it."""
    work_by_N = _f32(N_blocks / nthr)
    decimal = _f32(work_by_N - int(work_by_N))
    if work_by_N < 1.0:
        return _adjust_m_block_lstm(nthr, M, N_blocks)
    if not (decimal < 0.9 and decimal != 0.0):
        return M
    best, max_dec, m_block = M // 2, 0.0, M
    for m in range(M // 2, 7, -1):
        if M % m:
            continue
        work = _f32((M // m) * N_blocks / nthr)
        dec = _f32(work - int(work))
        if dec > max_dec + 0.01:
            best, max_dec = m, dec
        if dec >= 0.9 or dec == 0.0:
            return m
    if decimal < max_dec or As > 0.5 * l2_bytes:
        m_block = best
    return m_block


def _rnn_space(gates: int, ht: int, diff_ht: int) -> int:
    """rnn_utils.cpp ``set_offsets`` for the scratchpad when the workspace is separate."""
    off = _rnd_up(gates, PAGE_SIZE)  # scratch_gates at 0, scratch_ht on the next page
    off = _rnd_up(off + ht, PAGE_SIZE)  # scratch_diff_ht
    return _rnd_up(off + diff_ht, PAGE_SIZE)  # scratch_cell (0 bytes for LSTM) rounds the end


def lstm_scratchpad_bytes(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    dtype_bytes: int = 4,
    backward: bool = False,
    num_threads: int | None = None,
) -> int:
    """``pd.scratchpad_desc().get_size()`` of the oneDNN LSTM training primitive one call uses.

    f32 uses the ref path and does not depend on the thread count. bf16 uses brgemm, whose
    batch and transposition buffers grow with ``num_threads`` (default: torch's thread count).
    """
    T, B, I, H = seq_len, batch, input_size, hidden_size
    s = dtype_bytes
    G = _LSTM_GATES * H
    # ref_rnn.cpp init_scratchpad: three weight pointer arrays of n_layer*n_dir*1 float*, and the
    # bias pointer array of (n_layer*n_dir*1 * bias_dt_size) void* (bias dtype = weight dtype).
    ptrs = 3 * _book(_PTR_BYTES) + _book(s * _PTR_BYTES)
    if s == 4:
        # Ref path (init_conf). forward: merge_gemm_layer = mb < 128 (input contiguous, the
        # matmul and the gemm variants agree). backward: layer and iter GEMMs are merged.
        n_it = T if (backward or B < 128) else 1
        space = _rnn_space(
            4 * n_it * B * get_good_ld(G, 4),  # scratch_t = f32
            4 * B * get_good_ld(H, 4),  # ht_t = f32
            4 * B * get_good_ld(H, 4),  # gemm_acc_t = f32
        )
        # The nested matmul scratchpad (key_nested_multiple) was 0 in every measured case.
        return _book(space, _RNN_SPACE_ALIGN) + ptrs
    if s != 2:
        raise ValueError(f"dtype_bytes must be 4 (float32) or 2 (bfloat16), got {dtype_bytes}")
    nthr = _num_threads(num_threads)
    if not backward:
        # rnn_brgemm_t<forward>::configure_brgemm: the layer GEMM is merged over time only for
        # mb == 1 and n_iter >= 2; the layer and iter brgemms are fused when slc == sic.
        merged = B == 1 and T >= 2
        space = _rnn_space(
            4 * (T if merged else 1) * B * get_good_ld(G, 4),  # scratch_t = acc (f32)
            2 * B * get_good_ld(H, 2),  # ht_t = bf16
            4 * B * get_good_ld(H, 4),
        )
        fuse = I == H and not merged
        # k_block = K without AMX, so KB1 = KB2 = 1 and max_K_Block = 2 (x2 when fused).
        batch_elems = 2 * (2 if fuse else 1) * nthr
        return _book(space, _RNN_SPACE_ALIGN) + ptrs + _book(batch_elems * _BRGEMM_BATCH_ELEM_BYTES)
    space = _rnn_space(
        2 * B * get_good_ld(G, 2),  # scratch_t = src (bf16), not merged on the brgemm path
        2 * B * get_good_ld(H, 2),
        4 * B * get_good_ld(H, 4),
    )
    # diff_src K_blocks = n_gates * (dhc / k_block) = 4, diff_wei K_blocks = 1 -> max_K_Block 5.
    batch_elems = (_LSTM_GATES + 1) * nthr
    Kp = _rnd_up(_rnd_up(B, _XF16_VNNI), _XF16_VNNI)  # diff_wei K = rnd_up(mb, 2) for bf16 scratch
    if B > 1:  # global_transpose
        src_layer, src_iter = I * Kp, H * Kp
    else:
        if I != H:
            m_block = max(I, H)
        else:
            n_blocks = -(-G // _BRGEMM_BWD_N_BLOCK)
            # l2 only matters when 2*M*K bytes exceed half of L2: never for sane sizes.
            m_block = _m_block_vanilla_rnn(nthr, I, n_blocks, 2 * I * Kp, 2 << 20)
        src_layer, src_iter = nthr * min(m_block, I) * Kp, nthr * min(m_block, H) * Kp
    return (
        _book(space, _RNN_SPACE_ALIGN)
        + ptrs
        + _book(batch_elems * _BRGEMM_BATCH_ELEM_BYTES)
        + _book(2 * nthr * Kp * _BRGEMM_BWD_N_BLOCK)  # key_rnn_gates_blocked
        + _book(2 * src_layer)  # key_rnn_src_layer_trans
        + _book(2 * src_iter)  # key_rnn_src_iter_trans
    )


def _fwd_weight_bytes(rows: int, H: int, s: int) -> int | None:
    """Bytes of the forward weight reorder for a [4H, rows] weight, or None when none is made."""
    if s == 4:
        # ldigo, strides[2] = get_good_ld(4H). ideep compares descs; oneDNN ignores strides of
        # size-1 dims, so rows == 1 (ldgoi and ldigo agree) needs no reorder.
        return None if rows == 1 else rows * get_good_ld(_LSTM_GATES * H, 4) * 4
    # ldgOI32o2i: O padded to 32, I to 2; a blocked layout never equals PyTorch's plain one.
    return _LSTM_GATES * _rnd_up(H, _BRGEMM_FWD_N_BLOCK) * _rnd_up(rows, _XF16_VNNI) * 2


def _bwd_weight_bytes(rows: int, H: int, s: int) -> int | None:
    """Bytes of the backward weight reorder for a [4H, rows] weight, or None when none is made."""
    if s == 4:
        # ldgoi with the o stride padded to get_good_ld(rows): equal to PyTorch's ldgoi, so no
        # reorder, exactly when get_good_ld(rows) == rows.
        ld = get_good_ld(rows, 4)
        return None if ld == rows else _LSTM_GATES * H * ld * 4
    # ldgIO32i2o: I padded to 32, O to 2.
    return _LSTM_GATES * _rnd_up(rows, _BRGEMM_BWD_N_BLOCK) * _rnd_up(H, _XF16_VNNI) * 2


def _ldigo_f32_bytes(rows: int, H: int) -> int:
    """Bytes of an f32 ``ldigo`` diff-weights buffer with ``set_good_strides`` (i stride = ld(4H)).

    ``memory_desc_wrapper::size()`` takes max(padded_dim * stride) over dims and uses stride 1
    for a dim of size 1, so a single row (I == 1 or H == 1) is not padded: 4H elements.
    """
    G = _LSTM_GATES * H
    return (rows * get_good_ld(G, 4) if rows > 1 else G) * 4


def _check(dtype_bytes: int, *sizes: int) -> None:
    if dtype_bytes not in (2, 4):
        raise ValueError(f"dtype_bytes must be 4 (float32) or 2 (bfloat16), got {dtype_bytes}")
    if min(sizes) <= 0:
        raise ValueError("all sizes must be positive")


def lstm_forward_transients(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    dtype_bytes: int = 4,
    *,
    num_threads: int | None = None,
) -> tuple[list[int], list[int]]:
    """Kernel-internal buffers of one ``aten.mkldnn_rnn_layer`` call in grad mode (LSTM).

    Returns ``(before, after)``, signed byte sizes in order: ``before`` precedes the op's
    outputs (output, hy, cy, workspace), ``after`` follows them. Real order (RNN.cpp + ideep):
    output, hy, cy, **bias**, workspace, **w_layer reorder**, **w_iter reorder**,
    **scratchpad**, then frees in reverse. The bias is moved ahead of the outputs; it is alive
    across the workspace and the peak, so the peak is unchanged.
    """
    _check(dtype_bytes, seq_len, batch, input_size, hidden_size)
    T, B, I, H = seq_len, batch, input_size, hidden_size
    s = dtype_bytes
    bias = _LSTM_GATES * H * s
    bufs = [w for w in (_fwd_weight_bytes(I, H, s), _fwd_weight_bytes(H, H, s)) if w]
    bufs.append(lstm_scratchpad_bytes(T, B, I, H, s, backward=False, num_threads=num_threads))
    return [bias], bufs + [-b for b in reversed(bufs)] + [-bias]


def lstm_backward_transients(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    dtype_bytes: int = 4,
    *,
    grad_output_copied: bool = True,
    grad_hy_copied: bool = True,
    grad_cy_copied: bool = True,
    hx_cx_same_storage: bool = False,
    cell_state_bytes: int | None = None,
    num_threads: int | None = None,
) -> tuple[list[int], list[int]]:
    """Kernel-internal buffers of one ``aten.mkldnn_rnn_layer_backward`` call (LSTM).

    Returns ``(before, after)``. The op's outputs are diff_x [T,B,I], diff_w1 [4H,I],
    diff_w2 [4H,H], diff_b [4H], diff_b2 [4H], diff_hx [B,H], diff_cx [B,H], all f32.

    ``grad_*_copied``: the kernel makes its own buffer for that grad, which happens when the
    argument is None (``zeros_like``) or not contiguous (``.contiguous()``). A tracer should pass
    ``arg is None or not arg.is_contiguous()``; the defaults (all True) are the conservative
    choice and match ``nn.LSTM(batch_first=True)``'s last layer when h_n / c_n get no gradient.
    ``hx_cx_same_storage``: RNN.cpp clones cx when hx and cx share a storage.
    ``cell_state_bytes``: element size of cx (default ``dtype_bytes``).
    """
    _check(dtype_bytes, seq_len, batch, input_size, hidden_size)
    T, B, I, H = seq_len, batch, input_size, hidden_size
    s = dtype_bytes
    c = dtype_bytes if cell_state_bytes is None else cell_state_bytes
    G = _LSTM_GATES * H
    # RNN.cpp, in declaration order: grad_output, grad_hy, grad_cy, bias, cx_ clone.
    locals_ = [
        T * B * H * s if grad_output_copied else 0,
        B * H * s if grad_hy_copied else 0,
        B * H * c if grad_cy_copied else 0,
        G * s,  # bias = b_ih + b_hh (or zeros)
        B * H * c if hx_cx_same_storage else 0,
    ]
    locals_ = [b for b in locals_ if b]
    after: list[int] = []
    # RNN.cpp, non-f32 input: grad_y_, grad_hy_, grad_cy_ converted to f32 after the outputs.
    f32_diffs = [T * B * H * 4, B * H * 4, B * H * 4] if s != 4 else []
    after += f32_diffs
    # ideep lstm_backward::compute: weight reorders, zeroed diff weights / diff bias in the
    # primitive's layout (ldigo, ld = get_good_ld(4H) for f32), then the scratchpad.
    bufs = [w for w in (_bwd_weight_bytes(I, H, s), _bwd_weight_bytes(H, H, s)) if w]
    bufs += [_ldigo_f32_bytes(I, H), _ldigo_f32_bytes(H, H), G * 4]
    bufs.append(lstm_scratchpad_bytes(T, B, I, H, s, backward=True, num_threads=num_threads))
    after += bufs + [-b for b in reversed(bufs)]
    # (diff_b2_ = clone(diff_b_) is allocated here; it is an output.) Then locals die in reverse
    # declaration order: the f32 grad copies, cx_ clone, bias, grad_cy, grad_hy, grad_output.
    after += [-b for b in reversed(f32_diffs)] + [-b for b in reversed(locals_)]
    return locals_, after
