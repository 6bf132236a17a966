"""Checkpoints as model references: `.pt/.pth/.bin` (torch.save), `.safetensors`, TorchScript archives.

Nothing in a checkpoint is executed and no tensor data is read:
* only a regular file is opened (files.py: a FIFO would block, a device never end); a zip's central
  directory is counted before any zip reader parses it (zip_directory.py), and members that loading
  inflates (data.pkl) are bounded from their declared sizes (a zip bomb is refused unread);
* torch.save files are opened with `torch.load(weights_only=True, map_location="meta")` inside a fake
  mode: the restricted unpickler refuses any global it does not know (a malicious `__reduce__` is
  refused before it runs), and every storage is made on meta, reading no bytes (without the fake mode,
  a pickle from torch before 1.6 has its storages allocated on the CPU at their declared sizes); a
  tensor larger than the tensor data the file holds is refused;
* `.safetensors` files are read from their header only: 8 bytes of little-endian header length, then
  a JSON table of dtype, shape and data offsets per tensor (the format's specification,
  github.com/huggingface/safetensors). Parsing those few lines needs no dependency;
* a TorchScript archive (a zip with a `code/` folder) is never given to torch.jit.load, which compiles
  the archive's code, runs its scripted `__setstate__` methods and reads every storage even onto meta:
  its parameters and buffers are read from its data.pkl and code as data (torchscript_archive.py).

A state dict alone has no forward: it gives the model states (parameters, gradients, optimizer
state) and the result says that activations need the architecture.
"""

from __future__ import annotations

import json
import math
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError, one_line, quote, short
from trainmem.files import regular_file
from trainmem.frontends.torchscript_archive import is_torchscript, torchscript_entries
from trainmem.frontends.zip_directory import count_members

# A state dict's pickle holds names, shapes and storage keys, ~200 bytes a tensor: 64 MiB is 300,000
# tensors. A larger data.pkl (once inflated) is not a state dict but a zip bomb or pickled data.
MAX_PICKLE_BYTES = 64 << 20
# Each tensor becomes a parameter the trace runs forward, backward and the optimizer over; 50,000 is
# above the largest mixture-of-experts checkpoints (Qwen3-235B-A22B: ~36,000 tensors) and refuses a
# header that lists hundreds of thousands of one-element tensors to make the trace run for hours.
MAX_CHECKPOINT_TENSORS = 50_000
# Members of a torch.save or TorchScript zip: one per tensor storage, a few records (data.pkl, version,
# byteorder), and for TorchScript two per scripted class (its code and debug table): the tensor bound
# and 10,000 more. Counted from the central directory before a zip reader parses it (zip_directory.py).
MAX_ZIP_MEMBERS = MAX_CHECKPOINT_TENSORS + 10_000
_SAFETENSORS_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                         "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_MAX_ELEMENTS = 2**63 - 1  # a tensor's element count is an int64 (c10 TensorImpl::numel_)

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")
_STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module", "net")
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                       "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
                       "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
STATE_DICT_NOTE = ("this reference is a state dict: parameters, gradients and optimizer state are estimated; "
                   "activations need the architecture (give the model as file.py:factory or hf:…)")


def is_checkpoint(ref: str) -> bool:
    return ref.lower().endswith(CHECKPOINT_SUFFIXES)


def from_checkpoint(ref: str):
    from trainmem.frontends import ModelSource

    path, size = regular_file(ref, "a checkpoint file")
    if size == 0:
        raise ModelRefError("expected a checkpoint, got an empty file", where=short(ref))
    buffers = None  # which tensors are buffers, where the file says (TorchScript)
    if path.suffix.lower() == ".safetensors":
        entries = safetensors_header(path)
    else:
        count_members(path, MAX_ZIP_MEMBERS)  # a zip's directory is bounded before any zip reader parses it
        if is_torchscript(path):
            _check_zip_members(path)
            entries, buffers = torchscript_entries(path, MAX_PICKLE_BYTES)
            if len(entries) > MAX_CHECKPOINT_TENSORS:
                raise ModelRefError(f"expected at most {MAX_CHECKPOINT_TENSORS:,} tensors, got {len(entries):,}",
                                    where=short(ref))
        else:
            entries = torch_save_entries(path)
    return ModelSource(ref=ref, name=path.name, build=lambda: state_dict_module(entries, buffers),
                       make_batch=_no_inputs, loss_fn=_output_is_loss, notes=(STATE_DICT_NOTE,))

