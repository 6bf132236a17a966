"""Each optimizer's state size, by rule (hand-computed from the optimizer's source), against the trace."""

from __future__ import annotations

import pytest

from trainmem import estimate

# mlp:IN-H-OUT: weights [H, IN], [OUT, H] and biases [H], [OUT]
SHAPES = [(512, 256), (512,), (10, 512), (10,)]
NUMELS = [256 * 512, 512, 512 * 10, 10]
KW = dict(batch_size=4, input_shape="256")


def _state(optimizer: str, device: str = "cpu") -> int:
    return estimate("mlp:256-512-10", optimizer=optimizer, device=device, steps=2, **KW).breakdown["optimizer_state"]


def _cpu(nbytes: int) -> int:  # the CPU breakdown counts requested bytes (alignment goes to runtime)
    return nbytes


def test_lion_keeps_one_buffer():
    assert _state("lion") == sum(_cpu(4 * n) for n in NUMELS)


def test_adafactor_keeps_factored_second_moments():
    """torch/optim/_adafactor.py: row_var [..., rows, 1] and col_var [..., 1, cols] for a matrix,
    variance for a vector (all fp32 here)."""
    expected = 0
    for shape in SHAPES:
        if len(shape) > 1:
            expected += _cpu(4 * shape[0]) + _cpu(4 * shape[1])
        else:
            expected += _cpu(4 * shape[0])
    assert _state("adafactor") == expected


def test_adamw_8bit_layout():
    """bitsandbytes Optimizer2State: ≥ 4096 elements: two uint8 states + two fp32 absmax per 256-element
    block; smaller tensors keep two fp32 states; two 256-entry fp32 maps shared by all."""
    expected = 0
    for n in NUMELS:
        if n < 4096:
            expected += 2 * _cpu(4 * n)
        else:
            expected += 2 * _cpu(n) + 2 * _cpu(4 * -(-n // 256))
    expected += 2 * _cpu(4 * 256)
    assert _state("adamw-8bit") == expected


def test_paged_states_leave_the_caching_allocator():
    """PagedAdamW8bit puts states of tensors with ≥ 100k elements in managed memory: not in
    allocated/reserved, but in nvidia-smi."""
    plain = estimate("mlp:256-512-10", optimizer="adamw-8bit", device="a100-40gb", **KW)
    paged = estimate("mlp:256-512-10", optimizer="paged-adamw-8bit", device="a100-40gb", **KW)
    big = 256 * 512  # the one tensor over 100k elements: two uint8 states of its size
    assert plain.breakdown["optimizer_state"] - paged.breakdown["optimizer_state"] == 2 * big
    assert paged.process_parts["managed_memory"] == 2 * big
    assert paged.allocated_bytes < plain.allocated_bytes


def test_paged_adamw_keeps_32_bit_states_and_pages_the_large_ones():
    """bitsandbytes PagedAdamW (optim_bits=32; LitGPT's optimizer under --quantize bnb.*): two fp32 states for every
    parameter, whatever its dtype (get_state_buffer), those of tensors with ≥ 100k elements in managed memory."""
    assert _state("paged-adamw") == sum(2 * _cpu(4 * n) for n in NUMELS)
    bf16 = estimate("mlp:256-512-10", optimizer="paged-adamw", precision="bf16", steps=2, **KW)
    assert bf16.breakdown["optimizer_state"] == sum(2 * 4 * n for n in NUMELS)
    paged = estimate("mlp:256-512-10", optimizer="paged-adamw", device="a100-40gb", **KW)
    big = 256 * 512
    assert paged.process_parts["managed_memory"] == 2 * 4 * big
    # the GPU breakdown counts each request as the caching allocator rounds it (512 B)
    assert paged.breakdown["optimizer_state"] == sum(2 * -(-4 * n // 512) * 512 for n in NUMELS if n < 100_000)


@pytest.mark.parametrize("optimizer", ["lion", "adamw-8bit", "paged-adamw"])
def test_single_implementation_optimizers_refuse_an_impl(optimizer):
    from trainmem.errors import SetupError
    with pytest.raises(SetupError, match="optimizer-impl"):
        estimate("mlp:8-8", optimizer=optimizer, optimizer_impl="foreach", input_shape="8")
