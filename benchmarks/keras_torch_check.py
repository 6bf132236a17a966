"""Keras 3 on the torch backend: trainmem's tensor peak against `trainmem measure`'s (the profiler's memory
events while `model.fit` runs for real, measure/child.py _fit_keras), for an MLP, a CNN with BatchNorm and
an LSTM. Writes benchmarks/results/keras_torch.md.

    .venv/bin/python benchmarks/keras_torch_check.py

Each row runs in fresh processes with KERAS_BACKEND=torch (Keras fixes its backend at its first import):
one for the estimate, one for the measured run. The factories below are the models (file.py:factory).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()
ROWS = [("mlp", 8192), ("cnn_bn", 64), ("transformer", 64), ("lstm", 256)]


def mlp():
    """The seed MLP 1000-100×4-10 (131,410 parameters)."""
    import keras

    layers = [keras.layers.Dense(100, activation="relu") for _ in range(4)]
    return keras.Sequential([keras.Input((1000,)), *layers, keras.layers.Dense(10)])


def cnn_bn():
    """Three 3×3 convolutions with BatchNormalization on 32×32×3 images."""
    import keras

    L = keras.layers
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        L.Conv2D(32, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
        L.Conv2D(64, 3, padding="same"), L.BatchNormalization(), L.ReLU(), L.MaxPooling2D(),
        L.Conv2D(64, 3, padding="same"), L.BatchNormalization(), L.ReLU(), L.GlobalAveragePooling2D(),
        L.Dense(10)])


def lstm():
    """Embedding(5000, 64) → LSTM(128) → Dense(10) over 50 token ids."""
    import keras

    L = keras.layers
    return keras.Sequential([keras.Input((50,), dtype="int32"), L.Embedding(5000, 64), L.LSTM(128), L.Dense(10)])


def transformer():
    """One encoder block over 64 token ids: Embedding(5000, 128), MultiHeadAttention(4 heads of 32),
    residual Add and LayerNormalization, a 512-wide feed-forward, pooled to 10 classes."""
    import keras

    L = keras.layers
    tokens = keras.Input((64,), dtype="int32")
    x = L.Embedding(5000, 128)(tokens)
    x = L.LayerNormalization()(L.Add()([x, L.MultiHeadAttention(4, 32)(x, x)]))
    x = L.LayerNormalization()(L.Add()([x, L.Dense(128)(L.Dense(512, activation="relu")(x))]))
    return keras.Model(tokens, L.Dense(10)(L.GlobalAveragePooling1D()(x)))


ESTIMATE = """
import json, sys
from trainmem.frontends.keras.imports import import_keras
import_keras("torch")
from trainmem.devices import get_device
from trainmem.estimate.orchestrate import Prepared, assemble_traced, trace
from trainmem.frontends.keras.torch_backend import resolve_keras_torch
from trainmem.setup import TrainingSetup
from trainmem.targets import target_for
from trainmem.trace.events import Category
setup = TrainingSetup.from_mapping(json.loads(sys.argv[2]))
device = get_device("cpu")
plan = Prepared(resolve_keras_torch(sys.argv[1], setup), device, 2, {}, target_for(device, setup))
traced = trace(plan, setup)
est = assemble_traced(plan, setup, traced)
by = {}
for record in traced.trace.storages.values():
    by[str(record.category)] = by.get(str(record.category), 0) + record.nbytes
print(json.dumps({"tensor_bytes": est.tensor_bytes, "parameters": traced.parameters,
                  "trainable": traced.trainable_parameters, "allocated_by_category": by}))
"""


def child_env() -> dict[str, str]:
    src = str(ROOT / "src")
    return {**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}


def last_json(done: subprocess.CompletedProcess, what: str) -> dict:
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{what} printed no result (exit {done.returncode}): {done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if "error" in result:
        raise RuntimeError(f"{what} failed: {result['error']}")
    return result


def estimate(ref: str, setup: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", ESTIMATE, ref, json.dumps(setup)], capture_output=True,
                          text=True, env=child_env(), timeout=900)
    return last_json(done, "the estimate")


def measure(ref: str, setup: dict, gc: str = "paused") -> dict:
    """measure/child.py in tensors mode, as `trainmem measure` runs it, with the Keras backend named; `gc`
    "on" leaves Python's cyclic collector running during fit."""
    from trainmem.setup import TrainingSetup

    request = {"model": ref, "setup": TrainingSetup.from_mapping(setup).to_dict(), "mode": "tensors", "seed": 0,
               "keras_backend": "torch", "gc": gc}
    done = subprocess.run([sys.executable, "-m", "trainmem.measure.child", json.dumps(request)],
                          capture_output=True, text=True, env=child_env(), timeout=900)
    return last_json(done, "the measured run")