def safetensors_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype name) from a .safetensors header; no tensor bytes are read. Each entry is
    checked as the format requires: known dtype, whole non-negative dimensions, and data_offsets that
    span exactly shape × itemsize bytes (a header cannot claim a tensor the file does not hold)."""
    where = short(str(path))
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100 * 2**20:
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(handle.read(length))
        if not isinstance(header, dict):
            raise ValueError(f"a header that is a JSON {type(header).__name__}, not an object")
    except (OSError, ValueError, struct.error) as error:
        raise ModelRefError(f"expected a .safetensors file (8-byte length + JSON header), could not read it: "
                            f"{one_line(error)}", where=where) from None
    if len(header) > MAX_CHECKPOINT_TENSORS:
        raise ModelRefError(f"expected at most {MAX_CHECKPOINT_TENSORS:,} tensors, got {len(header):,}", where=where)
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        entries[name] = _safetensors_entry(name, info, where)
    return entries


def _safetensors_entry(name: str, info: Any, where: str) -> tuple[tuple[int, ...], str]:
    bad = lambda what: ModelRefError(f"expected tensor {quote(name)} {what}, got {quote(info)}", where=where)  # noqa: E731
    if not isinstance(info, dict) or info.get("dtype") not in _SAFETENSORS_ITEMSIZE:
        raise bad(f"with a dtype among {', '.join(_SAFETENSORS_ITEMSIZE)}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise bad("with a shape of whole non-negative numbers")
    numel = math.prod(shape)
    if numel > _MAX_ELEMENTS:
        raise bad(f"within a tensor's int64 element count ({_MAX_ELEMENTS:,})")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
            or offsets[1] - offsets[0] != numel * _SAFETENSORS_ITEMSIZE[info["dtype"]]):
        raise bad("whose data_offsets span shape × itemsize bytes")
    return tuple(shape), _SAFETENSORS_DTYPES[info["dtype"]]


def _check_zip_members(path: Path) -> None:
    """A zip bomb inflates a small file into gigabytes when torch reads its data.pkl: the members' sizes
    are in the zip's central directory, read before anything is inflated."""
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if member.filename.endswith(".pkl") and member.file_size > MAX_PICKLE_BYTES:
                    raise ModelRefError(f"expected a state dict's pickle of at most {MAX_PICKLE_BYTES:,} bytes, got "
                                        f"{member.filename} of {member.file_size:,} bytes once inflated",
                                        where=short(str(path)))
    except (zipfile.BadZipFile, OSError):
        return  # not a zip (a legacy torch.save file): torch.load reports what it is


def _stored_bytes(path: Path) -> int:
    """The bytes of tensor data the file holds: its storages under data/ (a zip), else the whole file (a
    pickle from torch before 1.6 stores them after the pickle). No tensor of an honest file is larger:
    a pickle declaring more describes data that is not there."""
    try:
        with zipfile.ZipFile(path) as archive:
            return sum(member.file_size for member in archive.infolist() if member.filename.split("/")[1:2] == ["data"])
    except (zipfile.BadZipFile, OSError):
        return path.stat().st_size


def _torch_reason(error: BaseException) -> str:
    """The useful sentence of torch's message: the weights-only unpickler's own reason where it gives
    one, else the first sentence (miniz and torch.load append paragraphs of advice)."""
    text = str(error)
    found = re.search(r"WeightsUnpickler error: ([^\n]+)", text)
    first = found.group(1) if found else (text.strip().splitlines() or [type(error).__name__])[0]
    sentence = re.split(r"(?<=[.!?]) ", first, maxsplit=1)[0].rstrip(".")
    return one_line(sentence, limit=160)


