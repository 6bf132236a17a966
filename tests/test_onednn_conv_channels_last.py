"""targets/onednn/conv_channels_last.py against the real CPU kernels on channels-last tensors (what Inductor hands
aten.convolution): the in-op peak of the model within 1% or 4 KiB of the profiler's, as test_onednn_conv.py
checks the NCHW path. Measured on an AVX512 machine (Sapphire Rapids); the sequences were written from six of
these shapes and hold on the others, which they were not written from."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from kernel_checks import memory_inside, running_peak
from trainmem.targets.cpu_info import CpuInfo
from trainmem.targets.onednn.conv import conv_backward_transients, conv_forward_transients

_CPU = CpuInfo.this_machine()
needs_avx512 = pytest.mark.skipif(not torch.backends.mkldnn.is_available() or _CPU.capability != "AVX512",
                                  reason=f"channels-last sequences measured on AVX512 (this CPU: {_CPU.capability})")

# (N, C_in, C_out, H=W, kernel, stride, bias, backward mask)
CASES = {
    "first_conv_weights_only": (8, 3, 32, 64, 3, 1, False, (False, True, False)),
    "first_conv_bias": (8, 3, 32, 64, 3, 1, True, (False, True, True)),
    "3x3_32": (8, 32, 32, 64, 3, 1, False, (True, True, False)),
    "3x3_s2": (8, 32, 64, 64, 3, 2, False, (True, True, False)),
    "1x1_s2": (8, 32, 64, 64, 1, 2, False, (True, True, False)),
    "3x3_s2_bias": (8, 64, 128, 32, 3, 2, True, (True, True, True)),
    "3x3_128": (8, 128, 128, 16, 3, 1, False, (True, True, False)),
    "3x3_256_weights_dominate": (8, 256, 256, 8, 3, 1, False, (True, True, False)),
    "3x3_256_grad_input_only": (8, 256, 256, 8, 3, 1, True, (True, False, False)),
    "3x3_64_large_image": (8, 64, 64, 56, 3, 1, False, (True, True, False)),
    "1x1_s2_128_256": (8, 128, 256, 28, 1, 2, False, (True, True, False)),
}


def _tensors(case):
    batch, cin, cout, size, kernel, stride, bias, _ = case
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, cin, size, size, generator=generator).to(memory_format=torch.channels_last)
    w = torch.randn(cout, cin, kernel, kernel, generator=generator).to(memory_format=torch.channels_last)
    b = torch.randn(cout, generator=generator) if bias else None
    return x, w, b, (stride, stride), (kernel // 2, kernel // 2)


def _in_op(fn, name):
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    return out, running_peak(memory_inside(prof, name))


def _close(model, real):
    return abs(model - real) <= max(4096, 0.01 * real)


@needs_avx512
@pytest.mark.parametrize("name", list(CASES))
def test_forward_peak(name):
    x, w, b, stride, padding = _tensors(CASES[name])
    with torch.no_grad():
        y, real = _in_op(lambda: torch.ops.aten.convolution(x, w, b, stride, padding, (1, 1), False, (0, 0), 1),
                         "aten::convolution")
    assert y.is_contiguous(memory_format=torch.channels_last)
    before, after = conv_forward_transients(tuple(x.shape), tuple(w.shape), tuple(y.shape), stride, padding, (1, 1),
                                            1, False, 4, _CPU, has_bias=b is not None, channels_last=True)
    model = running_peak([*before, y.numel() * 4, *after])
    assert _close(model, real), (name, real, model, before, after)


@needs_avx512
@pytest.mark.parametrize("name", list(CASES))
def test_backward_peak(name):
    x, w, b, stride, padding = _tensors(CASES[name])
    mask = CASES[name][-1]
    with torch.no_grad():
        y = torch.ops.aten.convolution(x, w, b, stride, padding, (1, 1), False, (0, 0), 1)
    go = torch.randn_like(y)
    grads, real = _in_op(lambda: torch.ops.aten.convolution_backward(
        go, x, w, [y.shape[1]] if b is not None else None, stride, padding, (1, 1), False, (0, 0), 1, list(mask)),
        "aten::convolution_backward")
    before, after = conv_backward_transients(tuple(go.shape), tuple(x.shape), tuple(w.shape), stride, padding,
                                             (1, 1), 1, False, mask, 4, _CPU, channels_last=True)
    assert sum(before) + sum(after) == 0
    outputs = sum(t.numel() * t.element_size() for t in grads if t is not None)
    model = running_peak([*before, outputs, *after])
    assert _close(model, real), (name, real, model, before, after)


def test_the_nchw_model_stays_for_what_was_not_measured():
    """A grouped, dilated or transposed channels-last convolution keeps the NCHW model (conv.py)."""
    grouped = conv_forward_transients((8, 32, 16, 16), (32, 8, 3, 3), (8, 32, 16, 16), (1, 1), (1, 1), (1, 1), 4,
                                      False, 4, _CPU, channels_last=True)
    assert grouped == conv_forward_transients((8, 32, 16, 16), (32, 8, 3, 3), (8, 32, 16, 16), (1, 1), (1, 1), (1, 1),
                                              4, False, 4, _CPU)
