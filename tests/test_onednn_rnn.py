"""Check `trainmem.targets.onednn.rnn_workspace` and `rnn_transients` against the real `aten.mkldnn_rnn_layer`.

The real op is only run on CPU builds with oneDNN. bfloat16 cases are skipped where oneDNN has
no bf16 support on this CPU. Recorded runs of the real op on other CPUs (tests/data/onednn_lstm, one
file per CPU and oneDNN release, naming its CpuInfo) are checked on every machine.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from kernel_checks import memory_inside, running_peak
from trainmem.targets.cpu_info import CpuInfo
from trainmem.targets.onednn.rnn_transients import (
    lstm_backward_transients,
    lstm_forward_transients,
    lstm_scratchpad_bytes,
)
from trainmem.targets.onednn.rnn_layout import RnnLayout, rnn_layout
from trainmem.targets.onednn.rnn_workspace import (
    get_good_ld,
    lstm_module_workspace_bytes,
    lstm_workspace_bytes,
)
from trainmem.targets.onednn.scratchpad import round_up
from trainmem.targets.onednn.version import bundled_onednn_version, parse_onednn_version

_CPU = CpuInfo.this_machine()
_ONEDNN_3_12 = (3, 12, 0)  # the release the hand-profiled numbers below come from (torch 2.13)

_HAS_MKLDNN = torch.backends.mkldnn.is_available()
_HAS_BF16 = _HAS_MKLDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()

needs_mkldnn = pytest.mark.skipif(not _HAS_MKLDNN, reason="torch built without oneDNN")
# the installed torch's oneDNN: a verified release (3.5, 3.12, 3.13) is matched exactly; any other (torch 2.10's
# 3.7, 2.12's 3.11 under `make compat`) takes the larger known layout, a bound the real op must stay within
_EXACT = rnn_layout().exact


def _matches(estimated: int, real: int) -> bool:
    return estimated == real if _EXACT else estimated >= real

_LSTM_MODE = 2  # ideep::rnn_kind::LSTM


def _real_workspace(T, B, I, H, dtype, reverse=False, bidirectional=False, cell_dtype=None):
    g = torch.Generator().manual_seed(0)

    def r(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(dt)

    with torch.enable_grad():  # the kernel only allocates a workspace in grad mode
        out = torch.ops.aten.mkldnn_rnn_layer(
            r(T, B, I), r(4 * H, I), r(4 * H, H), r(4 * H), r(4 * H),
            r(B, H), r(B, H, dt=cell_dtype or dtype),
            reverse, [], _LSTM_MODE, H, 1, True, bidirectional, False, True,
        )
    ws = out[3]
    assert ws.dtype == torch.uint8
    return ws.numel()


# (T, B, I, H, reverse, bidirectional). Includes sizes that are not multiples of 16, lds that hit
# the "multiple of 256 elements" rule (4H = 256 or 512, I or H = 256), T = 1 and B = 1.
SHAPES = [
    (1, 1, 1, 1, False, False),
    (64, 8, 128, 256, False, False),
    (64, 8, 256, 256, True, True),
    (10, 4, 64, 64, False, False),
    (100, 4, 64, 64, True, False),
    (10, 40, 64, 64, False, True),
    (10, 4, 640, 64, False, False),
    (10, 4, 64, 640, True, False),
    (7, 3, 31, 33, False, False),
    (33, 17, 5, 100, True, True),
    (2, 130, 250, 24, False, False),
    (13, 1, 300, 7, True, False),
    (5, 9, 100, 128, False, True),
    (3, 2, 16, 300, True, False),
    (50, 5, 1, 63, False, False),
]


@needs_mkldnn
@pytest.mark.parametrize("T,B,I,H,reverse,bidir", SHAPES)
def test_f32_matches_real_op(T, B, I, H, reverse, bidir):
    real = _real_workspace(T, B, I, H, torch.float32, reverse, bidir)
    assert _matches(lstm_workspace_bytes(T, B, I, H, bidirectional=bidir, dtype_bytes=4), real)


@pytest.mark.skipif(not _HAS_BF16, reason="oneDNN bf16 unsupported on this CPU")
@pytest.mark.parametrize("T,B,I,H,reverse,bidir", SHAPES[::2])
def test_bf16_matches_real_op(T, B, I, H, reverse, bidir):
    real = _real_workspace(T, B, I, H, torch.bfloat16, reverse, bidir)
    assert _matches(lstm_workspace_bytes(T, B, I, H, bidirectional=bidir, dtype_bytes=2), real)


@pytest.mark.skipif(not _HAS_BF16, reason="oneDNN bf16 unsupported on this CPU")
def test_bf16_with_f32_cell_state():
    real = _real_workspace(10, 4, 64, 64, torch.bfloat16, cell_dtype=torch.float32)
    assert _matches(lstm_workspace_bytes(10, 4, 64, 64, dtype_bytes=2, cell_state_bytes=4), real)


@needs_mkldnn
def test_nn_lstm_calls_match_module_helper():
    """nn.LSTM makes one mkldnn_rnn_layer call per layer and direction, with sizes in that order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Rec(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ws = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket is torch.ops.aten.mkldnn_rnn_layer:
                self.ws.append(out[3].numel())
            return out

    T, B, I, H = 7, 3, 20, 33
    model = torch.nn.LSTM(I, H, num_layers=2, bidirectional=True, batch_first=True)
    rec = Rec()
    with torch.enable_grad(), rec:
        model(torch.randn(B, T, I))
    estimated = lstm_module_workspace_bytes(T, B, I, H, num_layers=2, bidirectional=True)
    assert len(rec.ws) == len(estimated) and all(map(_matches, estimated, rec.ws)), (rec.ws, estimated)


def test_get_good_ld_rules():
    # f32: rounded up to 16 elements, and one more 16 when the result is a multiple of 256.
    assert get_good_ld(1, 4) == 16
    assert get_good_ld(240, 4) == 240
    assert get_good_ld(256, 4) == 272
    # bf16: rounded up to 32 elements.
    assert get_good_ld(33, 2) == 64
    assert get_good_ld(512, 2) == 544


def test_page_rounding_smallest_case():
    # 7 regions, each smaller than a page, give 7 pages; oneDNN 3.5 registers ws_states_iter twice more.
    assert lstm_workspace_bytes(1, 1, 1, 1, layout=rnn_layout((3, 12, 0))) == 7 * 4096
    assert lstm_workspace_bytes(1, 1, 1, 1, layout=rnn_layout((3, 5, 3))) == 9 * 4096


def test_older_onednn_adds_two_states_regions():
    """oneDNN 3.5's set_offsets registers ws_states_iter (= ws_states_layer's size) twice more."""
    T, B, I, H = 64, 8, 128, 256
    states = round_up(2 * (T + 1) * B * get_good_ld(max(I, H), 4) * 4, 4096)
    new = lstm_workspace_bytes(T, B, I, H, layout=rnn_layout((3, 12, 0)))
    assert lstm_workspace_bytes(T, B, I, H, layout=rnn_layout((3, 5, 3))) == new + 2 * states == 10489856


def test_rnn_layout_by_onednn_version():
    assert rnn_layout((3, 5, 3)) == RnnLayout(True, True, True, "oneDNN 3.5.3")
    assert rnn_layout((3, 12, 0)) == RnnLayout(False, False, True, "oneDNN 3.12.0")
    assert rnn_layout((3, 13, 3)) == RnnLayout(False, False, True, "oneDNN 3.13.3")
    # not verified: the larger (older) layout, flagged as a bound (also for releases newer than the checked ones)
    for unverified in ((3, 7, 1), (3, 9, 0), (3, 14, 0), (2, 7, 3)):
        layout = rnn_layout(unverified)
        assert layout.dead_states_registrations and layout.typed_scratch_bookings and not layout.exact
        assert "oneDNN " + ".".join(map(str, unverified)) in layout.note() and "upper bound" in layout.note()


def test_older_onednn_books_the_scratch_buffers_again_by_element_size():
    """oneDNN 3.5 books key_rnn_gates / key_rnn_ht / key_rnn_diff_ht with byte counts as f32 element
    counts: 4x each buffer plus 128 bytes each, beside key_rnn_space (measured under torch 2.6)."""
    T, B, I, H = 64, 8, 128, 256
    gates, state = 4 * T * B * get_good_ld(4 * H, 4), 4 * B * get_good_ld(H, 4)
    newer = lstm_scratchpad_bytes(T, B, I, H, 4, CpuInfo("AVX512", 2, (3, 12, 0)))
    older = lstm_scratchpad_bytes(T, B, I, H, 4, CpuInfo("AVX512", 2, (3, 5, 3)))
    assert older == newer + 4 * gates + 128 + 2 * (4 * state + 128) == 10748856
    # the running torch's oneDNN by default
    assert lstm_scratchpad_bytes(T, B, I, H, 4, CpuInfo("AVX512", 2)) == lstm_scratchpad_bytes(
        T, B, I, H, 4, CpuInfo("AVX512", 2, bundled_onednn_version()))


def test_onednn_version_read_from_the_build_configuration():
    assert parse_onednn_version("  - Intel(R) MKL-DNN v3.5.3 (Git Hash 66f0cb9e)") == (3, 5, 3)
    assert parse_onednn_version("  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa710)") == (3, 12, 0)
    assert parse_onednn_version("  - Intel(R) MKL-DNN v3.1 (Git Hash 0)") == (3, 1, 0)
    assert parse_onednn_version("PyTorch built with:\n  - GCC 13.3") is None
    if _HAS_MKLDNN:
        assert bundled_onednn_version() == parse_onednn_version(torch.__config__.show()) is not None


# --------------------------------------------------------------------------------------------
# Kernel-internal buffers (lstm_forward_transients / lstm_backward_transients)
# --------------------------------------------------------------------------------------------


def test_transients_reproduce_profiled_sequence():
    """nn.LSTM(128, 256, num_layers=2, batch_first=True) on [8, 64, 128] fp32, profiled with
    torch 2.13 / oneDNN 3.12: layer 0 forward and layer 1 backward (grad_output copied from the
    batch_first transpose, grad_hy / grad_cy undefined)."""
    profiled = CpuInfo(_CPU.capability, _CPU.threads, _ONEDNN_3_12)
    before, after = lstm_forward_transients(64, 8, 128, 256, 4, cpu=profiled)
    outputs = [524288, 8192, 8192, 8220672]
    real = [524288, 8192, 8192, 4096, 8220672, 532480, 1064960, 2159160, -2159160, -1064960,
            -532480, -4096]
    assert sorted(x for x in before + after if x > 0) == sorted(
        x for x in real if x > 0 and x not in outputs)
    assert running_peak(before + outputs + after) == running_peak(real)

    before, after = lstm_backward_transients(64, 8, 256, 256, 4, cpu=profiled)
    assert before == [524288, 8192, 8192, 4096]
    assert after == [1114112, 1114112, 1064960, 1064960, 4096, 2159160, -2159160, -4096,
                     -1064960, -1064960, -1114112, -1114112, -4096, -8192, -8192, -524288]


@pytest.mark.parametrize("T,B,I,H,s", [(1, 1, 1, 1, 4), (7, 3, 31, 33, 2), (64, 8, 256, 256, 4),
                                       (5, 1, 64, 64, 2), (3, 200, 17, 40, 4)])
def test_transients_balance(T, B, I, H, s):
    for before, after in (lstm_forward_transients(T, B, I, H, s, cpu=CpuInfo("AVX512", 3)),
                          lstm_backward_transients(T, B, I, H, s, cpu=CpuInfo("AVX512", 3))):
        assert sum(before) + sum(after) == 0
        assert all(x > 0 for x in before)


def test_scratchpad_f32_ignores_threads_bf16_does_not():
    assert lstm_scratchpad_bytes(64, 8, 128, 256, 4, CpuInfo("AVX512", 1, _ONEDNN_3_12)) == 2159160
    assert lstm_scratchpad_bytes(64, 8, 128, 256, 4, CpuInfo("AVX512", 64, _ONEDNN_3_12)) == 2159160
    # bf16 brgemm: 40-byte batch elements per thread (and transposition buffers in backward)
    assert lstm_scratchpad_bytes(64, 8, 128, 256, 2, CpuInfo("AVX512", 2, _ONEDNN_3_12)) == 62280
    assert lstm_scratchpad_bytes(64, 8, 128, 256, 2, CpuInfo("AVX512", 2, _ONEDNN_3_12), backward=True) == 53688
    # one more thread, two more 40-byte batch elements (max_K_Block 2 per thread)
    assert lstm_scratchpad_bytes(64, 8, 128, 256, 2, CpuInfo("AVX512", 3, _ONEDNN_3_12)) == 62280 + 2 * 40


def test_bf16_without_avx512_bf16_takes_the_ref_path():
    """An AVX512 CPU without AVX512-BF16 (Ice Lake, profiled with torch 2.13 / oneDNN 3.12) runs bf16 on
    the ref path: weights in ldigo / ldgoi padded by get_good_ld of 2-byte elements, no thread term."""
    no_bf16 = CpuInfo("AVX512", 2, _ONEDNN_3_12, avx512_bf16=False)
    # forward 12x4, I = H = 64: scratch_gates f32 merged over time 4*12*4*get_good_ld(256, 4) = 4*48*272
    # = 52,224 -> 53,248 (page); ht bf16 512 -> 4,096; diff_ht f32 1,024 -> 4,096; key_rnn_space 61,440
    # + 4,096 (perf_align) = 65,536; pointers 3*(8+128) + (2*8+128) = 552 -> 66,088, as profiled.
    assert lstm_scratchpad_bytes(12, 4, 64, 64, 2, no_bf16) == 66088
    assert lstm_scratchpad_bytes(12, 4, 64, 64, 2, dataclasses.replace(no_bf16, threads=64)) == 66088
    # backward: scratch_gates in bf16 2*12*4*get_good_ld(256, 2) = 2*48*288 = 27,648 -> 28,672: 41,512.
    assert lstm_scratchpad_bytes(12, 4, 64, 64, 2, no_bf16, backward=True) == 41512
    # weight reorders: forward ldigo 64 * get_good_ld(256, 2) * 2 = 36,864 each (the brgemm path's
    # ldgOI32o2i would be 32,768); backward ldgoi needs none (get_good_ld(64, 2) == 64).
    _, after = lstm_forward_transients(12, 4, 64, 64, 2, cpu=no_bf16)
    assert after[:3] == [36864, 36864, 66088]
    _, after = lstm_backward_transients(5, 5, 1, 63, 2, cpu=no_bf16)
    # I = 1: get_good_ld(1, 2) = 32 -> 252*32*2 = 16,128; H = 63: 252*64*2 = 32,256 (then f32 diff weights)
    assert after[3:5] == [16128, 32256]


def test_this_machine_reads_the_instruction_sets(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    here = CpuInfo.this_machine()
    assert here.avx512_bf16 == bool(torch.cpu._is_avx512_bf16_supported())
    if hasattr(torch.cpu, "get_capabilities"):
        has = torch.cpu.get_capabilities()
        assert here.amx == bool(has.get("amx_tile") and has.get("amx_bf16"))
        assert here.avx512_fp16 == bool(has.get("avx512_fp16"))
    # built by hand, a CpuInfo describes the AVX512-BF16 CPU without AMX the brgemm figures came from
    assert not CpuInfo("AVX512", 2).amx


def test_this_machine_follows_onednn_max_cpu_isa(monkeypatch):
    """ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) caps the kernels oneDNN picks, so the rules must follow it
    (the capped files in tests/data/onednn_lstm were measured that way)."""
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert not CpuInfo.this_machine().amx
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "avx512_core_vnni")
    assert not CpuInfo.this_machine().avx512_bf16 and not CpuInfo.this_machine().amx
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "ALL")
    assert CpuInfo.this_machine().avx512_bf16 == bool(torch.cpu._is_avx512_bf16_supported())


