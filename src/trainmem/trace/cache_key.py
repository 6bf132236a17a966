"""The key of a stored trace: everything the trace of a training run depends on, hashed.

A stored trace is only as right as its key is complete, and a key that misses a fact gives a wrong answer with
no sign of it. So the key takes the run as built, not the words that named it:
- the model as built on the meta device (after LoRA/QLoRA): every module's class and plain attributes (sizes,
  flags, a config's values), every parameter's and buffer's name, shape, dtype, requires_grad and tying;
- the code that runs: the source file of every module class that is not torch's, the code objects of the
  batch and loss functions with their captured values, every module imported from outside the installed
  packages (the user's own files) by content, trainmem's own source by content, and the versions of torch, Python
  and the libraries a model is built from;
- the setup (every field), the target's kernel ops and what it switches into the trace (CUDA's compute
  capability), the CPU instruction set torch dispatches on.
Anything it cannot describe deterministically (an object whose repr is its address, a class with no source
file, a function defined at the prompt) makes the run not cacheable (`NotCacheable`): it is traced, never
guessed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import marshal
import os
import sys
import types
import weakref
from pathlib import Path
from typing import Any

import torch

from trainmem.trace.cache_codec import FORMAT, NotCacheable

LIBRARIES = ("transformers", "peft", "bitsandbytes", "timm", "torchvision", "accelerate", "keras", "onnx",
             "onnx2torch", "huggingface_hub", "safetensors")
MAX_USER_FILES = 400  # the user's own modules hashed by content; more than this is not a model's code
MAX_USER_BYTES = 64 * 2**20
_ADDRESS = " at 0x"  # in a repr: an object described by where it lives, different in every process


def trace_key(model: torch.nn.Module, make_batch: Any, loss_fn: Any, source: Any, setup: Any,
              kernel_ops: frozenset[str], semantics: Any) -> str:
    """The hex digest naming the trace of `setup` on `model` (built, on meta) for a target."""
    digest = hashlib.sha256()
    for part in (versions(), _model_structure(model), _functions(make_batch, loss_fn), _source(source),
                 described(setup, "the setup"), sorted(kernel_ops), described(semantics, "the target's semantics"),
                 _code_files(model, make_batch, loss_fn)):
        digest.update(repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


@functools.cache
def versions() -> tuple:
    """Everything a trace depends on outside the run: trainmem's code and data, torch, Python, the CPU's instruction
    set, the libraries a model is built from."""
    libraries = []
    for name in LIBRARIES:
        try:
            libraries.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            libraries.append((name, None))
    return (FORMAT, _trainmem_source(), torch.__version__, sys.version_info[:3], torch.backends.cpu.get_cpu_capability(),
            tuple(libraries))


@functools.cache
def _trainmem_source() -> str:
    """trainmem's own code and bundled data (targets/data), by content: a changed rule or table changes every key
    (a version number would not, in a development tree)."""
    import trainmem

    root = Path(trainmem.__file__).parent
    digest = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.json")]):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _model_structure(model: torch.nn.Module) -> list:
    seen: dict[int, int] = {}  # id(tensor) -> first index: tied weights are one storage
    plain_values: dict[int, Any] = {}  # id(attribute value) -> its description (a config shared by every module)
    rows = []
    for name, module in model.named_modules(remove_duplicate=False):
        cls = type(module)
        tensors = []
        for kind, table in (("p", module._parameters), ("b", module._buffers)):
            for key, tensor in table.items():
                tensors.append((kind, key, None if tensor is None else _tensor(tensor, seen)))
        rows.append((name, cls.__module__, cls.__qualname__, module.training, tensors,
                     _attributes(module, plain_values), sorted(module._non_persistent_buffers_set)))
    return rows


def _tensor(tensor: torch.Tensor, seen: dict[int, int]) -> tuple:
    first = seen.setdefault(id(tensor), len(seen))
    return (tuple(tensor.shape), str(tensor.dtype), tensor.requires_grad, type(tensor).__qualname__, first)


def _attributes(module: torch.nn.Module, plain_values: dict[int, Any]) -> list:
    """The module's own plain attributes (what sizes and flags its forward reads), hooks by their functions."""
    out = []
    for key, value in sorted(vars(module).items()):
        if key in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "training"):
            continue
        if "hook" in key and isinstance(value, dict):  # hooks by their functions (their handles' ids are counters)
            value = [hook for hook in value.values() if callable(hook)]
        if id(value) not in plain_values:
            plain_values[id(value)] = _plain(value, 0, f"attribute {key} of {type(module).__qualname__}")
        out.append((key, plain_values[id(value)]))
    return out


