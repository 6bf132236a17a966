"""Every command of the README (and docs/) that names a file under examples/ runs as written from the repository
root: exit 0 (fits) or 1 (does not fit), no traceback. The files are made by examples/make_examples.py (the Keras
file, the SavedModel, the safetensors checkpoint) or written by hand (net.yaml, factory.py)."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, arguments after `trainmem`) for each `trainmem …` line of a fenced code block that names
    examples/, its continuation lines (a trailing backslash) joined, its comment left off."""
    found, seen = [], []
    for document in DOCUMENTS:
        fenced, pending, start = False, None, 0
        for number, line in enumerate(document.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced, pending = not fenced, None
                continue
            if not fenced or (pending is None and not line.startswith("trainmem ")):
                continue
            if pending is None:
                pending, start = [], number
            continued = line.rstrip().endswith("\\")
            pending += shlex.split(line.rstrip().removesuffix("\\"), comments=True)
            if continued:
                continue
            if any(arg.startswith("examples/") for arg in pending) and pending[1:] not in seen:
                found.append((f"{document.name}:{start}", pending[1:]))  # a command on two pages runs once
                seen.append(pending[1:])
            pending = None
    return found


COMMANDS = documented_commands()


def _needs(args: list[str]) -> str | None:
    """The framework package a command's model needs beyond torch: tensorflow for a Keras file, a SavedModel or
    --framework keras on TensorFlow, keras alone for --keras-backend torch; None for a PyTorch model."""
    keras_model = any(arg.endswith(".keras") or (ROOT / arg / "saved_model.pb").is_file() for arg in args)
    if "--keras-backend" in args and args[args.index("--keras-backend") + 1] == "torch":
        return "keras"
    if keras_model or "--framework" in args and args[args.index("--framework") + 1] == "keras":
        return "tensorflow"
    return None


def _param(where: str, args: list[str]):
    marks = [pytest.mark.heavy]  # a fresh process that imports torch: two seconds or more
    if _needs(args):
        marks.append(pytest.mark.tf)
    return pytest.param(args, id=f"{where} {' '.join(args[:2])}", marks=marks)


def test_the_documents_run_every_kind_of_example():
    """The README names each example file in a command this test runs (a README edit that drops the path
    would otherwise drop the check silently)."""
    named = " ".join(arg for _, args in COMMANDS for arg in args)
    for path in ("examples/net.yaml", "examples/factory.py:", "examples/tiny_mlp.keras",
                 "examples/tiny_mlp_savedmodel", "examples/tiny_mlp.safetensors"):
        assert path in named, f"no README command names {path}"
    for where, args in COMMANDS:
        for arg in args:
            if arg.startswith("examples/"):
                assert (ROOT / arg.partition(":")[0]).exists(), f"{where}: {arg} is not in the repository"


@pytest.mark.parametrize("args", [_param(where, args) for where, args in COMMANDS])
def test_a_documented_example_command_runs(args):
    needs = _needs(args)
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"needs {needs}")
    if any(arg.endswith((".yaml", ".yml")) for arg in args) and importlib.util.find_spec("yaml") is None:
        pytest.skip("needs pyyaml (trainmem[yaml])")
    done = subprocess.run([sys.executable, "-m", "trainmem", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode in (0, 1), output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert done.stdout.strip(), done.stderr[-3000:]


TRAINING_SCRIPTS = {"train_guard.py": None, "train_hf.py": "transformers", "train_lightning.py": "lightning",
                    "train_keras.py": "tensorflow"}  # Keras on its TensorFlow backend


def test_every_training_script_example_is_documented_and_run_here():
    written = {path.name for path in (ROOT / "examples").glob("train_*.py")}
    assert written == set(TRAINING_SCRIPTS)
    page = (ROOT / "docs" / "integrations.md").read_text()
    assert all(f"python examples/{name}" in page for name in TRAINING_SCRIPTS)


@pytest.mark.heavy
@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.tf] if name == "train_keras.py" else [])
                                  for name in sorted(TRAINING_SCRIPTS)])
def test_a_training_script_example_runs(name):
    """docs/integrations.md's examples (examples/train_*.py) run as written from the repository root: two real
    training steps on the CPU with the check before them."""
    needs = TRAINING_SCRIPTS[name]
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"needs {needs}")
    done = subprocess.run([sys.executable, f"examples/{name}"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in output, output[-3000:]
    assert "fits on" in output, output[-3000:]
