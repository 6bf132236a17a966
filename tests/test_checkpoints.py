"""Checkpoint references: torch.save state dicts (plain and wrapped), .safetensors headers, TorchScript
archives — model states only, nothing executed, no tensor bytes read."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch

from trainmem import estimate
from trainmem.cli import main
from trainmem.errors import ModelRefError

N_PARAMS = 64 * 32 + 32 + 32 * 10 + 10


def _model():
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def test_state_dict_gives_model_states(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(_model().state_dict(), path)
    est = estimate(str(path), optimizer="adamw", device="a100-40gb")
    assert est.parameters == N_PARAMS
    # exp_avg and exp_avg_sq per parameter tensor, each rounded up to 512 B by the caching allocator
    sizes = [64 * 32 * 4, 32 * 4, 32 * 10 * 4, 10 * 4]
    assert est.breakdown["optimizer_state"] == 2 * sum(-(-n // 512) * 512 for n in sizes)
    assert any("state dict" in w and "activations need the architecture" in w for w in est.warnings)


def test_wrapped_checkpoint_is_unwrapped(tmp_path):
    path = tmp_path / "ckpt.pth"
    torch.save({"epoch": 3, "state_dict": _model().state_dict(), "lr": 0.1}, path)
    assert estimate(str(path)).parameters == N_PARAMS


def test_freeze_uses_the_checkpoint_names(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(_model().state_dict(), path)
    est = estimate(str(path), freeze=("0.*",))
    assert est.trainable_parameters == 32 * 10 + 10


def test_safetensors_header_only(tmp_path):
    """A header that promises 1 GiB of data: only the header is read, so a file of a few bytes works."""
    header = {"w": {"dtype": "BF16", "shape": [16384, 32768], "data_offsets": [0, 2**30]},
              "n": {"dtype": "I64", "shape": [], "data_offsets": [2**30, 2**30 + 8]},
              "__metadata__": {"format": "pt"}}
    blob = json.dumps(header).encode()
    path = tmp_path / "big.safetensors"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)
    est = estimate(str(path), optimizer="sgd")
    assert est.parameters == 16384 * 32768
    assert est.breakdown["parameters"] == 2**30


def test_torchscript_archive(tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.script(_model()).save(str(path))
    assert estimate(str(path)).parameters == N_PARAMS


def _with_batch_norm():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(),
                               torch.nn.Linear(8, 2))


BN_PARAMS = 8 * 27 + 8 + 2 * 8 + 8 * 2 + 2  # conv, BatchNorm's weight and bias, linear


def test_batch_norm_statistics_are_buffers(tmp_path):
    """A state dict does not say which tensors are parameters: BatchNorm's running statistics and batch
    counter are buffers by their names; TorchScript says so itself."""
    path = tmp_path / "bn.pt"
    torch.save(_with_batch_norm().state_dict(), path)
    est = estimate(str(path), optimizer="adam")
    assert est.parameters == est.trainable_parameters == BN_PARAMS
    assert est.breakdown["buffers"] >= 2 * 8 * 4 + 8
    scripted = tmp_path / "bn_scripted.pt"
    torch.jit.script(_with_batch_norm()).save(str(scripted))
    assert estimate(str(scripted)).parameters == BN_PARAMS


def test_a_pickled_model_object_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(_with_batch_norm(), path)
    with pytest.raises(ModelRefError, match=r"asks for torch.nn.modules.container.Sequential.*Save "
                                            r"model.state_dict\(\) instead"):
        estimate(str(path))


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_not_run(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    evil = _Evil()
    evil.marker = marker
    path = tmp_path / "evil.pt"
    torch.save({"weights": evil}, path)
    code = main(["estimate", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "refused, nothing executed" in err and "system" in err
    assert not marker.exists()


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(ModelRefError, match="found none"):
        estimate(str(tmp_path / "nope.pt"))
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x01\x00")
    with pytest.raises(ModelRefError, match="safetensors"):
        estimate(str(junk))
