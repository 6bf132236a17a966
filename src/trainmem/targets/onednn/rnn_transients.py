"""Kernel-internal buffers of aten.mkldnn_rnn_layer (grad mode) and aten.mkldnn_rnn_layer_backward.

Besides its outputs, each op allocates buffers through PyTorch's CPU allocator that a dispatch
mode never sees. They come from three places:

1. aten/src/ATen/native/mkldnn/RNN.cpp itself:
   * forward, after output/hy/cy: ``bias = b_ih + b_hh`` (or ``at::zeros`` when
     ``has_biases=False``): 4H elements of the weight dtype. Freed when the op returns.
   * backward, before the outputs: ``grad_output.contiguous()`` or ``at::zeros_like(output)``
     (T*B*H elements) and the same for grad_hy / grad_cy (B*H each) when the grad is undefined
     or not contiguous; ``bias`` as above; ``at::clone(cx)`` when hx and cx share a storage.
   * backward, for a non-f32 input, right after the outputs diff_x, diff_hx, diff_cx, diff_w1,
     diff_w2, diff_b: f32 copies of grad_y, grad_hy and grad_cy (oneDNN wants f32 diffs).
   * backward, last output: ``diff_b2_ = at::clone(diff_b_)``, allocated after the oneDNN call.
     These functions treat it as an output, so the modelled peak is high by at most 16*H bytes.
2. ideep (include/ideep/operators/lstm.hpp), in ``lstm_forward_training::compute`` and
   ``lstm_backward::compute``:
   * ``weights_{layer,iter}.reorder_if_differ_in(pd.weights_*_desc())``: a copy in the
     primitive's weight layout, only when that layout differs from PyTorch's ``ldgoi``.
   * backward only: ``zero_init`` of diff_weights_layer, diff_weights_iter and diff_bias in the
     primitive's layout (always new buffers), copied into the PyTorch outputs afterwards.
   * ``tensor scratchpad(pd.scratchpad_desc())``: ideep uses ``scratchpad_mode::user``.
   All are freed, in reverse order, when compute() returns.
3. oneDNN v3.12 decides those layouts and the scratchpad size (older releases, oneDNN 3.5 of
   torch 2.6, book three more entries: rnn_layout.py):
   * ``ref_rnn.cpp`` ``pd_t::init`` tries ``init_brgemm`` and falls back to ``init_ref``.
     ``init_brgemm`` refuses f32 training ("f32 datatype in brgemm-based implementation"), so
     f32 uses the ref (gemm / matmul) path. bf16 training uses brgemm where the CPU has AVX512-BF16
     (``rnn_brgemm_utils.cpp`` ``brgemm_calc_isa`` asks for avx512_core_bf16 for bf16) and the ref
     path otherwise (measured on an AVX512 CPU without it: Ice Lake).
   * ``rnn_utils.cpp`` ``set_expected_desc``: ref path: ``ldigo`` (fwd) / ``ldgoi`` (bwd)
     with the leading stride padded by ``set_good_strides`` = ``get_good_ld`` (of the weights'
     own element size: bf16 weights stay bf16 on the ref path). brgemm path:
     ``ldgOI32o2i`` (fwd, n_block 32 = 2 * simd_w; ``ldgOI64o2i`` on AMX when H % 64 == 0, the
     same bytes) and ``ldgIO32i2o`` (bwd, xf16).
   * ``rnn_utils.hpp`` ``init_conf`` / ``set_workspace_sizes`` and ``rnn_utils.cpp``
     ``set_offsets``: the scratchpad's ``key_rnn_space`` = scratch_gates, scratch_ht,
     scratch_diff_ht (training), scratch_cell (0 for LSTM), each starting on a 4096 boundary,
     the end rounded to 4096 too. scratch_gates holds n_iter_scratch_gates = T time steps when
     the layer (or iter) GEMM is merged across time, else 1. ``scratch_t`` is the acc type
     (f32) in forward and the src type in backward (``ref_rnn.hpp``, ``scratch_type``).
   * ``ref_rnn.cpp`` ``init_scratchpad`` books key_rnn_space (perf_align 4096), three weight
     pointer arrays (one float* each), the bias pointer array (``bias_dt_size`` void*) and the
     nested matmul scratchpad (0 in every measured case). ``rnn_brgemm_utils.cpp``
     ``init_scratchpad`` adds the brgemm batch (40-byte ``brgemm_batch_element_t`` per K block
     per thread) and, for backward, the gates_blocked / src_layer / src_iter transposition
     buffers. ``memory_tracking.hpp`` ``registry_t::book``: every entry costs its size plus
     max(alignment, 128) bytes.
   * AMX (``cpu.amx``: Sapphire Rapids and later): ``brgemm_calc_isa`` runs a bf16 GEMM on
     avx512_core_amx when its K block min(K1, K2, 32) and both tails are even, else on
     avx512_core_bf16 as without AMX (forward K1 = I, K2 = H; backward diff_src K = H, diff_wei
     K = rnd_up(B, 2), each decided on its own). On AMX the K blocks multiply the brgemm batch,
     n_block becomes 64 where N % 64 == 0, ``adjust_m_block_lstm`` allows m blocks up to 64, and
     ``init_scratchpad`` books key_brgemm_primitive_buffer, an m_block x n_block f32 accumulator
     per thread. Byte-exact on a Sapphire Rapids for 29 shapes at 1 to 4 threads, forward and
     backward; so are the paths without AMX and without AVX512-BF16 there, under
     ONEDNN_MAX_CPU_ISA (tests/data/onednn_lstm records them, checked on every machine).

Not covered: f16 (AMX-FP16 / avx512_core_fp16 kernels), int8, the bf32 (f32 on AMX) inference
path, GRU / vanilla RNN, LSTM projection and peepholes, and the no-grad inference path
(``lstm_forward_inference``: no workspace, so the states go into the scratchpad instead). The
m_block heuristics read the per-core L2 size, taken as 2 MiB (Sapphire Rapids, and where it
matters at all: only for large B * max(I, H)).

The bf16 brgemm scratchpad grows with the thread count, which comes in as `cpu.threads` (a
`CpuInfo`, targets/cpu_info.py), the path follows `cpu.avx512_bf16` and `cpu.amx`, and the layout
follows `cpu.onednn_version` (when None, the oneDNN of the running torch, read once by onednn/version.py).
"""

