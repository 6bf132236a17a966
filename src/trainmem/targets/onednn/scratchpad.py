"""Arithmetic oneDNN's convolution and RNN primitives share: rounding and scratchpad bookings.

A primitive books each piece of scratch memory with `memory_tracking::registry_t::book`
(src/common/memory_tracking.hpp); ideep then allocates the whole scratchpad as one u8 tensor through
PyTorch's CPU allocator. Every non-empty booking costs its size plus max(alignment, 128) bytes:
`default_alignment = 128`, and a `PAGE_4K`-aligned entry costs size + 4096.
"""

from __future__ import annotations

REGISTRY_ALIGNMENT = 128  # memory_tracking.hpp: `enum { default_alignment = 128 };`
PAGE_BYTES = 4096  # PAGE_4K bookings and rnn_utils.cpp's `page_size`
F32_BYTES = 4  # accumulators and reduction buffers are f32 whatever the data type
BARRIER_BYTES = 8064  # sizeof(simple_barrier::ctx_t) in this build: 8064 + 128 = 8192 measured


def round_up(value: int, multiple: int) -> int:
    """oneDNN's `utils::rnd_up`: the least multiple of `multiple` not below `value`."""
    return -(-value // multiple) * multiple


def div_up(value: int, divisor: int) -> int:
    """oneDNN's `utils::div_up`: `value / divisor` rounded up."""
    return -(-value // divisor)


def book(nbytes: int, alignment: int = REGISTRY_ALIGNMENT) -> int:
    """Bytes one scratchpad booking costs (`registry_t::book`): nothing for an empty entry."""
    return nbytes + max(alignment, REGISTRY_ALIGNMENT) if nbytes > 0 else 0
