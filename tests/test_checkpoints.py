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


class _Mixed(torch.nn.Module):
    """Buffers, parameters, submodules and plain tensor attributes interleaved: state_dict() orders
    parameters, then buffers, then submodules; the plain attribute is not state."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(3))
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(3, 3, bias=False), torch.nn.LayerNorm(3)])
        self.gate = torch.nn.Parameter(torch.zeros(3))
        self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(3, 2), "b": torch.nn.Conv1d(1, 2, 3)})
        self.plain = torch.zeros(5)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.heads["a"](x * self.scale * self.gate + self.plain[:3])


@pytest.mark.parametrize("make", [_model, _with_batch_norm, _Mixed, lambda: torch.nn.GRU(4, 6, num_layers=2),
                                  lambda: torch.nn.TransformerEncoderLayer(16, 2, 32).half()],
                         ids=["mlp", "batch-norm", "mixed", "gru", "transformer-fp16"])
def test_torchscript_archive_is_read_as_torch_jit_load_would_without_loading_it(tmp_path, make, monkeypatch):
    """The archive's parameters and buffers, in state_dict() order, read from data.pkl and the code's
    __parameters__/__buffers__ lines: the same as what torch.jit.load gives, without calling it (it
    compiles the archive's code, runs its __setstate__ and reads every storage) and without opening a
    storage member."""
    from trainmem.frontends.checkpoint import MAX_PICKLE_BYTES
    from trainmem.frontends.torchscript_archive import torchscript_entries

    path = tmp_path / "scripted.pt"
    torch.jit.script(make()).save(str(path))
    loaded = torch.jit.load(str(path))
    expected = {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in loaded.state_dict().items()}
    expected_buffers = frozenset(name for name, _ in loaded.named_buffers())

    import zipfile

    opened, real_open = [], zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, name, *a, **k: opened.append(str(getattr(name, "filename", name)))
                        or real_open(self, name, *a, **k))
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: pytest.fail("torch.jit.load called"))
    entries, buffers = torchscript_entries(path, MAX_PICKLE_BYTES)
    assert list(entries.items()) == list(expected.items()) and buffers == expected_buffers
    assert opened and not any(name.split("/")[1:2] == ["data"] for name in opened)


def test_torchscript_setstate_is_refused_and_not_run(tmp_path, capfd):
    """A scripted module with its own __setstate__ (TorchScript that torch.jit.load runs): refused naming
    the file, nothing printed, nothing allocated by it (tests/hostile/make_torchscript_setstate.py)."""
    from pathlib import Path

    archive = Path(__file__).parent / "hostile" / "torchscript_setstate.pt"
    code = main(["estimate", str(archive)])
    out, err = capfd.readouterr()
    assert code == 2 and "hello" not in out + err and len(err.strip().splitlines()) == 1
    assert "torchscript_setstate.pt" in err and "__setstate__" in err and "file.py:factory" in err


def test_legacy_pickle_declaring_more_than_the_file_holds_is_refused_unallocated(tmp_path):
    """A torch.save file from before torch 1.6 (a bare pickle) whose storage claims 25 GB: torch.load
    would allocate it on the CPU before reading; under the fake mode nothing is allocated and the
    tensor is refused for describing data the file does not hold."""
    import io
    import pickle
    from collections import OrderedDict

    from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION

    elements = 25 * 10**9 // 4
    storage = object()

    class Tensor:
        def __reduce__(self):
            return torch._utils._rebuild_tensor_v2, (storage, 0, (elements,), (1,), False, OrderedDict())

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", elements, None) if obj is storage else None

    buffer = io.BytesIO()
    for header in (MAGIC_NUMBER, PROTOCOL_VERSION, {"protocol_version": PROTOCOL_VERSION, "little_endian": True,
                                                    "type_sizes": {}}):
        pickle.dump(header, buffer, protocol=2)
    Pickler(buffer, protocol=2).dump({"weight": Tensor()})
    pickle.dump(["0"], buffer, protocol=2)
    path = tmp_path / "old.pt"
    path.write_bytes(buffer.getvalue() + b"\0" * 64)
    with pytest.raises(ModelRefError, match=r"'weight' to fit in the \d+ bytes of tensor data the file holds"):
        estimate(str(path))


def test_legacy_pickle_state_dict_still_estimates(tmp_path):
    path = tmp_path / "old.pt"
    torch.save(_model().state_dict(), path, _use_new_zipfile_serialization=False)
    assert estimate(str(path)).parameters == N_PARAMS