from __future__ import annotations

import struct

from trainmem.targets.cpu_info import CpuInfo
from trainmem.targets.onednn.rnn_layout import RnnLayout, rnn_layout
from trainmem.targets.onednn.rnn_workspace import LSTM_GATES, check_sizes, get_good_ld
from trainmem.targets.onednn.scratchpad import PAGE_BYTES, book, div_up, round_up

# ref_rnn.cpp init_scratchpad: key_rnn_space is booked with perf_align = 4096.
_RNN_SPACE_ALIGNMENT = 4096
_POINTER_BYTES = 8
# brgemm_types.hpp: brgemm_batch_element_t = {A, B} pointers + vvpad {top, bottom}
# + has_s8s8_comp_batch_pad, all 8 bytes.
_BRGEMM_BATCH_ELEMENT_BYTES = 40
# rnn_brgemm_utils.cpp brgemm_calc_n_block: 2 * simd_w = 2 * 64 / sizeof(float) on avx512; 64 on AMX
# when N % 64 == 0. rnn_brgemm_t<backward>::configure_brgemm: diff_src n_block = 32 always, diff_wei
# n_block = 64 on AMX when N = 4H is a multiple of 64, else 32. ldgIO32i2o blocks the input channels by 32.
_BRGEMM_N_BLOCK = 32
_AMX_N_BLOCK = 64
# rnn_brgemm_utils.cpp brgemm_calc_k_block_amx: max_row_width = 32 for bf16 (an AMX tile row of 64 bytes).
_AMX_K_BLOCK = 32
_XF16_VNNI = 2  # bf16 pairs: the "2i" / "2o" inner block and the K padding
# platform::get_per_core_cache_size(2). Only the m_block heuristics read it, and only for large M*K.
_L2_BYTES = 2 << 20