def test_bf16_on_amx_blocks_k_by_32_and_books_an_accumulator_per_thread():
    """Sapphire Rapids (AMX), torch 2.13 / oneDNN 3.12, 2 threads, T=12 B=4 I=H=64 (profiled; tests/data/onednn_lstm).

    forward: K1 = K2 = 64 in blocks of 32 (brgemm_calc_k_block_amx), so KB1 = KB2 = 2 and, fused (slc == sic),
    max_K_Block = (2 + 1) * 2: 12 batch elements of 40 B = 480 -> 608 booked, 160 more than without AMX.
    N = 64 gives n_block 64 (brgemm_calc_n_block), one N block for 2 threads, so adjust_m_block_lstm keeps
    m_block = M = 4: key_brgemm_primitive_buffer = 2 threads * 4 * 64 f32 = 2,048 -> 2,176 booked.
    """
    amx = CpuInfo("AVX512", 2, _ONEDNN_3_12, amx=True)
    no_amx = dataclasses.replace(amx, amx=False)
    assert lstm_scratchpad_bytes(12, 4, 64, 64, 2, no_amx) == 21480
    assert lstm_scratchpad_bytes(12, 4, 64, 64, 2, amx) == 21480 + 160 + 2176 == 23816
    # backward: diff_src K = 64 -> 2 blocks per gate (8), diff_wei K = rnd_up(4, 2) = 4 on AMX with n_block 64
    # (4H % 64 == 0) and m_block 64: batch 9 * 2 * 40 = 720 (+320 over 400), gates_blocked 2 * 2 * 4 * 64 = 1,024
    # (+512), accumulator 2 * max(64, 4) * max(64, 32) * 4 = 32,768 -> 32,896 booked.
    assert lstm_scratchpad_bytes(12, 4, 64, 64, 2, no_amx, backward=True) == 19384
    assert lstm_scratchpad_bytes(12, 4, 64, 64, 2, amx, backward=True) == 19384 + 320 + 512 + 32896 == 53112
    # I = 31, H = 33: the common K block min(31, 33, 32) = 31 is odd, so the forward kernels stay on
    # avx512_core_bf16 (brgemm_calc_isa) and nothing changes.
    assert lstm_scratchpad_bytes(7, 3, 31, 33, 2, amx) == lstm_scratchpad_bytes(7, 3, 31, 33, 2, no_amx)
    # f32 and bf16 without AVX512-BF16 take the ref path whatever AMX says
    assert lstm_scratchpad_bytes(12, 4, 64, 64, 4, amx) == lstm_scratchpad_bytes(12, 4, 64, 64, 4, no_amx)
    ref = dataclasses.replace(amx, avx512_bf16=False)
    assert lstm_scratchpad_bytes(12, 4, 64, 64, 2, ref) == 66088