def versions() -> str:
    done = subprocess.run([sys.executable, "-c", "import keras, torch; print(keras.__version__, torch.__version__)"],
                          capture_output=True, text=True, env=child_env())
    keras_version, torch_version = done.stdout.split()
    return f"Keras {keras_version} (torch backend), torch {torch_version}, Python {platform.python_version()}"


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    rows = []
    for name, batch in ROWS:
        ref, setup = f"{HERE}:{name}", {"batch_size": batch}
        started = time.perf_counter()
        est = estimate(ref, setup)
        measured = measure(ref, setup)
        collected = measure(ref, setup, gc="on")
        error = (est["tensor_bytes"] - measured["tensor_peak_bytes"]) / measured["tensor_peak_bytes"]
        rows.append((name, batch, est, measured, error, collected))
        print(f"{name} batch {batch}: estimate {est['tensor_bytes']:,} B, measured "
              f"{measured['tensor_peak_bytes']:,} B, {error:+.3%}; with the collector on "
              f"{collected['tensor_peak_bytes']:,} B ({time.perf_counter() - started:.0f} s)", flush=True)
    write(rows)


def write(rows: list) -> None:
    lines = ["# Keras 3 on the torch backend: estimated vs measured tensor peak", "",
             f"{versions()}; {platform.machine()}, {os.cpu_count()} CPUs.", "",
             "Command: `.venv/bin/python benchmarks/keras_torch_check.py` (benchmarks/keras_torch_check.py).", "",
             "Estimate: the torch engine's trace of Keras's TorchTrainer.train_step and Keras optimizer (Adam, "
             "SparseCategoricalCrossentropy(from_logits=True)), 2 steps as fit loops them, model built on meta. "
             "Measured: measure/child.py in tensors mode — `model.fit` for 2 steps on a torch DataLoader under "
             "torch.profiler, peak of the running sum of its memory events (64-byte rounded), build and compile "
             "included.", "",
             "Python's cyclic collector is paused during the measured fit (measure/child.py _fit_keras) as in the "
             "trace: Keras's tree utilities leave each step's batch and outputs in reference cycles "
             "(torch.utils._pytree.tree_flatten's recursive helper closing over keras/src/tree/torchtree_impl.py's "
             "is_leaf lambda), freed only when a collection runs, so with the collector on the peak of two steps "
             "depends on where one falls (last column).", "",
             "A long fit holds more: a 40-step fit of the MLP at batch 2048 (collector on) had 1,1,1,2,3,1,1,2,3,4,… "
             "batches alive at step ends (a generation-0 collection every 5 steps) and a tensor peak of 45,537,856 B "
             "(measure/child.py with steps 40, \"gc\": \"on\"), against 23,061,632 B estimated with 2 steps and "
             "55,829,632 B with --steps 6. The estimate's warning says so.", "",
             "| model | batch | parameters | estimated tensor peak (B) | measured (B) | error | measured, collector on (B) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, batch, est, measured, error, collected in rows:
        lines.append(f"| {name} | {batch} | {est['parameters']:,} | {est['tensor_bytes']:,} | "
                     f"{measured['tensor_peak_bytes']:,} | {error:+.3%} | {collected['tensor_peak_bytes']:,} |")
    lines += ["", "The LSTM misses, high: Keras's LSTM on the CPU runs its fallback loop (keras/src/backend/torch/"
              "rnn.py _fallback_lstm), which reads `x_proj[t]` once per time step, so backward adds 50 gradients "
              "into x_proj's. Autograd accumulates those in place on real tensors, but never for a tensor subclass "
              "(torch/csrc/autograd/input_buffer.cpp, can_accumulate_inplace: !isTensorSubclassLike), and the "
              "trace's FakeTensors are one: each accumulation makes a new tensor in the trace. A plain torch "
              "module with the same loop, estimated by the torch engine, is over by 38% (batch 256, 50 steps of "
              "a 512-wide projection): the engine's gap, not Keras's."]
    out = ROOT / "benchmarks" / "results" / "keras_torch.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
