"""Check `trainmem.targets.onednn_rnn` against the real `aten.mkldnn_rnn_layer` workspace.

The real op is only run on CPU builds with oneDNN. bfloat16 cases are skipped where oneDNN has
no bf16 support on this CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

try:
    import trainmem  # noqa: F401
except ImportError:  # running from a checkout without PYTHONPATH=src
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from trainmem.targets.onednn_rnn import (  # noqa: E402
    get_good_ld,
    lstm_module_workspace_bytes,
    lstm_workspace_bytes,
)

_HAS_MKLDNN = torch.backends.mkldnn.is_available()
_HAS_BF16 = _HAS_MKLDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()

needs_mkldnn = pytest.mark.skipif(not _HAS_MKLDNN, reason="torch built without oneDNN")

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
    assert lstm_workspace_bytes(T, B, I, H, bidirectional=bidir, dtype_bytes=4) == real


@pytest.mark.skipif(not _HAS_BF16, reason="oneDNN bf16 unsupported on this CPU")
@pytest.mark.parametrize("T,B,I,H,reverse,bidir", SHAPES[::2])
def test_bf16_matches_real_op(T, B, I, H, reverse, bidir):
    real = _real_workspace(T, B, I, H, torch.bfloat16, reverse, bidir)
    assert lstm_workspace_bytes(T, B, I, H, bidirectional=bidir, dtype_bytes=2) == real


@pytest.mark.skipif(not _HAS_BF16, reason="oneDNN bf16 unsupported on this CPU")
def test_bf16_with_f32_cell_state():
    real = _real_workspace(10, 4, 64, 64, torch.bfloat16, cell_dtype=torch.float32)
    assert lstm_workspace_bytes(10, 4, 64, 64, dtype_bytes=2, cell_state_bytes=4) == real


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
    assert rec.ws == lstm_module_workspace_bytes(T, B, I, H, num_layers=2, bidirectional=True)


def test_get_good_ld_rules():
    # f32: rounded up to 16 elements, and one more 16 when the result is a multiple of 256.
    assert get_good_ld(1, 4) == 16
    assert get_good_ld(240, 4) == 240
    assert get_good_ld(256, 4) == 272
    # bf16: rounded up to 32 elements.
    assert get_good_ld(33, 2) == 64
    assert get_good_ld(512, 2) == 544


def test_page_rounding_smallest_case():
    # 7 regions, each smaller than a page, give 7 pages.
    assert lstm_workspace_bytes(1, 1, 1, 1) == 7 * 4096
