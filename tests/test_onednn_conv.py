"""Check `trainmem.targets.onednn.conv` against the real CPU convolution kernels.

Each case runs the real op once under ``torch.profiler`` with ``profile_memory=True`` and takes
the ``[memory]`` events inside the op's time range (``aten::convolution`` for the forward,
``aten::convolution_backward`` for the backward). The op's own outputs are among those events.
The real in-op peak is the running maximum of their sum, relative to the op's start. The model's
in-op peak is the running maximum over ``before``, then the outputs (all at once), then
``after``. They must agree to within 1% or 4 KiB, the transients must cancel, and every free
must release an earlier allocation of the same size (so a consumer can pair them).

The rules were derived for this torch build (oneDNN v3.12); cases run where the CPU reports
AVX512 or AVX2, the capabilities the model was checked on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from kernel_checks import memory_inside, running_peak
from trainmem.targets import onednn
from trainmem.targets.cpu_info import CpuInfo
from trainmem.targets.onednn.conv import (
    conv_backend,
    conv_backward_transients,
    conv_forward_transients,
)

_CPU = CpuInfo.this_machine()
needs_cpu = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or _CPU.capability not in ("AVX512", "AVX2"),
    reason=f"rules checked for oneDNN on AVX512/AVX2 CPUs (this one: {_CPU.capability})",
)

_DT = {torch.float32: 4, torch.float64: 8}


def _in_op_events(fn, op_name):
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    return out, memory_inside(prof, op_name)


def _model_peak(before, outputs, after):
    return running_peak(list(before) + [outputs] + list(after))


def _close(model, real):
    return abs(model - real) <= max(4096, 0.01 * real)


def _check_pairs(before, after):
    """Each negative entry frees a still-live earlier positive entry of the same size."""
    assert sum(before) + sum(after) == 0
    live = []
    for v in list(before) + list(after):
        if v > 0:
            live.append(v)
        else:
            assert -v in live, (v, live)
            live.remove(-v)
    assert not live


# name: (N, C_in, C_out, spatial, k, stride, pad, dilation, groups, transposed, bias, dtype)
CASES = {
    "conv2d_16_16_b8": (8, 16, 16, (96, 96), 3, 1, 1, 1, 1, False, True, torch.float32),
    "first_layer_3ch": (8, 3, 16, (96, 96), 3, 1, 1, 1, 1, False, True, torch.float32),
    "conv2d_32_16_b8": (8, 32, 16, (96, 96), 3, 1, 1, 1, 1, False, True, torch.float32),
    "pointwise_1x1": (8, 64, 256, (32, 32), 1, 1, 0, 1, 1, False, True, torch.float32),
    "pointwise_1x1_s2_nobias": (8, 64, 128, (32, 32), 1, 2, 0, 1, 1, False, False,
                                torch.float32),
    "strided_3x3": (8, 64, 32, (32, 32), 3, 2, 1, 1, 1, False, True, torch.float32),
    "stem_7x7_s2": (2, 3, 64, (112, 112), 7, 2, 3, 1, 1, False, False, torch.float32),
    "depthwise_b8": (8, 32, 32, (48, 48), 3, 1, 1, 1, 32, False, True, torch.float32),
    "depthwise_b1": (1, 32, 32, (48, 48), 3, 1, 1, 1, 32, False, True, torch.float32),
    "grouped_g4": (8, 32, 64, (48, 48), 3, 1, 1, 1, 4, False, True, torch.float32),
    "padded_channels_20": (8, 20, 20, (32, 32), 3, 1, 1, 1, 1, False, False, torch.float32),
    "conv1d": (8, 16, 32, (200,), 5, 1, 2, 1, 1, False, True, torch.float32),
    "conv3d": (2, 16, 16, (16, 16, 16), 3, 1, 1, 1, 1, False, True, torch.float32),
    "conv_transpose2d_s2": (8, 32, 16, (24, 24), 4, 2, 1, 1, 1, True, True, torch.float32),
    "conv_transpose2d_s1": (8, 32, 16, (24, 24), 3, 1, 1, 1, 1, True, True, torch.float32),
    "native_b1_small": (1, 16, 32, (20, 20), 3, 1, 1, 1, 1, False, True, torch.float32),
    "native_fp64_grouped": (8, 16, 32, (20, 20), 3, 1, 2, 1, 4, False, True, torch.float64),
}


def _setup(case):
    N, cin, cout, sp, k, s, p, d, g, tr, bias, dtype = case
    nd = len(sp)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, cin, *sp, generator=gen, dtype=dtype)
    wshape = ((cin, cout // g) if tr else (cout, cin // g)) + (k,) * nd
    w = torch.randn(*wshape, generator=gen, dtype=dtype)
    b = torch.randn(cout, generator=gen, dtype=dtype) if bias else None
    args = dict(stride=[s] * nd, padding=[p] * nd, dilation=[d] * nd, transposed=tr,
                output_padding=[0] * nd, groups=g)
    return x, w, b, args


@needs_cpu
@pytest.mark.parametrize("name", list(CASES))
def test_forward_peak(name):
    x, w, b, a = _setup(CASES[name])
    with torch.no_grad():
        y, events = _in_op_events(
            lambda: torch.ops.aten.convolution(x, w, b, a["stride"], a["padding"],
                                               a["dilation"], a["transposed"],
                                               a["output_padding"], a["groups"]),
            "aten::convolution")
    dt = _DT[x.dtype]
    before, after = conv_forward_transients(
        tuple(x.shape), tuple(w.shape), tuple(y.shape), a["stride"], a["padding"],
        a["dilation"], a["groups"], a["transposed"], dt, _CPU, has_bias=b is not None)
    _check_pairs(before, after)
    real = running_peak(events)
    model = _model_peak(before, y.numel() * dt, after)
    assert _close(model, real), (name, real, model, events, before, after)


@needs_cpu
@pytest.mark.parametrize("name", list(CASES))
def test_backward_peak(name):
    x, w, b, a = _setup(CASES[name])
    with torch.no_grad():
        y = torch.ops.aten.convolution(x, w, b, a["stride"], a["padding"], a["dilation"],
                                       a["transposed"], a["output_padding"], a["groups"])
    go = torch.randn_like(y)
    mask = [True, True, b is not None]
    grads, events = _in_op_events(
        lambda: torch.ops.aten.convolution_backward(
            go, x, w, [y.shape[1]] if b is not None else None, a["stride"], a["padding"],
            a["dilation"], a["transposed"], a["output_padding"], a["groups"], mask),
        "aten::convolution_backward")
    dt = _DT[x.dtype]
    before, after = conv_backward_transients(
        tuple(go.shape), tuple(x.shape), tuple(w.shape), a["stride"], a["padding"],
        a["dilation"], a["groups"], a["transposed"], mask, dt, _CPU)
    _check_pairs(before, after)
    outs = sum(t.numel() * t.element_size() for t in grads if t is not None)
    real = running_peak(events)
    model = _model_peak(before, outs, after)
    assert _close(model, real), (name, real, model, events, before, after)


@needs_cpu
def test_backward_grad_input_only():
    x, w, b, a = _setup(CASES["strided_3x3"])
    y = torch.ops.aten.convolution(x, w, b, a["stride"], a["padding"], a["dilation"], False,
                                   a["output_padding"], 1)
    go = torch.randn_like(y)
    grads, events = _in_op_events(
        lambda: torch.ops.aten.convolution_backward(
            go, x, w, None, a["stride"], a["padding"], a["dilation"], False,
            a["output_padding"], 1, [True, False, False]),
        "aten::convolution_backward")
    before, after = conv_backward_transients(
        tuple(go.shape), tuple(x.shape), tuple(w.shape), a["stride"], a["padding"],
        a["dilation"], 1, False, [True, False, False], 4, _CPU)
    _check_pairs(before, after)
    assert _close(_model_peak(before, grads[0].numel() * 4, after), running_peak(events))


@needs_cpu
@pytest.mark.parametrize("name", list(CASES))
def test_backend_matches_aten(name):
    x, w, b, a = _setup(CASES[name])
    real = str(torch._C._select_conv_backend(
        x, w, b, a["stride"], a["padding"], a["dilation"], a["transposed"],
        a["output_padding"], a["groups"]))
    with torch.no_grad():
        y = torch.ops.aten.convolution(x, w, b, a["stride"], a["padding"], a["dilation"],
                                       a["transposed"], a["output_padding"], a["groups"])
    ours = conv_backend(tuple(x.shape), tuple(w.shape), tuple(y.shape), a["stride"],
                        a["padding"], a["dilation"], a["groups"], a["transposed"],
                        _DT[x.dtype], _CPU)
    expected = {"mkldnn": ("Mkldnn", "ConvBackend.???"), "slow2d": ("Slow2d",),
                "slow3d": ("Slow3d",), "slow_dilated": ("SlowDilated",),
                "slow_transpose": ("SlowTranspose",)}[ours]
    assert any(e in real for e in expected), (name, real, ours)


def test_hand_values_example_from_measurement():
    """Conv2d(16->16, 3x3) on [8,16,96,96], AVX512, fp32: input reorder, weight reorder and the
    blocked output before the output; the blocked output is freed after it."""
    before, after = conv_forward_transients((8, 16, 96, 96), (16, 16, 3, 3), (8, 16, 96, 96),
                                            1, 1, 1, 1, False, 4, CpuInfo("AVX512", 2))
    assert before == [4718592, 9216, 4718592, -9216, -4718592]
    assert after == [-4718592]
    # first layer: no input reorder with 3 input channels
    before, after = conv_forward_transients((8, 3, 96, 96), (16, 3, 3, 3), (8, 16, 96, 96),
                                            1, 1, 1, 1, False, 4, CpuInfo("AVX512", 2))
    assert before == [1728, 4718592, -1728] and after == [-4718592]


def test_unknown_capability_falls_back_to_avx512():
    args = ((8, 16, 32, 32), (16, 16, 3, 3), (8, 16, 32, 32), 1, 1, 1, 1, False, 4)
    assert (conv_forward_transients(*args, CpuInfo("DEFAULT", 2))
            == conv_forward_transients(*args, CpuInfo("AVX512", 2)))


def test_threads_reach_the_scratchpad():
    """A 3x3 conv with padding 3 (not below the kernel extent) is refused by the jit kernels and runs
    gemm, whose scratchpad is per-thread im2col columns, C_in * 9 * 36 * 36 f32 for each thread,
    booked once (+128 bytes)."""
    args = ((8, 64, 32, 32), (64, 64, 3, 3), (8, 64, 36, 36), 1, 3, 1, 1, False, 4)
    columns = 64 * 9 * 36 * 36 * 4
    for threads in (1, 2, 7):
        before, _ = conv_forward_transients(*args, CpuInfo("AVX512", threads))
        assert before[0] == threads * columns + 128, (threads, before)


def test_modules_do_not_import_torch_at_top_level():
    package = Path(onednn.__file__).parent
    for module in sorted(package.glob("*.py")):
        tree = ast.parse(module.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [alias.name for alias in node.names] + [getattr(node, "module", None) or ""]
                assert not any(name.split(".")[0] == "torch" for name in names), module.name
