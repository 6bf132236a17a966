"""`model.keras`: Keras 3's archive, read as data. Only config.json is read; the weights are never loaded.

A `.keras` file is a zip of config.json (the model's architecture and compile settings), metadata.json and
model.weights.h5 (keras/src/saving/saving_lib.py save_model); `model.save(path, zipped=False)` writes the
same members into a directory. Memory needs the architecture alone, so config.json is read (bounded in
size, nesting and object count) and rebuilt with keras.saving.deserialize_keras_object under
safe_mode=True: a Lambda layer holding Python bytecode is refused by Keras itself (keras/src/layers/core/
lambda_layer.py Lambda._raise_for_lambda_deserialization) and classes are looked up only among Keras's
own, registered custom objects and keras_hub/keras_cv/keras_nlp (serialization_lib._retrieve_class_or_fn),
so nothing in the file runs code the user did not name. No TensorFlow import at module level.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError, one_line, quote, short
from trainmem.files import regular_file
from trainmem.frontends.zip_directory import count_members

CONFIG_NAME = "config.json"
# Keras's applications serialize to at most 759 KB (EfficientNetB7, 816 layers: measured here with
# keras.saving.serialize_keras_object, Keras 3.15.1); 16 MiB is 20 times that.
MAX_CONFIG_BYTES = 16 << 20
# EfficientNetB7's config nests 11 levels (model → layers → layer → config → initializer → config …);
# each model nested inside another adds about 4. 64 is room for a dozen nested models.
MAX_CONFIG_DEPTH = 64
# EfficientNetB7's config holds 2,832 serialized objects (layers, initializers, dtype policies) and is
# rebuilt in a graph in 17 s here; 20,000 objects bounds a file's rebuild to about two minutes.
MAX_CONFIG_OBJECTS = 20_000
# saving_lib writes three members plus one per asset (a vocabulary file, …)
MAX_MEMBERS = 10_000


def read_keras_config(ref: str) -> dict[str, Any]:
    """config.json of a `.keras` archive (or of the directory `save(zipped=False)` writes), bounded."""
    path = Path(ref)
    if path.is_dir():
        config_path, size = regular_file(str(path / CONFIG_NAME), "a Keras model directory's config.json")
        if size > MAX_CONFIG_BYTES:
            raise _too_large(size, ref)
        with config_path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    else:
        data = _config_from_zip(ref)
    if len(data) > MAX_CONFIG_BYTES:
        raise _too_large(len(data), ref)
    return _parse(data, ref)


def _config_from_zip(ref: str) -> bytes:
    path, _ = regular_file(ref, "a .keras model file (a zip holding config.json)")
    if count_members(path, MAX_MEMBERS) < 0:
        raise ModelRefError("expected a .keras model file (a zip holding config.json), got a file that is not a zip",
                            where=short(ref))
    try:
        with zipfile.ZipFile(path) as archive:
            try:
                info = archive.getinfo(CONFIG_NAME)
            except KeyError:
                raise ModelRefError(f"expected a .keras archive holding {CONFIG_NAME}, got members "
                                    f"{quote(archive.namelist()[:4])}", where=short(ref)) from None
            if info.file_size > MAX_CONFIG_BYTES:  # the declared size; the read below is bounded whatever it says
                raise _too_large(info.file_size, ref)
            with archive.open(info) as member:
                return member.read(MAX_CONFIG_BYTES + 1)
    except ModelRefError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError, ValueError) as error:
        raise ModelRefError(f"expected a readable .keras zip, got {type(error).__name__}: {one_line(error)}",
                            where=short(ref)) from None


def _too_large(size: int, ref: str) -> ModelRefError:
    return ModelRefError(f"expected a Keras {CONFIG_NAME} of at most {MAX_CONFIG_BYTES:,} bytes (EfficientNetB7's is "
                         f"759 KB), got {size:,} bytes or more", where=short(ref))


def _parse(data: bytes, ref: str) -> dict[str, Any]:
    try:
        config = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ModelRefError(f"expected a {CONFIG_NAME} nested at most {MAX_CONFIG_DEPTH} deep, got deeper",
                            where=short(ref)) from None
    except (UnicodeDecodeError, ValueError) as error:
        raise ModelRefError(f"expected {CONFIG_NAME} as UTF-8 JSON, got {type(error).__name__}: {one_line(error)}",
                            where=short(ref)) from None
    if not isinstance(config, dict) or "class_name" not in config:
        raise ModelRefError(f"expected {CONFIG_NAME} to describe a Keras object (a mapping with class_name), got "
                            f"{type(config).__name__}", where=short(ref))
    _check_shape(config, ref)
    return config


def _check_shape(config: Any, ref: str) -> None:
    """Nesting and object count, walked without recursion (the bound must hold before Keras recurses)."""
    objects, stack = 0, [(config, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ModelRefError(f"expected a {CONFIG_NAME} nested at most {MAX_CONFIG_DEPTH} deep, got deeper",
                                where=short(ref))
        if isinstance(value, dict):
            objects += "class_name" in value
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        if objects > MAX_CONFIG_OBJECTS:
            raise ModelRefError(f"expected a {CONFIG_NAME} of at most {MAX_CONFIG_OBJECTS:,} Keras objects "
                                "(EfficientNetB7 has 2,832), got more", where=short(ref))


def saved_compile(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """The optimizer and loss the file was compiled with (its compile_config), as names, for the report."""
    compile_config = config.get("compile_config")
    if not isinstance(compile_config, dict):
        return None, None
    return _object_name(compile_config.get("optimizer")), _object_name(compile_config.get("loss"))


def _object_name(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("class_name"), str):
        return value["class_name"]
    return None


def rebuild(config: dict[str, Any], ref: str) -> Any:
    """The model from its config, under safe_mode (called inside the trace's tf.Graph: no weights are
    allocated). The compile settings are dropped: the setup's optimizer and loss are what is estimated."""
    from trainmem.frontends.keras.imports import import_keras

    keras = import_keras(where=short(ref))
    architecture = {key: value for key, value in config.items() if key != "compile_config"}
    try:
        return keras.saving.deserialize_keras_object(architecture, safe_mode=True)
    except (ValueError, TypeError, KeyError, AttributeError, NotImplementedError, RecursionError) as error:
        raise ModelRefError(_refusal(error), where=short(ref)) from None


def _refusal(error: BaseException) -> str:
    text = str(error)
    if "Lambda" in text and "safe_mode" in text:
        return ("expected a model without Python code: a Lambda layer holds Python bytecode, which trainmem never "
                "runs from a .keras file (Keras's safe_mode); rebuild it in a file.py:factory you name instead")
    unknown = re.search(r"Could not (?:locate|deserialize) (?:class|function|\w+) '([^']{1,200})'", text)
    if unknown:  # Keras nests the inner error's text in the outer one's (a layer inside a Sequential …)
        return (f"expected Keras's own layers or registered custom objects, got the unknown {quote(unknown[1])}: "
                "name a file.py:factory that imports (registers) it and builds the model instead")
    return f"expected a config Keras can rebuild, got {type(error).__name__}: {one_line(error)}"
