"""Keras on the torch backend: the CPU process adds Keras's import and model.fit's machinery to torch's floor
(targets/keras_torch_runtime.py, measured by benchmarks/calibrate_keras_torch.py). Keras fixes its backend at
its first import, so the Keras estimate runs in a fresh process with KERAS_BACKEND=torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainmem.targets import keras_torch_runtime

pytestmark = pytest.mark.tf  # Keras or TensorFlow: left out of `make check`, run by `make test`

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("keras_import_anon", "keras_import_file", "keras_fit_machinery")

KERAS_ESTIMATE = """
import json
from trainmem.frontends.keras.imports import import_keras
import_keras("torch")
import trainmem
from trainmem.report.text import render_text
est = trainmem.estimate("mlp:8-8-2", framework="keras", keras_backend="torch", batch_size=4, input_shape="8")
print(json.dumps({"process": est.process_parts, "process_bytes": est.process_bytes, "high": est.process_bytes_high,
                  "warnings": list(est.warnings), "resolved": est.resolved, "text": render_text(est)}))
"""


def test_floor_data_names_what_it_was_measured_with():
    floor = keras_torch_runtime.load()
    for key in ("torch", "keras", "cpu_capability", "threads", "command", "runs", "date"):
        assert floor[key], key
    assert floor["runs"] >= 5
    assert floor["keras_total_min"] <= floor["keras_total_bytes"] <= floor["keras_total_max"]
    parts, spread, said = keras_torch_runtime.keras_parts(floor)
    assert sum(parts.values()) == floor["keras_total_bytes"]  # the parts split the measured difference
    assert spread == floor["keras_total_max"] - floor["keras_total_bytes"]
    assert parts["keras_import_file"] > 0 and parts["keras_import_anon"] > 0  # importing Keras maps and allocates
    assert "Keras" in said[0] and floor["keras"] in said[0]


def test_applies_only_to_keras_on_torch():
    class Source:
        def __init__(self, resolved):
            self.resolved = resolved

    assert keras_torch_runtime.applies(Source({"framework": "keras", "keras_backend": "torch"}))
    assert not keras_torch_runtime.applies(Source({"framework": "keras", "keras_backend": "tensorflow"}))
    assert not keras_torch_runtime.applies(Source({}))


def test_plain_torch_model_has_no_keras_parts():
    import trainmem

    est = trainmem.estimate("mlp:8-8-2", batch_size=4, input_shape="8")
    assert not set(PARTS) & set(est.process_parts)
    assert not any("Keras on torch adds" in w for w in est.warnings)


def test_keras_on_torch_estimate_adds_the_parts():
    pytest.importorskip("keras")
    env = {**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", KERAS_ESTIMATE], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    parts, spread, _ = keras_torch_runtime.keras_parts()
    for name in PARTS:
        assert out["process"][name] == parts[name], name
    assert "library_keras" not in out["process"]  # not the generic 'no increment measured' library path
    assert not any("no increment measured for keras" in w for w in out["warnings"])
    assert out["process_bytes"] == sum(out["process"].values())
    assert out["high"] >= out["process_bytes"] + spread
    assert any("Keras on torch adds" in w for w in out["warnings"])
    # the report names model.fit's loop, not PyTorch's tutorial loop
    assert out["resolved"]["loop"] in out["text"]
    assert "PyTorch's tutorial loop" not in out["text"]
