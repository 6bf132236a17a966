"""`path/to/file.py:factory` and `package.module:factory`.

The factory takes no arguments and returns one of:
    an nn.Module;
    (module, make_batch) or (module, make_batch, loss_fn);
    {"model": module, "make_batch": fn, "loss_fn": fn}   (the last two optional)
where make_batch(batch_size) returns a tensor or a tuple of tensors (the model's inputs) and
loss_fn(output, inputs) returns a scalar tensor. Only a file the user names is executed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError, one_line, quote, short


def _load_file(path: Path, ref: str) -> Any:
    try:
        exists = path.is_file()
    except OSError as error:  # a name longer than the file system takes (ENAMETOOLONG), …
        raise ModelRefError(f"expected an existing Python file, got {quote(str(path))} "
                            f"({error.strerror or type(error).__name__})", where="MODEL") from None
    if not exists:
        raise ModelRefError(f"expected an existing Python file, got {quote(str(path))}", where=short(ref))
    # named by the file's path, the same in every process (str's hash() is salted per process): a class's module name
    # is part of the trace cache's key (trace/cache_key.py)
    module_name = f"trainmem_user_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except SystemExit as stop:
        del sys.modules[module_name]
        raise ModelRefError(f"expected the file to define {ref.rpartition(':')[2]}, loading it called "
                            f"sys.exit({quote(stop.code)})", where=short(ref)) from None
    except Exception as error:  # noqa: BLE001 - the user's file: any error is reported as one line
        del sys.modules[module_name]
        raise ModelRefError(f"loading the file raised {type(error).__name__}: {one_line(error)}", where=short(ref)) from error
    return module


def _load_module(name: str, ref: str) -> Any:
    try:
        return importlib.import_module(name)
    except SystemExit as stop:
        raise ModelRefError(f"expected an importable module {quote(name)}, importing it called "
                            f"sys.exit({quote(stop.code)})", where=short(ref)) from None
    except Exception as error:  # noqa: BLE001
        raise ModelRefError(f"expected an importable module {quote(name)}, import raised "
                            f"{type(error).__name__}: {one_line(error)}", where=short(ref)) from error


def load_factory(ref: str) -> Any:
    target, _, factory_name = ref.rpartition(":")
    if not target or not factory_name.isidentifier():
        raise ModelRefError(f"expected FILE.py:factory or package.module:factory, got {quote(ref)}", where="MODEL")
    module = _load_file(Path(target), ref) if target.endswith(".py") else _load_module(target, ref)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ModelRefError(f"expected a callable named {quote(factory_name)} in {quote(target)}, found "
                            f"{type(factory).__name__ if factory is not None else 'nothing'}", where=short(ref))
    return factory

