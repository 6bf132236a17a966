"""A SavedModel directory (saved_model.pb + variables/), traced from shapes alone.

What a SavedModel holds: a MetaGraphDef whose signatures (SignatureDef) name the inputs' dtypes and
shapes, the restored functions' graphs (FunctionDefLibrary), and the variables as a checkpoint
(variables/). It holds no Keras layers: Keras 3 writes none (keras/src/export/saved_model.py), and
TensorFlow restores a SavedModel as functions over variables (tensorflow/python/saved_model/load.py).

What is done here: the signature is read from saved_model.pb (bounded in size) with protobuf, then, inside
the trace's tf.Graph, the model is restored with keras.layers.TFSMLayer(trainable=True) and wrapped in
a Keras model, so that model.fit's step takes the gradient of the restored function with respect to its
variables. Restoring inside a graph creates the variables and their restore ops without running them:
nothing of variables/ is read (measured: a 764 MB export of Dense(10000 → 10000) restored with
`python -c` in a tf.Graph grew peak RSS by 8 MB). The forward and its gradient are function-call ops
(StatefulPartitionedCall) whose bodies are the SavedModel's functions. What is not supported, said in
one line: signatures with several inputs or outputs, inputs of unknown shape beyond the batch, and
saved_model.pbtxt (text protos are not read).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trainmem.errors import ModelRefError, quote, short
from trainmem.files import regular_file
from trainmem.frontends.framework import SAVED_MODEL_PB, saved_model_dir  # noqa: F401  (the resolver's stat)

# saved_model.pb holds the graphs of the restored functions, not the weights: Keras's export of the seed
# MLP is 33 KB, of Dense(10000 → 10000) (100M parameters) 22 KB, measured here. 64 MiB is 2,000 times
# those; parsing a protobuf takes a few times its size in memory, so a hostile file stays bounded.
MAX_PB_BYTES = 64 << 20
SIGNATURE_INIT = "__saved_model_init_op"
# tf.saved_model.save's default signature, and the endpoint Keras's model.export() adds
PREFERRED_SIGNATURES = ("serving_default", "serve")
# tensorflow/core/framework/types.proto DataType numbers of the input dtypes trainmem makes batches of
_DTYPES = {1: "float32", 2: "float64", 3: "int32", 4: "uint8", 9: "int64", 10: "bool", 14: "bfloat16",
           19: "float16"}


@dataclasses.dataclass(frozen=True)
class Signature:
    name: str
    input_name: str
    shape: tuple[int, ...]  # per sample, batch dimension dropped
    dtype: str


def read_signature(directory: Path, ref: str) -> Signature:
    """The signature to train through, from saved_model.pb, bounded in size."""
    where = short(ref)
    if not (directory / SAVED_MODEL_PB).exists():
        raise ModelRefError(f"expected {SAVED_MODEL_PB} (binary), got only saved_model.pbtxt, which trainmem does not read",
                            where=where)
    path, size = regular_file(str(directory / SAVED_MODEL_PB), f"a SavedModel's {SAVED_MODEL_PB}")
    if size > MAX_PB_BYTES:
        raise ModelRefError(f"expected a {SAVED_MODEL_PB} of at most {MAX_PB_BYTES:,} bytes (graphs, not weights: the seed "
                            f"MLP's is 33 KB), got {size:,} bytes", where=where)
    from trainmem.frontends.keras.imports import import_tensorflow

    import_tensorflow(where=where)
    from google.protobuf.message import DecodeError

    from trainmem.trace.tf.private import saved_model_message

    proto = saved_model_message()
    with path.open("rb") as handle:
        data = handle.read(MAX_PB_BYTES + 1)
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise ModelRefError(f"expected a SavedModel protobuf, got {type(error).__name__}: {str(error)[:120]}",
                            where=where) from None
    if len(proto.meta_graphs) != 1:
        raise ModelRefError(f"expected a SavedModel with one MetaGraph, got {len(proto.meta_graphs)}", where=where)
    return _choose(dict(proto.meta_graphs[0].signature_def), where)


def _choose(signatures: dict[str, Any], where: str) -> Signature:
    names = [name for name in signatures if name != SIGNATURE_INIT]
    name = next((n for n in PREFERRED_SIGNATURES if n in names), names[0] if len(names) == 1 else None)
    if name is None:
        raise ModelRefError(f"expected a SavedModel signature named serving_default (or just one signature), got "
                            f"{quote(sorted(names))}", where=where)
    signature = signatures[name]
    if len(signature.inputs) != 1 or len(signature.outputs) != 1:
        raise ModelRefError(f"expected signature {name!r} with one input and one output (trainmem makes one batch "
                            f"tensor), got {len(signature.inputs)} inputs and {len(signature.outputs)} outputs",
                            where=where)
    (input_name, tensor), = signature.inputs.items()
    dims = [d.size for d in tensor.tensor_shape.dim]
    dtype = _DTYPES.get(tensor.dtype)
    if tensor.tensor_shape.unknown_rank or not dims or any(d < 1 for d in dims[1:]) or dtype is None:
        raise ModelRefError(f"expected signature {name!r}'s input {input_name!r} with known per-sample dimensions and "
                            f"a dtype among {', '.join(sorted(set(_DTYPES.values())))}, got shape {dims} and dtype "
                            f"number {tensor.dtype}", where=where)
    return Signature(name, input_name, tuple(dims[1:]), dtype)


def build_from_saved_model(directory: Path, signature: Signature, ref: str) -> Any:
    """Inside the trace's tf.Graph: a Keras model whose one layer calls the restored signature."""
    from trainmem.frontends.keras.imports import import_keras
    from trainmem.trace.tf.private import saved_model_layer_class

    keras = import_keras(backend="tensorflow", where=short(ref))
    layer = saved_model_layer_class(keras)(str(directory), call_endpoint=signature.name, trainable=True,
                                           name="saved_model")
    inputs = keras.Input(shape=signature.shape, dtype=signature.dtype, name=signature.input_name)
    return keras.Model(inputs, layer(inputs), name=directory.name or "saved_model")