def torch_save_entries(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of the tensors of a torch.save checkpoint, loaded onto meta with the
    restricted unpickler; a checkpoint holding a state dict under a usual key is unwrapped."""
    import pickle

    import torch
    from trainmem.trace.torch_private import FakeTensorMode

    _check_zip_members(path)
    try:
        # under a fake mode torch.load makes every storage on meta, whatever the format: without it a
        # pickle from torch before 1.6 has each storage allocated on the CPU at the size its pickle
        # declares (serialization.py's _legacy_load), then read from the file
        with FakeTensorMode():
            loaded = torch.load(path, map_location="meta", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch names the class or function the pickle asks for ("GLOBAL pkg.mod.Name was not an allowed
        # global"); its advice to allowlist it is not ours to give for a file we only estimate
        found = re.search(r"GLOBAL (\S+)", str(error))
        detail = (f"it asks for {found.group(1)}, which loading would import and call" if found
                  else _torch_reason(error))
        raise ModelRefError(f"expected a checkpoint that torch.load(weights_only=True) accepts; refused, nothing "
                            f"executed: {detail}. Save model.state_dict() instead, or give the architecture "
                            "(torchvision:NAME, hf:NAME, file.py:factory)", where=short(str(path))) from None
    except Exception as error:  # noqa: BLE001 - OSError, RuntimeError, EOFError, IndexError on empty or cut files …
        raise ModelRefError(f"expected a torch.save checkpoint, could not read it: {_torch_reason(error)}",
                            where=short(str(path))) from None
    state = _find_state_dict(loaded)
    if not state:
        raise ModelRefError("expected a state dict (a mapping of names to tensors), found no tensors",
                            where=short(str(path)))
    if len(state) > MAX_CHECKPOINT_TENSORS:
        raise ModelRefError(f"expected at most {MAX_CHECKPOINT_TENSORS:,} tensors, got {len(state):,}",
                            where=short(str(path)))
    held = _stored_bytes(path)
    for name, tensor in state.items():
        if tensor.layout == torch.strided and tensor.numel() * tensor.element_size() > held:
            raise ModelRefError(f"expected tensor {quote(name)} to fit in the {held:,} bytes of tensor data the file "
                                f"holds, got shape {list(tensor.shape)} of {tensor.dtype}", where=short(str(path)))
    return {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in state.items()}


def _find_state_dict(loaded: Any) -> dict:
    import torch

    if isinstance(loaded, dict):
        tensors = {k: v for k, v in loaded.items() if isinstance(v, torch.Tensor)}
        if tensors and len(tensors) == len(loaded):
            return tensors
        for key in _STATE_DICT_KEYS:
            if isinstance(loaded.get(key), dict):
                found = _find_state_dict(loaded[key])
                if found:
                    return found
        return tensors
    return {}


# leaf names that torch and transformers modules register as buffers, not parameters (a state dict does
# not say which is which): BatchNorm's running statistics and batch counter, rotary frequencies,
# position ids, GPT-2's attention masks
BUFFER_LEAVES = frozenset({"running_mean", "running_var", "num_batches_tracked", "inv_freq", "position_ids",
                           "masked_bias", "token_type_ids"})


def state_dict_module(entries: dict[str, tuple[tuple[int, ...], str]], buffers: frozenset[str] | None = None):
    """A module holding the state dict's tensors under their own names (so --freeze patterns and the
    per-module table read as in the checkpoint). Which tensors are buffers: `buffers` when the file says
    (TorchScript), else the non-floating tensors and those named as torch's modules name their buffers
    (BUFFER_LEAVES); the other floating tensors are trainable parameters. Its forward touches one element
    of each parameter, so backward gives each a gradient of its full size, as any forward would, and no
    activation worth counting."""
    import torch

    class StateDictModel(torch.nn.Module):
        def forward(self):
            return torch.stack([p.reshape(-1)[0].float() for p in self.parameters()]).sum()

    root = StateDictModel()
    for name, (shape, dtype) in entries.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part) or not isinstance(getattr(module, part), torch.nn.Module):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        tensor = torch.empty(shape, dtype=getattr(torch, dtype))
        is_buffer = name in buffers if buffers is not None else leaf in BUFFER_LEAVES
        if tensor.is_floating_point() and not is_buffer:
            module.register_parameter(leaf, torch.nn.Parameter(tensor))
        else:
            module.register_buffer(leaf, tensor)
    return root


def _no_inputs(batch_size: int) -> tuple:
    return ()


def _output_is_loss(output: Any, inputs: Any, *target: Any) -> Any:
    return output
