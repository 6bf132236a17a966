"""The traced step's tensor peak beside what TensorFlow's own allocator reports for one real step on the CPU.

TensorFlow's default CPU allocator keeps no statistics (get_memory_info('CPU:0') raises "Allocator stats
not available"); with TF_CPU_ALLOCATOR_USE_BFC=true the CPU device allocates through a BFC allocator
(tensorflow/core/common_runtime/gpu/gpu_bfc_allocator-like, 256-byte rounding, unsplit chunks count in
full), whose get_memory_info peak is read here. One child process per model: build eagerly, compile
(jit_compile=False), one warm-up train_on_batch (builds the optimizer's slots and traces the step),
reset_memory_stats, then one train_on_batch on batch tensors made before: the step's own growth is
peak - current before it. The trace's figure is the same growth: its peak within the step above what was
live once the batch existed.

    .venv/bin/python benchmarks/tf_tensor_peak.py                    # prints a table, every model
    .venv/bin/python benchmarks/tf_tensor_peak.py embedding_bag transformer_encoder   # those rows only

Models named "module:function" come from benchmarks/keras_models.py (the CPU accuracy table's models).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

MODELS = {
    "mlp": ("seed_mlp", {"batch_size": 256}),
    "cnn": ("cnn_bn", {"batch_size": 32}),
    "emb": ("embedding", {"batch_size": 64}),
    "lstm": ("lstm", {"batch_size": 64}),
    "embedding_bag": ("keras_models:embedding_bag", {"batch_size": 8192}),
    "transformer_encoder": ("keras_models:transformer_encoder", {"batch_size": 128}),
}


def _builder(spec: str):
    if ":" not in spec:
        return globals()[spec]
    import importlib

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    module, function = spec.split(":")
    return getattr(importlib.import_module(module), function)


def seed_mlp():
    import keras

    return keras.Sequential([keras.Input((1000,))] + [keras.layers.Dense(100, activation="relu") for _ in range(4)]
                            + [keras.layers.Dense(10)])


def cnn_bn():
    import keras
    L = keras.layers
    return keras.Sequential([keras.Input((32, 32, 3)), L.Conv2D(32, 3, padding="same"), L.BatchNormalization(),
                             L.ReLU(), L.MaxPooling2D(), L.Conv2D(64, 3, padding="same"), L.ReLU(), L.Flatten(),
                             L.Dense(10)])


def embedding():
    import keras
    L = keras.layers
    return keras.Sequential([keras.Input((100,), dtype="int32"), L.Embedding(20000, 64), L.GlobalAveragePooling1D(),
                             L.Dense(64, activation="relu"), L.Dense(10)])


def lstm():
    import keras

    return keras.Sequential([keras.Input((50, 32)), keras.layers.LSTM(64), keras.layers.Dense(10)])


def _batch(model, batch: int):
    import numpy as np
    import tensorflow as tf

    spec = model.inputs[0]
    shape = (batch, *spec.shape[1:])
    if "int" in str(spec.dtype):
        x = tf.constant(np.random.randint(0, 100, shape).astype(str(spec.dtype)))
    else:
        x = tf.constant(np.random.rand(*shape).astype("float32"))
    classes = int(model.outputs[0].shape[-1])
    y = tf.constant(np.random.randint(0, classes, (batch,)).astype("int64"))
    return x, y


def measure(name: str) -> dict:
    """In this process (started with TF_CPU_ALLOCATOR_USE_BFC=true): one real step's allocator growth."""
    import keras
    import tensorflow as tf

    builder, kwargs = MODELS[name]
    model = _builder(builder)()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    x, y = _batch(model, kwargs["batch_size"])
    model.train_on_batch(x, y)
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    model.train_on_batch(x, y)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return {"before": before, "peak": peak, "growth": peak - before}


def traced(name: str) -> dict:
    """The trace's step growth: raw tensor bytes, and through the BFC model (alloc/tf_bfc.py) as the CPU BFC
    allocator counts them (whole chunks); two steps traced, the second measured like the real one."""
    from trainmem.alloc.tf_bfc import BfcConfig, replay_bfc
    from trainmem.setup import InputSpec, TrainingSetup
    from trainmem.targets.tf.cpu_process import device_events
    from trainmem.trace.events import Phase
    from trainmem.trace.tf.keras_graph import trace_keras

    builder, kwargs = MODELS[name]
    inputs = (InputSpec((100,), "int32", 100),) if name == "emb" else ()
    result = trace_keras(_builder(builder), TrainingSetup(steps=2, inputs=inputs, **kwargs), name=name)
    events = device_events(result.trace)
    start = next(i for i, e in enumerate(events) if e.step == 1 and e.phase == Phase.INPUTS)
    live = peak = 0
    for index, event in enumerate(events):
        live += event.nbytes if event.action == "alloc" else -event.nbytes
        if index == start:
            base = peak = live
        elif index > start:
            peak = max(peak, live)
    bfc = replay_bfc(events, BfcConfig(memory_limit=64 << 30, allow_growth=True)).peak_in_use
    return {"growth": peak - base, "bfc_growth": bfc - base}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2])))
        return
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
    print("| model | batch | traced step growth (tensors) | traced, through the BFC model | TF BFC step growth "
          "(median of 3, range) | BFC model / TF |")
    print("|---|---|---|---|---|---|")
    names = sys.argv[1:] or list(MODELS)
    for name in names:
        kwargs = MODELS[name][1]
        runs = []
        for _ in range(3):
            out = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True,
                                 check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1])["growth"])
        mine = traced(name)
        median = sorted(runs)[1]
        print(f"| {name} | {kwargs['batch_size']} | {mine['growth']:,} | {mine['bfc_growth']:,} | {median:,} "
              f"({min(runs):,}–{max(runs):,}) | {mine['bfc_growth'] / median:.3f} |")


if __name__ == "__main__":
    main()