# Recorded real allocations of the op on other CPUs (ISAs), one file per machine and oneDNN release, checked on
# every machine: a file names the CpuInfo it was measured with. Add a file to cover another CPU.
_RECORDED = Path(__file__).parent / "data" / "onednn_lstm"


def _recorded_rows():
    for path in sorted(_RECORDED.glob("*.json")):
        recorded = json.loads(path.read_text())
        fields = dict(recorded["cpu_info"], onednn_version=tuple(recorded["cpu_info"]["onednn_version"]))
        for row in recorded["rows"]:
            cpu = CpuInfo(**dict(fields, threads=row.get("threads", fields["threads"])))
            name = f"{path.stem}-T{row['T']}B{row['B']}I{row['I']}H{row['H']}-{row['dtype'][6:]}-t{cpu.threads}"
            yield pytest.param(row, cpu, id=name)


def _last_before_free(events: list[int]) -> int:
    """The scratchpad: ideep allocates it last, right before compute() frees its buffers in reverse."""
    return events[next(i for i, nbytes in enumerate(events) if nbytes < 0) - 1]


@pytest.mark.parametrize("row,cpu", list(_recorded_rows()))
def test_transients_match_recorded_measurements(row, cpu):
    T, B, I, H = row["T"], row["B"], row["I"], row["H"]
    s = 2 if row["dtype"] == "torch.bfloat16" else 4
    for direction, (before, after) in (
        ("forward", lstm_forward_transients(T, B, I, H, s, cpu=cpu)),
        ("backward", lstm_backward_transients(T, B, I, H, s, cpu=cpu, **row["flags"])),
    ):
        real, outs = row[direction]["real_events"], row[direction]["outputs"]
        assert sum(before) + sum(after) == 0
        assert _last_before_free(after) == _last_before_free(real), direction
        real_peak, model_peak = running_peak(real), running_peak(before + outs + after)
        assert abs(model_peak - real_peak) <= max(0.01 * real_peak, 8192), (direction, real, before, after)