def _plain(value: Any, depth: int, where: str) -> Any:
    """A deterministic description of `value`; NotCacheable when there is none."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.dtype, torch.device,
                                           torch.memory_format, torch.layout, torch.Size)):
        return repr(value)
    if depth > 6:
        raise NotCacheable(f"{where} nests too deeply to describe")
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(v, depth + 1, where) for v in value]
        return (type(value).__name__, sorted(items) if isinstance(value, (set, frozenset)) else items)
    if isinstance(value, dict):
        return ("dict", [(_plain(k, depth + 1, where), _plain(v, depth + 1, where)) for k, v in value.items()])
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), str(value.device))
    if isinstance(value, weakref.ref):  # an RNN's _flat_weight_refs: what it points at
        return ("weakref", _plain(value(), depth + 1, where))
    if isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
        return _function(value, depth, where)
    if isinstance(value, (types.BuiltinFunctionType, type, types.ModuleType)) or callable(value) and \
            type(value).__module__.startswith("torch"):
        return _named(value, where)
    if hasattr(value, "to_dict") and type(value).__module__.startswith("transformers"):
        return (type(value).__qualname__, _plain(value.to_dict(), depth + 1, where))  # a PretrainedConfig
    if hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):
        return (type(value).__module__, type(value).__qualname__, _plain(vars(value), depth + 1, where))
    if isinstance(value, torch.nn.Module):
        return ("module", type(value).__qualname__)  # a module kept outside _modules: its class; its tensors are
    text = repr(value)                               # the model's own where they are registered
    if _ADDRESS in text:
        raise NotCacheable(f"{where} is described only by its address: {text[:60]}")
    return text


def _named(value: Any, where: str) -> str:
    name = f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', getattr(value, '__name__', ''))}"
    if name == "." or _ADDRESS in name:
        raise NotCacheable(f"{where} has no name to describe it by")
    return name


def _function(value: Any, depth: int, where: str) -> Any:
    """A function by its code and what it captured; a bound method by its function and its object's class."""
    if isinstance(value, functools.partial):
        return ("partial", _plain(value.func, depth + 1, where), _plain(value.args, depth + 1, where),
                _plain(value.keywords, depth + 1, where))
    if isinstance(value, types.MethodType):
        return ("method", type(value.__self__).__qualname__, _function(value.__func__, depth, where))
    code = value.__code__
    cells = [_plain(cell.cell_contents, depth + 1, where) for cell in value.__closure__ or ()
             if not isinstance(cell.cell_contents, torch.nn.Module)]
    return ("function", value.__module__, value.__qualname__, hashlib.sha256(marshal.dumps(code)).hexdigest(),
            cells, _plain(value.__defaults__, depth + 1, where), _plain(value.__kwdefaults__, depth + 1, where))


def _functions(make_batch: Any, loss_fn: Any) -> list:
    return [None if f is None else _plain(f, 0, name) for f, name in ((make_batch, "the batch function"),
                                                                          (loss_fn, "the loss function"))]


def _source(source: Any) -> tuple:
    return (source.ref, source.name, described(source.default_inputs, "the default inputs"),
            str(source.default_loss), source.notes, source.libraries, _plain(source.resolved, 0, "the frontend's settings"))


def described(value: Any, where: str) -> str:
    text = repr(value)
    if _ADDRESS in text:
        raise NotCacheable(f"{where} is described only by an address")
    return text


def _code_files(model: torch.nn.Module, make_batch: Any, loss_fn: Any) -> list:
    """By content: the source files of the model's classes (and of their bases) that are not torch's, the files
    of the batch and loss functions, and every module imported from outside the installed packages."""
    files: set[str] = set()
    for module in model.modules():
        for cls in type(module).__mro__:
            if cls.__module__.split(".")[0] not in ("torch", "builtins"):
                files.add(_file_of(cls))
    for function in (make_batch, loss_fn):
        code = getattr(getattr(function, "__func__", function), "__code__", None)
        if code is not None:
            files.add(code.co_filename)
    files |= _user_module_files()
    return _hashed(sorted(files))


def _file_of(cls: type) -> str:
    try:
        path = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        path = None
    if not path or not Path(path).is_file():
        raise NotCacheable(f"class {cls.__qualname__} has no source file (defined at a prompt or in C)")
    return path


def _user_module_files() -> set[str]:
    """Modules imported from outside the interpreter's and the installed packages' directories: the user's own
    code, which a model file may import beside it (trainmem's own is keyed as a whole)."""
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py") and os.path.isabs(path):  # a relative __file__ (torch.
            resolved = _user_file(path)                                           # _classes's) names no file
            if resolved is not None:
                files.add(resolved)
    return files


@functools.cache
def _user_file(path: str) -> str | None:
    """`path` resolved when it is the user's, else None; once per path (a process imports thousands)."""
    resolved = str(Path(path).resolve())
    return None if resolved.startswith(_not_the_users()) else resolved


@functools.cache
def _not_the_users() -> tuple[str, ...]:
    """The directories whose files are not the user's: the interpreter's, the installed packages', trainmem's."""
    import trainmem

    return tuple({str(Path(p).resolve()) + "/" for p in (*_installed_roots(), Path(trainmem.__file__).parent)})


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    import site
    import sysconfig

    roots = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= set(site.getsitepackages()) | {site.getusersitepackages()}
    roots |= {p for p in sys.path if "site-packages" in p or "dist-packages" in p}
    return tuple(root for root in roots if root)


def _hashed(paths: list[str]) -> list:
    if len(paths) > MAX_USER_FILES:
        raise NotCacheable(f"the model's code spans {len(paths)} files (more than {MAX_USER_FILES})")
    total, out = 0, []
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError:
            raise NotCacheable(f"the model's code file {path} cannot be read") from None
        total += len(data)
        if total > MAX_USER_BYTES:
            raise NotCacheable("the model's code files are too large to key by content")
        out.append((path, hashlib.sha256(data).hexdigest()))
    return out
