"""The one place that imports Keras and TensorFlow, lazily, with the install hint when they are missing.

Keras 3 picks its backend once, when `keras` is first imported: from the KERAS_BACKEND environment
variable, else from ~/.keras/keras.json, else "tensorflow" (keras/src/backend/config.py). trainmem reads
no environment of its own; a backend asked for by flag (`--keras-backend torch`) is put into KERAS_BACKEND
just before that first import, which is the only way Keras takes it. Once Keras is imported its backend is
fixed for the process, so asking for another one afterwards is an error that says so, not a silent switch.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from trainmem.errors import ModelRefError
from trainmem.frontends.framework import KERAS_BACKENDS

INSTALL_HINT = "install it with pip install 'trainmem[tensorflow]'"
# TensorFlow's C++ logging threshold, read once as TensorFlow's logging starts (so only before its first import
# has it any effect), and only where the user set none: 2 keeps errors. It removes the records TensorFlow logs
# once its logging is set up; the oneDNN line and absl's notice, logged while its libraries load, ignore it —
# the command line filters those (cli/quiet.py, which measured which variable removes which line).
LOG_LEVEL_VARIABLE, QUIET_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL", "2"


def import_keras(backend: str | None = None, where: str = "MODEL") -> Any:
    """The keras module (Keras 3) on `backend` ("tensorflow", "torch"), or on Keras's own choice when None."""
    if backend is not None and backend not in KERAS_BACKENDS:
        raise ModelRefError(f"expected a Keras backend among {', '.join(KERAS_BACKENDS)}, got {backend!r}",
                            where=where)
    already = sys.modules.get("keras")
    if backend is not None and already is None:
        os.environ["KERAS_BACKEND"] = backend
    if backend == "tensorflow" or (backend is None and already is None):
        os.environ.setdefault(LOG_LEVEL_VARIABLE, QUIET_LOG_LEVEL)
    try:
        import keras
    except ImportError:
        raise ModelRefError(f"expected Keras 3 for a Keras model; {INSTALL_HINT}", where=where) from None
    if not keras.__version__.startswith("3."):
        raise ModelRefError(f"expected Keras 3, got Keras {keras.__version__}; {INSTALL_HINT}", where=where)
    current = keras.backend.backend()
    if backend is not None and current != backend:
        raise ModelRefError(f"expected Keras on the {backend} backend, but Keras is already imported in this "
                            f"process on the {current} backend (Keras fixes its backend at its first import)",
                            where=where)
    return keras


def import_tensorflow(where: str = "MODEL") -> Any:
    """The tensorflow module, for Keras on the TensorFlow backend and for SavedModel directories."""
    os.environ.setdefault(LOG_LEVEL_VARIABLE, QUIET_LOG_LEVEL)
    try:
        import tensorflow as tf
    except ImportError:
        raise ModelRefError(f"expected TensorFlow for this model; {INSTALL_HINT}", where=where) from None
    return tf


def keras_backend_in_use() -> str | None:
    """The backend of an already imported Keras, or None where Keras is not imported yet."""
    keras = sys.modules.get("keras")
    if keras is None or not hasattr(keras, "backend"):
        return None
    return keras.backend.backend()
