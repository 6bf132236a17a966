"""A TorchScript archive's parameters and buffers, read without loading it.

torch.jit.load runs code from the archive: a scripted class's `__setstate__` is TorchScript that the
loader executes while it rebuilds the module (it may print, allocate gigabytes, read files through
torch ops). A checkpoint given as a model reference is data, so trainmem never calls torch.jit.load on
it. Decision: the archive's module tree is read from its `data.pkl` with a restricted unpickler that
builds nothing but records:

* a scripted class (`__torch__.…` global) becomes a `ScriptObject` holding the attribute dict the pickle
  gives it; a class whose pickled state is not that dict has its own `__setstate__`, which loading
  would run: such an archive is refused, with how to estimate it anyway (a file.py:factory that calls
  torch.jit.load: the user choosing to run it);
* a tensor (`torch._utils._rebuild_tensor_v2`) becomes its shape and dtype; its storage (a persistent
  id naming a `data/` member) is never read;
* TorchScript's list and dict helpers (`torch.jit._pickle`) and OrderedDict are plain containers;
  any other global is refused.

Which tensors are parameters and which buffers is written in the archive's code, one class per
`code/` file: `__parameters__ = ["weight", "bias", ]` and `__buffers__ = [...]` lines, read as text
with ast.literal_eval (literals only). The code is otherwise never run.
"""

from __future__ import annotations

import ast
import io
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError, one_line, quote, short

Entries = dict[str, tuple[tuple[int, ...], str]]

# torch's typed storage classes, as data.pkl names them (`torch FloatStorage`), → dtype names
_STORAGE_DTYPES = {"DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
                   "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
                   "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
                   "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128"}
# The Python source TorchScript stores per class in code/: a few KiB per module type, a few MB for the
# largest scripted models. It is read (inflated) whole to find the parameter and buffer lists, so its
# declared size is bounded before a byte is inflated.
MAX_TORCHSCRIPT_CODE_BYTES = 16 << 20
_CLASS_LINE = re.compile(r"^class (\w+)\(", re.MULTILINE)
_LIST_LINE = re.compile(r"^  (__parameters__|__buffers__) = (\[.*\])$", re.MULTILINE)


class ScriptObject:
    """A scripted module or object as data.pkl describes it: its class's qualified name and state."""

    qualified_name = ""

    def __setstate__(self, state: Any) -> None:  # pickle's BUILD: only recorded
        self.state = state


class TensorRecord:
    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> TensorRecord:
    dtype, _numel = storage
    if not isinstance(size, (tuple, list)) or not all(isinstance(d, int) and d >= 0 for d in size):
        raise pickle.UnpicklingError(f"a tensor shape {quote(size)}")
    return TensorRecord(tuple(size), dtype)


def _same(value: Any, *rest: Any) -> Any:
    return value


def _ordered_dict(*items: Any) -> dict:
    return dict(*items)


class _ArchiveUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.classes: dict[str, type] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "__torch__" or module.startswith("__torch__."):
            qualified = f"{module}.{name}"
            if qualified not in self.classes:
                self.classes[qualified] = type(name, (ScriptObject,), {"qualified_name": qualified})
            return self.classes[qualified]
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        if module == "torch.jit._pickle" and name in ("build_intlist", "build_doublelist", "build_boollist",
                                                      "build_tensorlist", "build_complexlist", "restore_type_tag"):
            return _same
        if (module, name) == ("collections", "OrderedDict"):
            return _ordered_dict
        raise pickle.UnpicklingError(f"it asks for {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        # ('storage', dtype (from a storage class above), key, location, numel): the storage is not read
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], str)
                and isinstance(pid[4], int) and pid[4] >= 0):
            raise pickle.UnpicklingError(f"a storage reference {quote(pid)}")
        return pid[1], pid[4]


