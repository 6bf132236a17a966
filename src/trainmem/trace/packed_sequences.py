"""Packed sequences on fake tensors: pad_packed_sequence, after pack_padded_sequence's rule (trace/rules.py).

Why. `pack_padded_sequence` asks for the sequences' lengths, which fake tensors do not have; its rule packs every
sequence at the padded length, the most the packed data can hold, and hands back the batch sizes as a real CPU
tensor (T entries of B), as the real op makes them. The packed RNN kernels read those values and run. But
`_pad_packed_sequence` is a composite (aten/src/ATen/native/PackedSequence.cpp): it allocates its `lengths` with
at::empty, which the fake mode makes fake, and then writes into it through a data pointer, which a fake tensor has
not. So the call is answered here, above the dispatcher, with what the op allocates:
- forward: the padded output, `data.new_full([T, B, *features], padding_value)` (batch-first: its transposed
  view), T the longer of the batch sizes' length and `total_length`; and `lengths` (B int64 on the CPU, real, as
  the op returns it: each sequence at the length its batch sizes give);
- backward: the gradient of the packed data, one tensor of the data's shape (the op's narrow/copy_ pieces sum
  into it; autograd's narrow backward makes it with zeros).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from trainmem.trace.torch_private import FakeTensor, disable_current_modes

_PAD = "_pad_packed_sequence"  # torch._VF's, as nn.utils.rnn.pad_packed_sequence calls it


class _PadPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, data: torch.Tensor, steps: int, batch: int, batch_first: bool, padding_value: float):
        ctx.data_shape = data.shape
        padded = data.new_full((steps, batch, *data.shape[1:]), padding_value)
        return padded.transpose(0, 1) if batch_first else padded

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.new_zeros(ctx.data_shape), None, None, None, None


def packed_lengths(batch: int, steps: int, dataset: tuple[int, ...] | None) -> tuple[list[int], str]:
    """The lengths pack_padded_sequence packs, longest first, and the assumption in the report's words: every
    sequence at the padded length (the bound), or the B longest of the dataset's lengths, each at most the padded
    length (the batch of them is the largest any batch of that dataset can pack; a dataset of fewer than B takes
    its longest for the rest)."""
    if not dataset:
        return [steps] * batch, "every sequence at the padded length (the bound)"
    longest = sorted((min(n, steps) for n in dataset), reverse=True)[:batch]
    longest = [longest[0]] * (batch - len(longest)) + longest
    return longest, (f"the batch of the {batch} longest of the {len(dataset):,} --seq-lengths given "
                     f"({sum(longest):,} of {batch * steps:,} padded positions)")


def _lengths(batch_sizes: torch.Tensor) -> torch.Tensor:
    """Each sequence's length from the batch sizes, as the op computes it (sorted, longest first)."""
    sizes = batch_sizes.tolist()
    return torch.tensor([sum(1 for size in sizes if size > b) for b in range(sizes[0] if sizes else 0)],
                        dtype=torch.int64)


class PaddedUnpacking(TorchFunctionMode):
    """Answers `_pad_packed_sequence` on fake data whose batch sizes are real (the module docstring)."""

    def __init__(self, recorder) -> None:
        super().__init__()
        self.recorder = recorder  # its rules count the assumption, under the module running

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) != _PAD:
            return func(*args, **kwargs)
        data, batch_sizes, batch_first, padding_value, total_length = _arguments(args, kwargs)
        if isinstance(batch_sizes, FakeTensor) or batch_sizes.numel() == 0:
            return func(*args, **kwargs)  # not ours to answer: the op's own error says what failed
        with disable_current_modes():
            lengths = _lengths(batch_sizes)
            steps = max(batch_sizes.numel(), int(total_length))
            batch = int(batch_sizes[0])
        self.recorder.rules.fired[("_pad_packed_sequence", self.recorder.modules.current(),
                                   "lengths from the packed batch sizes")] += 1
        return _PadPacked.apply(data, steps, batch, bool(batch_first), float(padding_value)), lengths


def _arguments(args: tuple, kwargs: dict) -> tuple:
    names = ("data", "batch_sizes", "batch_first", "padding_value", "total_length")
    values = dict(zip(names, args))
    values.update(kwargs)
    return tuple(values[name] for name in names)
