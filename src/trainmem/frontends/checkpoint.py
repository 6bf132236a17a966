"""Checkpoints as model references: `.pt/.pth/.bin` (torch.save), `.safetensors`, TorchScript archives.

Nothing in a checkpoint is executed and no tensor data is read:
* torch.save files are opened with `torch.load(weights_only=True, map_location="meta")`: the restricted
  unpickler refuses any global it does not know (a malicious `__reduce__` is refused before it runs),
  and meta storages read no bytes;
* `.safetensors` files are read from their header only: 8 bytes of little-endian header length, then
  a JSON table of dtype, shape and data offsets per tensor (the format's specification,
  github.com/huggingface/safetensors). Parsing those few lines needs no dependency;
* a TorchScript archive (a zip with a `code/` folder) is loaded with `torch.jit.load(map_location="meta")`
  for its parameters and buffers (TorchScript holds only torch operators; nothing is run).

A state dict alone has no forward: it gives the model states (parameters, gradients, optimizer
state) and the result says that activations need the architecture.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError

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

    path = Path(ref)
    if not path.is_file():
        raise ModelRefError(f"expected a checkpoint file, found none at {ref!r}", where="MODEL")
    buffers = None  # which tensors are buffers, where the file says (TorchScript)
    if path.suffix.lower() == ".safetensors":
        entries = safetensors_header(path)
    elif _is_torchscript(path):
        entries, buffers = torchscript_entries(path)
    else:
        entries = torch_save_entries(path)
    return ModelSource(ref=ref, name=path.name, build=lambda: state_dict_module(entries, buffers),
                       make_batch=_no_inputs, loss_fn=_output_is_loss, notes=(STATE_DICT_NOTE,))

def safetensors_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype name) from a .safetensors header; no tensor bytes are read."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100 * 2**20:
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(handle.read(length))
        entries = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            entries[name] = (tuple(int(d) for d in info["shape"]), _SAFETENSORS_DTYPES[info["dtype"]])
    except (OSError, ValueError, KeyError, TypeError, struct.error) as error:
        raise ModelRefError(f"expected a .safetensors file (8-byte length + JSON header), could not read it: "
                            f"{error}", where=str(path)) from None
    return entries


def torch_save_entries(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of the tensors of a torch.save checkpoint, loaded onto meta with the
    restricted unpickler; a checkpoint holding a state dict under a usual key is unwrapped."""
    import pickle

    import torch

    try:
        loaded = torch.load(path, map_location="meta", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch names the class or function the pickle asks for ("GLOBAL pkg.mod.Name was not an allowed
        # global"); its advice to allowlist it is not ours to give for a file we only estimate
        found = re.search(r"GLOBAL (\S+)", str(error))
        detail = (f"it asks for {found.group(1)}, which loading would import and call" if found
                  else str(error).splitlines()[0])
        raise ModelRefError(f"expected a checkpoint that torch.load(weights_only=True) accepts; refused, nothing "
                            f"executed: {detail}. Save model.state_dict() instead, or give the architecture "
                            "(torchvision:NAME, hf:NAME, file.py:factory)", where=str(path)) from None
    except (OSError, RuntimeError, EOFError) as error:
        raise ModelRefError(f"expected a torch.save checkpoint, could not read it: {str(error).splitlines()[0]}",
                            where=str(path)) from None
    state = _find_state_dict(loaded)
    if not state:
        raise ModelRefError("expected a state dict (a mapping of names to tensors), found no tensors",
                            where=str(path))
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


def _is_torchscript(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return any("/code/" in name for name in archive.namelist())
    except zipfile.BadZipFile:
        return False


def torchscript_entries(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], str]], frozenset[str]]:
    """The parameters and buffers of a TorchScript archive, loaded onto meta, and which are buffers. Its
    scripted forward is not traced (a ScriptModule's parameters cannot be swapped for fake ones): model
    states only."""
    import torch

    try:
        scripted = torch.jit.load(str(path), map_location="meta")
    except RuntimeError as error:
        raise ModelRefError(f"expected a TorchScript archive, could not load it: {str(error).splitlines()[0]}",
                            where=str(path)) from None
    entries = {name: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in scripted.state_dict().items()}
    return entries, frozenset(name for name, _ in scripted.named_buffers())