def is_torchscript(path: Path) -> bool:
    """A zip with an ARCHIVE/code/ folder (torch.jit.save); False for anything that is not a zip."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.split("/")[1:2] == ["code"] for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def torchscript_entries(path: Path, max_pickle_bytes: int) -> tuple[Entries, frozenset[str]]:
    """name -> (shape, dtype) of the archive's parameters and buffers, in the order the loaded module's
    state_dict() gives them, and which of them are buffers. What is inflated is bounded first: data.pkl
    by `max_pickle_bytes`, the code by MAX_TORCHSCRIPT_CODE_BYTES (declared sizes, from the zip's
    central directory); the tensor storages are never read."""
    where = short(str(path))
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            pickles = [member for member in members if member.filename.count("/") == 1
                       and member.filename.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise ModelRefError(f"expected a TorchScript archive with one ARCHIVE/data.pkl, got {len(pickles)}",
                                    where=where)
            root = pickles[0].filename.split("/")[0]
            code = [member for member in members if member.filename.startswith(f"{root}/code/")
                    and member.filename.endswith(".py")]
            code_bytes = sum(member.file_size for member in code)
            if pickles[0].file_size > max_pickle_bytes or code_bytes > MAX_TORCHSCRIPT_CODE_BYTES:
                raise ModelRefError(f"expected a TorchScript archive whose data.pkl holds at most {max_pickle_bytes:,} "
                                    f"bytes and code at most {MAX_TORCHSCRIPT_CODE_BYTES:,}, got "
                                    f"{pickles[0].file_size:,} and {code_bytes:,} once inflated", where=where)
            unpickler = _ArchiveUnpickler(archive.read(pickles[0]))
            texts = {member.filename: archive.read(member).decode("utf-8", "replace") for member in code}
        module = unpickler.load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            zipfile.BadZipFile, OSError, RecursionError) as error:
        raise ModelRefError(f"expected a TorchScript archive of modules and tensors, got one trainmem cannot read "
                            f"without running it: {one_line(error)}", where=where) from None
    declared = _declared_lists(texts, root)
    entries: Entries = {}
    buffers: set[str] = set()
    try:
        _collect(module, "", declared, entries, buffers, where)
    except RecursionError:  # modules nested thousands deep: no scripted model is
        raise ModelRefError("expected a TorchScript archive of modules and tensors, got modules nested beyond "
                            "Python's recursion limit", where=where) from None
    return entries, frozenset(buffers)


def _declared_lists(code: dict[str, str], root: str) -> dict[str, dict[str, list[str]]]:
    """qualified class name -> {"__parameters__": [...], "__buffers__": [...]} from the code files."""
    declared: dict[str, dict[str, list[str]]] = {}
    for filename, text in code.items():
        module = filename.removeprefix(f"{root}/code/").removesuffix(".py").replace("/", ".")
        classes = list(_CLASS_LINE.finditer(text))
        for index, found in enumerate(classes):
            end = classes[index + 1].start() if index + 1 < len(classes) else len(text)
            lists = declared.setdefault(f"{module}.{found.group(1)}", {})
            for line in _LIST_LINE.finditer(text, found.end(), end):
                try:
                    names = ast.literal_eval(line.group(2))
                except (ValueError, SyntaxError):
                    continue
                lists[line.group(1)] = [name for name in names if isinstance(name, str)]
    return declared


def _collect(module: Any, prefix: str, declared: dict, entries: Entries, buffers: set[str], where: str) -> None:
    """The module's parameters, then its buffers, then each submodule's, as nn.Module.state_dict()
    orders them; attributes that are neither (plain tensor attributes, constants) are not state."""
    if not isinstance(module, ScriptObject) or not isinstance(getattr(module, "state", None), dict):
        kind = module.qualified_name if isinstance(module, ScriptObject) else type(module).__name__
        raise ModelRefError(f"expected a TorchScript module whose pickled state is its attributes, got {quote(kind)} "
                            "with its own __setstate__: code that loading would run, and trainmem does not. If you "
                            "trust the file, estimate it as code: a file.py:factory returning torch.jit.load(it)",
                            where=where)
    lists = declared.get(module.qualified_name, {})
    for kind in ("__parameters__", "__buffers__"):
        names = set(lists.get(kind, ()))
        for name, value in module.state.items():
            if name in names and isinstance(value, TensorRecord):
                entries[prefix + name] = (value.shape, value.dtype)
                if kind == "__buffers__":
                    buffers.add(prefix + name)
    for name, value in module.state.items():
        if isinstance(value, ScriptObject) and _is_module(value, declared):
            _collect(value, f"{prefix}{name}.", declared, entries, buffers, where)


def _is_module(value: ScriptObject, declared: dict) -> bool:
    """A submodule (its class declares __parameters__, as every scripted nn.Module's does), not a
    scripted class instance held as an attribute (not part of the state dict)."""
    return "__parameters__" in declared.get(value.qualified_name, {})