def _real_in_op(T, B, I, H, dtype, reverse, grads, share):
    """Run mkldnn_rnn_layer (grad mode) and its backward under the profiler. Returns, per op, the
    signed memory events inside the op and the storage sizes of its outputs, plus the flags."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    if share:
        hc = r(2, B, H)
        hx, cx = hc[0], hc[1]
    else:
        hx, cx = r(B, H), r(B, H)
    args = [r(T, B, I), r(4 * H, I), r(4 * H, H), r(4 * H), r(4 * H), hx, cx]
    if grads == "none":
        go, ghy, gcy = r(T, B, H), None, None
    elif grads == "noncontig":
        go, ghy, gcy = r(B, T, H).transpose(0, 1), r(B, H), r(B, H)
    else:
        go, ghy, gcy = r(T, B, H), r(B, H), r(B, H)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.enable_grad():
            out = torch.ops.aten.mkldnn_rnn_layer(
                *args, reverse, [], _LSTM_MODE, H, 1, True, False, False, True)
        bout = torch.ops.aten.mkldnn_rnn_layer_backward(
            *args, out[0], out[1], out[2], go, ghy, gcy, reverse, _LSTM_MODE, H, 1, True, True,
            False, [], False, out[3])
    result = [(memory_inside(prof, name), [o.untyped_storage().nbytes() for o in outs])
              for name, outs in (("aten::mkldnn_rnn_layer", out), ("aten::mkldnn_rnn_layer_backward", bout))]
    flags = {
        "grad_output_copied": go is None or not go.is_contiguous(),
        "grad_hy_copied": ghy is None,
        "grad_cy_copied": gcy is None,
        "hx_cx_same_storage": share,
    }
    return result, flags


# (T, B, I, H, dtype, reverse, grads, hx/cx share a storage). Non-multiples of 16, I or H = 256
# (padded ld), I = 1 and H = 1 (no reorder / unpadded diff weights), B = 1 (bf16 merged layer
# GEMM, per-thread transposes), B >= 128 (f32 unmerged forward).
TRANSIENT_SHAPES = [
    (64, 8, 128, 256, torch.float32, False, "noncontig", False),
    (7, 3, 31, 33, torch.float32, True, "none", True),
    (9, 2, 1000, 1, torch.float32, False, "contig", False),
    (4, 130, 17, 40, torch.float32, False, "none", False),
    (12, 4, 64, 64, torch.bfloat16, False, "contig", False),
    (7, 3, 31, 33, torch.bfloat16, True, "noncontig", False),
    (20, 1, 48, 48, torch.bfloat16, False, "none", True),
    (5, 5, 1, 63, torch.bfloat16, False, "contig", False),
]


@pytest.mark.parametrize("T,B,I,H,dtype,reverse,grads,share", TRANSIENT_SHAPES)
def test_transients_match_real_in_oprunning_peak(T, B, I, H, dtype, reverse, grads, share):
    if not (_HAS_BF16 if dtype is torch.bfloat16 else _HAS_MKLDNN):
        pytest.skip("oneDNN (bf16) unavailable")
    ((fwd_real, fwd_outs), (bwd_real, bwd_outs)), flags = _real_in_op(
        T, B, I, H, dtype, reverse, grads, share)
    s = torch.tensor([], dtype=dtype).element_size()
    for real, outs, (before, after) in (
        (fwd_real, fwd_outs, lstm_forward_transients(T, B, I, H, s, cpu=_CPU)),
        (bwd_real, bwd_outs, lstm_backward_transients(T, B, I, H, s, cpu=_CPU, **flags)),
    ):
        assert sum(before) + sum(after) == 0
        real_peak, model_peak = running_peak(real), running_peak(before + outs + after)
        tolerance = max(0.01 * real_peak, 8192)
        close = abs(model_peak - real_peak) <= tolerance if _EXACT else model_peak >= real_peak - tolerance
        assert close, (real, before, after)


def test_an_unverified_onednn_release_makes_the_lstm_estimate_say_it_is_a_bound():
    """The layout of a oneDNN release not checked against the real op is the larger known one; the estimate's
    warnings say so (targets/cpu_target.py CpuTarget.device_stream → process_memory)."""
    import dataclasses
    from pathlib import Path

    from trainmem.estimate import assemble_traced, prepare, trace
    from trainmem.setup import TrainingSetup

    setup = TrainingSetup.from_mapping({"batch_size": 2})
    installed = prepare(str(Path(__file__).with_name("models.py")) + ":tiny_lstm", setup)
    verified = dataclasses.replace(installed, target=dataclasses.replace(
        installed.target, cpu=dataclasses.replace(installed.target.cpu, onednn_version=(3, 12, 0))))
    unverified = dataclasses.replace(verified, target=dataclasses.replace(
        verified.target, cpu=dataclasses.replace(verified.target.cpu, onednn_version=(3, 9, 0))))
    traced = trace(verified, setup)
    said = [w for w in assemble_traced(unverified, setup, traced).warnings if "upper bound, not exact" in w]
    assert len(said) == 1 and "oneDNN 3.9.0" in said[0]
    assert not [w for w in assemble_traced(verified, setup, traced).warnings if "upper bound, not exact" in w]
