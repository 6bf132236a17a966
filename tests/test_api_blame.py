"""Errors from the Python API name what the caller typed, not a field another option filled in."""

import pytest

import trainmem
from trainmem.errors import TrainmemError


def test_qlora_on_a_gpu_without_bf16_blames_qlora_through_the_api():
    # --qlora sets precision bf16-mixed itself; the T4 (cc 7.5) has no bf16
    with pytest.raises(TrainmemError) as caught:
        trainmem.estimate("mlp:64-64-10", device="t4", qlora=True, batch_size=2, input_shape=64)
    message = str(caught.value)
    assert message.startswith("--qlora (its precision bf16-mixed):")
    assert "for --precision" not in message


def test_a_precision_the_caller_gave_is_blamed_as_such():
    with pytest.raises(TrainmemError) as caught:
        trainmem.estimate("mlp:64-64-10", device="t4", precision="bf16-mixed", batch_size=2, input_shape=64)
    assert str(caught.value).startswith("--precision: expected a GPU with bf16")
