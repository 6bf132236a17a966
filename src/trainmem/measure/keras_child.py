"""One real Keras measurement, run as `python -m trainmem.measure.keras_child '<json request>'` in a fresh
process, written the way a user writes it: import keras (TensorFlow backend), build the model from its
factory file, compile, `model.fit` on numpy arrays of exactly steps × batch samples, epochs=1, verbose=0.
Nothing of trainmem is imported here (no trace, no setup parsing): the request carries plain values.

Request: {"model": "file.py:factory", "batch_size": int, "steps": int, "optimizer": "adam"|…,
          "loss": "cross-entropy"|"mse", "input_max": int|null, "seed": int, "timeline": bool (optional)}
Prints one JSON line: peak RSS (VmHWM), VmRSS/RssAnon/RssFile after each stage (start, import tensorflow,
import keras, build, compile, data, fit), the largest RssAnon/RssFile sampled during fit, versions,
thread settings, the CPU model, whether oneDNN is on, and on a GPU the peak of
tf.config.experimental.get_memory_info (on the CPU TensorFlow 2.21 raises "Allocator stats not available
for device 'CPU:0'": its default CPU allocator keeps no statistics, cpu_allocator_impl.cc).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
import threading
import time

STAGE_FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def status() -> dict[str, int]:
    """/proc/self/status memory fields in bytes."""
    found = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            name = line.split(":", 1)[0]
            if name in STAGE_FIELDS:
                found[name] = int(line.split()[1]) * 1024
    return found


class Sampler:
    """The largest RssAnon and RssFile seen while the fit runs (every 2 ms), and the two at VmRSS's maximum."""

    def __init__(self) -> None:
        self.samples = {"max_rss": 0, "anon_at_max": 0, "file_at_max": 0, "max_anon": 0, "max_file": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = status()
            s = self.samples
            if now["VmRSS"] > s["max_rss"]:
                s["max_rss"], s["anon_at_max"], s["file_at_max"] = now["VmRSS"], now["RssAnon"], now["RssFile"]
            s["max_anon"], s["max_file"] = max(s["max_anon"], now["RssAnon"]), max(s["max_file"], now["RssFile"])
            self._stop.wait(0.002)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def load_factory(reference: str):
    """`path/file.py:factory` loaded with importlib, as a script would import its own model file."""
    path, _, name = reference.rpartition(":")
    spec = importlib.util.spec_from_file_location(f"_measured_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def make_optimizer(keras, name: str):
    table = {"adam": lambda: keras.optimizers.Adam(), "adamw": lambda: keras.optimizers.AdamW(),
             "sgd": lambda: keras.optimizers.SGD(), "momentum": lambda: keras.optimizers.SGD(momentum=0.9),
             "rmsprop": lambda: keras.optimizers.RMSprop(), "adagrad": lambda: keras.optimizers.Adagrad()}
    return table[name]()


def make_data(keras, model, samples: int, loss: str, input_max: int | None, seed: int):
    """numpy inputs for each model input and targets for its output: integer inputs below `input_max`
    (default: the first Embedding's input_dim, else 2), class ids for cross-entropy, zeros-like for mse."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if input_max is None:
        embeddings = [layer for layer in model.layers if isinstance(layer, keras.layers.Embedding)]
        input_max = embeddings[0].input_dim if embeddings else 2
    xs = []
    for tensor in model.inputs:
        shape = (samples, *tensor.shape[1:])
        if "int" in str(tensor.dtype):
            xs.append(rng.integers(0, input_max, size=shape).astype(str(tensor.dtype)))
        else:
            xs.append(rng.standard_normal(shape, dtype="float32"))
    out_shape = model.outputs[0].shape
    if loss == "mse":
        y = rng.standard_normal((samples, *out_shape[1:]), dtype="float32")
    else:
        y = rng.integers(0, out_shape[-1], size=(samples, *out_shape[1:-1])).astype("int64")
    return (xs[0] if len(xs) == 1 else xs), y


def make_loss(keras, loss: str):
    if loss == "mse":
        return keras.losses.MeanSquaredError()
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def environment(tf, keras) -> dict:
    import numpy as np

    cpu_model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                      if line.startswith("model name")), platform.processor())
    try:
        from tensorflow.python.util import _pywrap_util_port

        onednn = bool(_pywrap_util_port.IsMklEnabled())
    except ImportError:
        onednn = None
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "cpu_model": cpu_model, "nproc": len(os.sched_getaffinity(0)),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(), "onednn": onednn,
            "load_average": os.getloadavg()[0]}


def _timeline(keras, stages: dict):
    """A callback (calibration only: request "timeline") that records RSS when fit has made its dataset
    (on_train_begin), when the first step is about to run (its graph not yet traced) and the largest RSS
    at the end of a step."""

    class Timeline(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            stages["train_begin"] = status()

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                stages["first_batch_begin"] = status()

        def on_train_batch_end(self, batch, logs=None):  # tf.data has gathered the next batch by now
            now, best = status(), stages.get("batch_end_max")
            if best is None or now["VmRSS"] > best["VmRSS"]:
                stages["batch_end_max"] = now

    return Timeline()


def gpu_peak(tf) -> int | None:
    """tf.config.experimental.get_memory_info("GPU:0")["peak"] when a GPU is present, else None."""
    if not tf.config.list_physical_devices("GPU"):
        return None
    return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])


def run(request: dict) -> dict:
    stages = {"start": status()}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import tensorflow as tf

    stages["import_tensorflow"] = status()
    import keras

    stages["import_keras"] = status()
    keras.utils.set_random_seed(request.get("seed", 0))
    model = load_factory(request["model"])()
    stages["build"] = status()
    loss = request.get("loss") or "cross-entropy"
    model.compile(optimizer=make_optimizer(keras, request.get("optimizer", "adam")), loss=make_loss(keras, loss))
    stages["compile"] = status()
    batch, steps = int(request["batch_size"]), int(request["steps"])
    x, y = make_data(keras, model, batch * steps, loss, request.get("input_max"), request.get("seed", 0))
    stages["data"] = status()
    started = time.perf_counter()
    callbacks = [_timeline(keras, stages)] if request.get("timeline") else []
    with Sampler() as sampler:
        history = model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=callbacks)
    seconds = time.perf_counter() - started
    stages["fit"] = status()
    # the kernel's RSS counters are cached per thread (up to 64 pages each), so a sample read during fit may
    # top the VmHWM read at the end by a few pages: the peak is the larger of the two observations
    peak = max(stages["fit"]["VmHWM"], sampler.samples["max_rss"])
    return {"peak_rss_bytes": peak, "stages": stages, "fit_samples": sampler.samples,
            "fit_seconds": seconds, "steps": steps, "epochs_run": len(history.history.get("loss", [])),
            "parameters": int(model.count_params()), "gpu_peak_bytes": gpu_peak(tf),
            "environment": environment(tf, keras)}


def main() -> None:
    # The same shape as measure/child.py's main, written again on purpose: this process imports nothing of
    # trainmem, so that its RSS is a user's.
    request = json.loads(sys.argv[1])
    try:
        result = run(request)
    except Exception as error:  # noqa: BLE001 - reported to the parent as one JSON line
        result = {"error": f"{type(error).__name__}: {error}"}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip teardown: nothing after the measurement should touch the figures


if __name__ == "__main__":
    main()
