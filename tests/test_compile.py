"""--compile: the step traced as torch.compile (Inductor) runs it (trace/compiled.py, trace/inductor_private.py).

The ground truth is benchmarks/truth_loops.py --compile, a real `torch.compile(model)` training loop that imports
nothing of trainmem; benchmarks/compile_cpu.py compares 12 rows in six families (results/compile_cpu.md: every
tensor peak within 0.02%), which is what the 0.5% tolerance here rests on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainmem import estimate
from trainmem.cli import main
from trainmem.setup import TrainingSetup

ROOT = Path(__file__).resolve().parents[1]
CNN = f"{ROOT / 'tests' / 'models.py'}:cnn_bn"


def _tensor_peak(compiled: bool, batch: int = 8) -> dict:
    setup = TrainingSetup(batch_size=batch, optimizer="sgd", compile=compiled)
    return estimate(CNN, setup=setup, device="cpu", cache=False).to_dict()


@pytest.mark.heavy
def test_compiled_cnn_matches_a_real_compiled_run(tmp_path):
    """Inductor recomputes the BatchNorm and ReLU in backward and fuses their temporaries away: the compiled peak
    is a quarter below the eager one on this CNN, and the estimate follows the real compiled run to 0.5%."""
    real = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "truth_loops.py"), CNN, "--batch-size", "8",
                           "--optimizer", "sgd", "--compile"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)})
    assert real.returncode == 0, real.stderr[-2000:]
    measured = json.loads(real.stdout.strip().splitlines()[-1])["tensor_peak_bytes"]
    compiled, eager = _tensor_peak(True), _tensor_peak(False)
    assert abs(compiled["peak"]["tensor_bytes"] - measured) <= 0.005 * measured, (compiled["peak"], measured)
    assert compiled["peak"]["tensor_bytes"] < 0.85 * eager["peak"]["tensor_bytes"], (compiled["peak"], eager["peak"])
    assert compiled["setup"]["compile"] is True and "compile" not in eager["setup"]
    assert compiled["process"]["runtime_compile"] > 0 and "runtime_compile" not in eager["process"]
    assert any(line.startswith("--compile:") for line in compiled["warnings"])


@pytest.mark.heavy
def test_a_real_compile_after_the_trace_computes_real_values():
    """The trace runs Inductor's wrappers with unbuilt kernels; none of that may reach a real torch.compile later in
    the same process (dynamo's caches are reset, the wrapper modules dropped)."""
    from models import cnn_bn  # the test zoo, tests/models.py

    _tensor_peak(True, batch=2)
    model, make_batch = cnn_bn()  # the model traced, at the traced shapes: a stale cache entry would match it
    (x,) = make_batch(2)
    expected = model(x)
    got = torch.compile(model.forward)(x)
    assert got.abs().sum() > 0 and torch.allclose(got, expected, atol=1e-4)


@pytest.mark.parametrize(("flags", "named"), [
    (["--device", "a100-80gb"], "--device a100-80gb"),
    (["--strategy", "ddp", "--world-size", "2"], "--strategy ddp"),
    (["--checkpointing"], "--checkpointing"),
])
def test_compile_is_refused_where_it_is_not_traced(flags, named, capsys):
    code = main(["estimate", "mlp:16-32-4", "--input-shape", "16", "--compile", *flags])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--compile" in err and named in err


def test_compile_is_refused_for_a_keras_model(tmp_path, capsys):
    code = main(["estimate", "mlp:16-32-4", "--framework", "keras", "--compile"])
    err = capsys.readouterr().err
    assert code == 2 and "--compile" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("keywords", "said"), [
    ({"device": "a100-80gb"}, "--device cpu"),
    ({"checkpointing": True}, "--checkpointing"),
    ({"strategy": "ddp", "world_size": 2, "device": "cpu"}, "one-process"),
])
def test_the_api_refuses_what_the_trace_does_not_make(keywords, said):
    from trainmem.errors import SetupError

    with pytest.raises(SetupError, match=said):
        estimate("mlp:16-32-4", input_shape="16", batch_size=4, compile=True, cache=False, **keywords)


def test_the_setup_keeps_its_keys_without_compile():
    assert "compile" not in TrainingSetup().to_dict()
    assert TrainingSetup.from_mapping({"compile": True}).compile is True
    with pytest.raises(Exception, match="--compile"):
        TrainingSetup.from_mapping({"compile": "yes please"})


def test_a_compiled_module_given_to_the_api_is_traced_as_the_module_it_wraps_and_says_so():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    result = estimate(torch.compile(model), input_shape="16", batch_size=8, cache=False)
    assert result.model_name == "Sequential" and not result.setup.compile
    assert result.tensor_bytes == estimate(model, input_shape="16", batch_size=8, cache=False).tensor_bytes
    assert any("torch.compile'd" in line and "compile=True" in line for line in result.warnings)


@pytest.mark.heavy
def test_inductors_cpp_extension_imports_after_pip_was_looked_up():
    """A process that looked pip up (importlib.util.find_spec("pip"): some libraries do) has setuptools' distutils
    shim turned off, and Inductor's `import setuptools` then failed inside the trace with an AssertionError naming
    the standard library's distutils (the full suite hit it depending on test order): trace/compiled.py imports it
    over the standard library's distutils there."""
    code = ("import importlib.util, sys; importlib.util.find_spec('pip')\n"
            "from trainmem.trace.compiled import _import_cpp_extension\n"
            "_import_cpp_extension()\n"
            "assert 'torch.utils.cpp_extension' in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