def _as_f32(value: float) -> float:
    """`value` rounded to a C float, as oneDNN's float arithmetic in the blocking heuristics sees it."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _amx_k_block(k1: int, k2: int, cpu: CpuInfo) -> int | None:
    """The K block of bf16 brgemm kernels on AMX, or None where oneDNN picks avx512_core_bf16 instead.

    rnn_brgemm_utils.cpp ``brgemm_calc_isa``: with AMX (``has_amx_support``), ``brgemm_calc_k_block_amx``
    gives both GEMMs one block min(K1, K2, 32); AMX is refused when that block or either tail is odd
    (the bf16 VNNI granularity is 2), and the kernels fall back to avx512_core_bf16 with k_block = K.
    """
    if not cpu.amx:
        return None
    k_block = min(k1, k2, _AMX_K_BLOCK)
    if k_block % _XF16_VNNI or (k1 % k_block) % _XF16_VNNI or (k2 % k_block) % _XF16_VNNI:
        return None
    return k_block


def _adjust_m_block_lstm(threads: int, rows: int, n_blocks: int, amx: bool) -> int:
    """rnn_brgemm_utils.cpp ``adjust_m_block_lstm``: AMX allows blocks up to 64 rows over fewer blocks."""
    max_m_blocks = (1 if amx else 4) * div_up(threads, n_blocks)
    max_m_block = min(64 if amx else 24, max(1, rows // max_m_blocks))
    for m_block in range(max_m_block, 3, -1):
        if rows % m_block == 0:
            return m_block
    return rows


def _m_block_lstm(threads: int, rows: int, n_blocks: int, ac_bytes: int, amx: bool) -> int:
    """rnn_brgemm_utils.cpp ``brgemm_calc_m_block_lstm`` (bf16, forward): all rows unless the N blocks
    leave threads idle (or A and C outgrow 60% of L2)."""
    work_by_n = _as_f32(n_blocks / threads)
    if work_by_n > 2.0 or (work_by_n > 1.0 and ac_bytes < 0.6 * _L2_BYTES):
        return rows
    return _adjust_m_block_lstm(threads, rows, n_blocks, amx)


def _m_block_vanilla_rnn(threads: int, rows: int, n_blocks: int, a_bytes: int, amx: bool) -> int:
    """rnn_brgemm_utils.cpp ``brgemm_calc_m_block_vanilla_rnn``; LSTM backward uses it."""
    work_by_n = _as_f32(n_blocks / threads)
    fraction = _as_f32(work_by_n - int(work_by_n))
    if work_by_n < 1.0:
        return _adjust_m_block_lstm(threads, rows, n_blocks, amx)
    if not (fraction < 0.9 and fraction != 0.0):
        return rows
    best, best_fraction, m_block = rows // 2, 0.0, rows
    for candidate in range(rows // 2, 7, -1):
        if rows % candidate:
            continue
        work = _as_f32((rows // candidate) * n_blocks / threads)
        candidate_fraction = _as_f32(work - int(work))
        if candidate_fraction > best_fraction + 0.01:
            best, best_fraction = candidate, candidate_fraction
        if candidate_fraction >= 0.9 or candidate_fraction == 0.0:
            return candidate
    if fraction < best_fraction or a_bytes > 0.5 * _L2_BYTES:
        m_block = best
    return m_block


def _amx_accumulator(threads: int, m_block: int, n_block: int) -> int:
    """rnn_brgemm_utils.cpp ``rnn_brgemm_base_t::init_scratchpad``: where the cell runs on AMX
    (``is_cell_amx``), key_brgemm_primitive_buffer holds an m_block x n_block f32 (gemm_acc_t) tile
    store per thread, the ``amx_scratchpad`` ref_rnn.cpp hands to every cell."""
    return book(threads * m_block * n_block * 4)


def _rnn_space(gates: int, ht: int, diff_ht: int) -> int:
    """rnn_utils.cpp ``set_offsets`` for the scratchpad when the workspace is separate."""
    offset = round_up(gates, PAGE_BYTES)  # scratch_gates at 0, scratch_ht on the next page
    offset = round_up(offset + ht, PAGE_BYTES)  # scratch_diff_ht
    return round_up(offset + diff_ht, PAGE_BYTES)  # scratch_cell (0 bytes for LSTM) rounds the end


def _uses_brgemm(dtype_bytes: int, cpu: CpuInfo) -> bool:
    """Whether oneDNN runs this LSTM's training on brgemm kernels: bf16 on an AVX512-BF16 CPU. f32
    training never does (``init_brgemm`` refuses it) and bf16 without the instructions takes the ref path."""
    return dtype_bytes == 2 and cpu.avx512_bf16


def _rnn_space_booking(layout: RnnLayout, sizes: tuple[int, int, int], element_bytes: tuple[int, int, int]) -> int:
    """Bytes key_rnn_space costs, plus, in older oneDNN (rnn_layout.py), the three bookings that
    repeat scratch_gates, scratch_ht and scratch_diff_ht multiplied by the element size of
    scratch_t, ht_t and gemm_acc_t (a byte count booked as an element count)."""
    total = book(_rnn_space(*sizes), _RNN_SPACE_ALIGNMENT)
    if layout.typed_scratch_bookings:
        total += sum(book(nbytes * element) for nbytes, element in zip(sizes, element_bytes))
    return total


def lstm_scratchpad_bytes(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    dtype_bytes: int,
    cpu: CpuInfo,
    *,
    backward: bool = False,
) -> int:
    """``pd.scratchpad_desc().get_size()`` of the oneDNN LSTM training primitive one call uses.

    f32, and bf16 on a CPU without AVX512-BF16, use the ref path, which does not depend on the
    thread count. bf16 with AVX512-BF16 uses brgemm, whose batch and transposition buffers (and,
    with ``cpu.amx``, accumulators) grow with ``cpu.threads``. ``cpu.onednn_version`` picks the
    layout (rnn_layout.py).
    """
    layout = rnn_layout(cpu.onednn_version)
    size = dtype_bytes
    gate_rows = LSTM_GATES * hidden_size
    # ref_rnn.cpp init_scratchpad: three weight pointer arrays of n_layer*n_dir*1 float*, and the
    # bias pointer array of (n_layer*n_dir*1 * bias_dt_size) void* (bias dtype = weight dtype).
    pointers = 3 * book(_POINTER_BYTES) + book(size * _POINTER_BYTES)
    if size not in (2, 4):
        raise ValueError(f"dtype_bytes must be 4 (float32) or 2 (bfloat16), got {dtype_bytes}")
    if not _uses_brgemm(size, cpu):
        # Ref path (init_conf). forward: merge_gemm_layer = mb < 128 (input contiguous, the
        # matmul and the gemm variants agree). backward: layer and iter GEMMs are merged.
        # ref_rnn.hpp: scratch_t is the acc type (f32) forward and the src type backward; ht_t
        # is the src type; gemm_acc_t is f32.
        gate_steps = seq_len if (backward or batch < 128) else 1
        scratch = size if backward else 4
        space = _rnn_space_booking(layout, (
            scratch * gate_steps * batch * get_good_ld(gate_rows, scratch),  # scratch_t
            size * batch * get_good_ld(hidden_size, size),  # ht_t
            4 * batch * get_good_ld(hidden_size, 4),  # gemm_acc_t = f32
        ), (scratch, size, 4))
        # The nested matmul scratchpad (key_nested_multiple) was 0 in every measured case.
        return space + pointers
    if not backward:
        # rnn_brgemm_t<forward>::configure_brgemm: the layer GEMM is merged over time only for
        # mb == 1 and n_iter >= 2; the layer and iter brgemms are fused when slc == sic.
        merged = batch == 1 and seq_len >= 2
        space = _rnn_space_booking(layout, (
            4 * (seq_len if merged else 1) * batch * get_good_ld(gate_rows, 4),  # scratch_t = acc (f32)
            2 * batch * get_good_ld(hidden_size, 2),  # ht_t = bf16
            4 * batch * get_good_ld(hidden_size, 4),  # gemm_acc_t = f32
        ), (4, 2, 4))
        return space + pointers + _brgemm_forward_bookings(seq_len, batch, input_size, hidden_size, cpu)
    space = _rnn_space_booking(layout, (
        2 * batch * get_good_ld(gate_rows, 2),  # scratch_t = src (bf16), not merged on the brgemm path
        2 * batch * get_good_ld(hidden_size, 2),  # ht_t = bf16
        4 * batch * get_good_ld(hidden_size, 4),  # gemm_acc_t = f32
    ), (2, 2, 4))
    return space + pointers + _brgemm_backward_bookings(batch, input_size, hidden_size, cpu)


def _brgemm_forward_bookings(seq_len: int, batch: int, input_size: int, hidden_size: int, cpu: CpuInfo) -> int:
    """rnn_brgemm_t<forward>::configure_brgemm and rnn_brgemm_base_t::init_scratchpad: the brgemm batch
    and, on AMX, the per-thread accumulator. Without AMX k_block = K, so KB1 = KB2 = 1."""
    threads, merged = cpu.threads, batch == 1 and seq_len >= 2
    k_block = _amx_k_block(input_size, hidden_size, cpu)
    amx = k_block is not None
    kb1, kb2 = (input_size // k_block, hidden_size // k_block) if k_block else (1, 1)
    # max_K_Block = max(KB1, KBproj, KB2) + 1, doubled when the layer and iter brgemms are fused
    # (slc == sic and the layer GEMM not merged over time).
    fused = input_size == hidden_size and not merged
    batch_elements = (max(kb1, kb2) + 1) * (2 if fused else 1) * threads
    total = book(batch_elements * _BRGEMM_BATCH_ELEMENT_BYTES)
    if amx:
        n_block = _AMX_N_BLOCK if hidden_size % _AMX_N_BLOCK == 0 else _BRGEMM_N_BLOCK
        n_blocks = div_up(hidden_size, n_block)
        # As = sizeof(bf16) * M * max(K1, K2), Cs = sizeof(f32 scratch) * (n_gates + 1) * M * n_block.
        ac_bytes = 2 * batch * max(input_size, hidden_size) + 4 * (LSTM_GATES + 1) * batch * n_block
        m_block = _m_block_lstm(threads, batch, n_blocks, ac_bytes, amx)
        if merged:  # the merged layer GEMM has M = mb * n_iter and its own block; the buffer fits both
            m_block = max(m_block, _m_block_lstm(threads, seq_len * batch, n_blocks, ac_bytes, amx))
        total += _amx_accumulator(threads, m_block, n_block)
    return total


def _brgemm_backward_bookings(batch: int, input_size: int, hidden_size: int, cpu: CpuInfo) -> int:
    """rnn_brgemm_t<backward>::configure_brgemm and init_scratchpad: the brgemm batch, the blocked gates
    and the src transposes for diff_wei, and on AMX the per-thread accumulator.

    diff_src is [mb, max(I, H)] = gates [mb, 4H] x weights, K = dhc per gate; diff_wei is
    [max(I, H), 4H] = src^T x gates, K = rnd_up(mb, 2). Each picks its ISA with brgemm_calc_isa, so
    one can run on AMX and the other not (an odd H: a tail of odd width); the cell counts as AMX
    (rnn.brgemm_isa = the greater ISA) when either does.
    """
    threads, gate_rows = cpu.threads, LSTM_GATES * hidden_size
    src_k_block = _amx_k_block(hidden_size, hidden_size, cpu)
    src_k_blocks = LSTM_GATES * (hidden_size // src_k_block if src_k_block else 1)
    src_m_block = _m_block_vanilla_rnn(threads, batch, div_up(max(input_size, hidden_size), _BRGEMM_N_BLOCK),
                                       2 * batch * hidden_size, src_k_block is not None)
    padded_k = round_up(batch, _XF16_VNNI)  # diff_wei K = rnd_up(mb, 2) for bf16 scratch, Kpadded the same
    wei_k_block = _amx_k_block(padded_k, padded_k, cpu)
    wei_amx = wei_k_block is not None
    wei_n_block = _AMX_N_BLOCK if wei_amx and gate_rows % _AMX_N_BLOCK == 0 else _BRGEMM_N_BLOCK
    wei_k_blocks = padded_k // wei_k_block if wei_k_block else 1
    if input_size != hidden_size:
        wei_m_block = max(input_size, hidden_size)
    else:
        wei_m_block = _m_block_vanilla_rnn(threads, input_size, div_up(gate_rows, wei_n_block),
                                           2 * input_size * padded_k, wei_amx)
    if batch > 1:  # global_transpose
        src_layer, src_iter = input_size * padded_k, hidden_size * padded_k
    else:
        src_layer = threads * min(wei_m_block, input_size) * padded_k
        src_iter = threads * min(wei_m_block, hidden_size) * padded_k
    total = (
        book((max(src_k_blocks, wei_k_blocks) + 1) * threads * _BRGEMM_BATCH_ELEMENT_BYTES)
        + book(2 * threads * padded_k * wei_n_block)  # key_rnn_gates_blocked
        + book(2 * src_layer)  # key_rnn_src_layer_trans
        + book(2 * src_iter)  # key_rnn_src_iter_trans
    )
    if src_k_block is not None or wei_amx:  # rnn.m_block, rnn.n_block: the larger of the two GEMMs'
        total += _amx_accumulator(threads, max(src_m_block, wei_m_block), max(wei_n_block, _BRGEMM_N_BLOCK))
    return total


def _forward_weight_bytes(rows: int, hidden_size: int, size: int, brgemm: bool) -> int | None:
    """Bytes of the forward weight reorder for a [4H, rows] weight, or None when none is made."""
    if not brgemm:
        # ldigo, strides[2] = get_good_ld(4H). ideep compares descs; oneDNN ignores strides of
        # size-1 dims, so rows == 1 (ldgoi and ldigo agree) needs no reorder.
        return None if rows == 1 else rows * get_good_ld(LSTM_GATES * hidden_size, size) * size
    # ldgOI32o2i: O padded to 32, I to 2; a blocked layout never equals PyTorch's plain one.
    return LSTM_GATES * round_up(hidden_size, _BRGEMM_N_BLOCK) * round_up(rows, _XF16_VNNI) * 2


def _backward_weight_bytes(rows: int, hidden_size: int, size: int, brgemm: bool) -> int | None:
    """Bytes of the backward weight reorder for a [4H, rows] weight, or None when none is made."""
    if not brgemm:
        # ldgoi with the o stride padded to get_good_ld(rows): equal to PyTorch's ldgoi, so no
        # reorder, exactly when get_good_ld(rows) == rows.
        ld = get_good_ld(rows, size)
        return None if ld == rows else LSTM_GATES * hidden_size * ld * size
    # ldgIO32i2o: I padded to 32, O to 2.
    return LSTM_GATES * round_up(rows, _BRGEMM_N_BLOCK) * round_up(hidden_size, _XF16_VNNI) * 2


def _ldigo_f32_bytes(rows: int, hidden_size: int) -> int:
    """Bytes of an f32 ``ldigo`` diff-weights buffer with ``set_good_strides`` (i stride = ld(4H)).

    ``memory_desc_wrapper::size()`` takes max(padded_dim * stride) over dims and uses stride 1
    for a dim of size 1, so a single row (I == 1 or H == 1) is not padded: 4H elements.
    """
    gate_rows = LSTM_GATES * hidden_size
    return (rows * get_good_ld(gate_rows, 4) if rows > 1 else gate_rows) * 4


def lstm_forward_transients(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    dtype_bytes: int = 4,
    *,
    cpu: CpuInfo,
) -> tuple[list[int], list[int]]:
    """Kernel-internal buffers of one ``aten.mkldnn_rnn_layer`` call in grad mode (LSTM).

    Returns ``(before, after)``, signed byte sizes in order: ``before`` precedes the op's
    outputs (output, hy, cy, workspace), ``after`` follows them. Real order (RNN.cpp + ideep):
    output, hy, cy, **bias**, workspace, **w_layer reorder**, **w_iter reorder**,
    **scratchpad**, then frees in reverse. The bias is moved ahead of the outputs; it is alive
    across the workspace and the peak, so the peak is unchanged.
    """
    check_sizes(dtype_bytes, seq_len, batch, input_size, hidden_size)
    size = dtype_bytes
    bias = LSTM_GATES * hidden_size * size
    brgemm = _uses_brgemm(size, cpu)
    buffers = [weights for weights in (_forward_weight_bytes(input_size, hidden_size, size, brgemm),
                                       _forward_weight_bytes(hidden_size, hidden_size, size, brgemm)) if weights]
    buffers.append(lstm_scratchpad_bytes(seq_len, batch, input_size, hidden_size, size, cpu, backward=False))
    return [bias], buffers + [-nbytes for nbytes in reversed(buffers)] + [-bias]


def lstm_backward_transients(
    seq_len: int,
    batch: int,
    input_size: int,
    hidden_size: int,
    dtype_bytes: int = 4,
    *,
    cpu: CpuInfo,
    grad_output_copied: bool = True,
    grad_hy_copied: bool = True,
    grad_cy_copied: bool = True,
    hx_cx_same_storage: bool = False,
    cell_state_bytes: int | None = None,
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
    check_sizes(dtype_bytes, seq_len, batch, input_size, hidden_size)
    size = dtype_bytes
    cell_bytes = dtype_bytes if cell_state_bytes is None else cell_state_bytes
    gate_rows = LSTM_GATES * hidden_size
    state = batch * hidden_size
    # RNN.cpp, in declaration order: grad_output, grad_hy, grad_cy, bias, cx_ clone.
    locals_ = [
        seq_len * state * size if grad_output_copied else 0,
        state * size if grad_hy_copied else 0,
        state * cell_bytes if grad_cy_copied else 0,
        gate_rows * size,  # bias = b_ih + b_hh (or zeros)
        state * cell_bytes if hx_cx_same_storage else 0,
    ]
    locals_ = [nbytes for nbytes in locals_ if nbytes]
    after: list[int] = []
    # RNN.cpp, non-f32 input: grad_y_, grad_hy_, grad_cy_ converted to f32 after the outputs.
    f32_diffs = [seq_len * state * 4, state * 4, state * 4] if size != 4 else []
    after += f32_diffs
    # ideep lstm_backward::compute: weight reorders, zeroed diff weights / diff bias in the
    # primitive's layout (ldigo, ld = get_good_ld(4H) for f32), then the scratchpad.
    brgemm = _uses_brgemm(size, cpu)
    buffers = [weights for weights in (_backward_weight_bytes(input_size, hidden_size, size, brgemm),
                                       _backward_weight_bytes(hidden_size, hidden_size, size, brgemm)) if weights]
    buffers += [_ldigo_f32_bytes(input_size, hidden_size), _ldigo_f32_bytes(hidden_size, hidden_size), gate_rows * 4]
    buffers.append(lstm_scratchpad_bytes(seq_len, batch, input_size, hidden_size, size, cpu, backward=True))
    after += buffers + [-nbytes for nbytes in reversed(buffers)]
    # (diff_b2_ = clone(diff_b_) is allocated here; it is an output.) Then locals die in reverse
    # declaration order: the f32 grad copies, cx_ clone, bias, grad_cy, grad_hy, grad_output.
    after += [-nbytes for nbytes in reversed(f32_diffs)] + [-nbytes for nbytes in reversed(locals_)]
    return locals_, after
