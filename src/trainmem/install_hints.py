"""What to pip install when a framework or an extra is missing, worded so that the user's torch stays.

trainmem's core depends on neither framework (pyproject.toml): torch comes with the '[torch]' extra (and with
'[hf]', '[onnx]', '[vision]'), TensorFlow with '[tensorflow]'. Each of those requires torch as an open range,
which pip meets with the torch already installed. torchvision is the exception: each release requires its own
torch release (torchvision 0.28.0: torch==2.13.0), so `pip install 'trainmem[vision]'` alone takes the newest
torchvision and replaces the user's torch with the one it needs. The hint for it names the torchvision paired
with the installed torch, and the torch itself, so that pip keeps it.

Nothing here imports torch or TensorFlow: what is installed is read from the import system and the packages'
metadata, so the hints work in the environments that lack them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

NEEDS_A_FRAMEWORK = ("trainmem needs PyTorch or TensorFlow: pip install 'trainmem[torch]' "
                     "(or '[tensorflow]' for Keras models)")

# torch release (major, minor) → the torchvision release built against it: torchvision's README table, as
# published with torchvision 0.29.1 (2.6 → 0.21 … 2.13 → 0.28), and torchvision 0.29.0's own requirement,
# torch==2.14.0. A torch newer than the table gets no torchvision named: the torch pin alone makes pip choose
# the torchvision that accepts it.
TORCHVISION_FOR_TORCH = {(2, 6): "0.21", (2, 7): "0.22", (2, 8): "0.23", (2, 9): "0.24", (2, 10): "0.25",
                         (2, 11): "0.26", (2, 12): "0.27", (2, 13): "0.28", (2, 14): "0.29"}
# the local labels of PyTorch's own wheel indexes (download.pytorch.org/whl/<label>): a torch installed from one
# pairs with the torchvision built there for the same CUDA / ROCm / CPU
_PYTORCH_INDEX_LABEL = re.compile(r"cpu|cu\d+|rocm\d+(\.\d+)*|xpu")


def is_installed(module: str) -> bool:
    """Whether `module` can be imported here, asked without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails to import; a module whose __spec__ is None
        return False


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_torch_line(model: object = None, framework: str = "auto", keras_command: bool = True) -> str:
    """The one line for a run that needs torch where torch is not installed: the extra that brings it, or, where
    TensorFlow is not installed either, the choice between the two frameworks. `keras_command`: whether the
    command takes Keras models (fit does not), so that --framework keras is worth suggesting."""
    if not is_installed("tensorflow"):
        return NEEDS_A_FRAMEWORK
    kind = _kind(model)
    if framework == "keras" or kind in ("keras", "saved-model"):  # a Keras model asked for on its torch backend
        return ("expected PyTorch for Keras on the torch backend, and torch is not installed: "
                "pip install 'trainmem[torch]'")
    extra = {"vision": "vision", "hf": "hf", "onnx": "onnx"}.get(kind, "torch")  # those extras bring torch too
    # --framework keras reads mlp: and layer specs too (frontends/keras/reference.py)
    keras_can = keras_command and framework == "auto" and kind in ("mlp", "spec")
    return (f"expected PyTorch for a PyTorch model, and torch is not installed: pip install 'trainmem[{extra}]'"
            + (" (or --framework keras to build it as a Keras model)" if keras_can else ""))


def missing_keras_side_line() -> str | None:
    """What `trainmem compare MODEL` lacks for its Keras side (Keras 3 on TensorFlow) where TensorFlow or Keras is
    not installed, as one message with the extra that brings both; None where both are installed."""
    missing = [name for name in ("tensorflow", "keras") if not is_installed(name)]
    if not missing:
        return None
    return ("expected TensorFlow and Keras 3 for compare's Keras side (compare estimates one MODEL on PyTorch and on "
            f"Keras on TensorFlow), got no {' and no '.join(missing)} module: pip install 'trainmem[tensorflow]' "
            "(or compare PyTorch configurations: a second MODEL or --sweep)")


def _kind(model: object) -> str | None:
    from trainmem.frontends import reference_kind

    try:
        return reference_kind(model)
    except Exception:  # noqa: BLE001 - a hint's detail; the reference's own error comes when it is read
        return None


def missing_framework_line(error: BaseException, model: object = None, framework: str = "auto",
                           keras_command: bool = True) -> str | None:
    """The install hint where `error`, or an error it was raised from (a model file's failed import), is an
    import of torch that failed because torch is not installed; None for any other error, which is reported as
    it is (a module of the user's, a broken install)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ImportError) and (error.name or "").partition(".")[0] == "torch":
            return None if is_installed("torch") else missing_torch_line(model, framework, keras_command)
        error = error.__cause__  # raised `from` it: what a model file's import raised, say
    return None


def vision_install() -> str:
    """`pip install 'trainmem[vision]'` with the torch installed here pinned, and the torchvision release paired
    with it, so that pip keeps that torch (from PyTorch's own index where the torch came from one)."""
    torch_version = installed_version("torch")
    if torch_version is None:
        return "pip install 'trainmem[vision]'"
    public, _, label = torch_version.partition("+")
    words = ["pip install 'trainmem[vision]'", f"torch=={public}"]
    numbers = re.match(r"(\d+)\.(\d+)", public)
    pair = TORCHVISION_FOR_TORCH.get((int(numbers[1]), int(numbers[2]))) if numbers else None
    if pair is not None:
        words.append(f"'torchvision=={pair}.*'")
    if _PYTORCH_INDEX_LABEL.fullmatch(label):
        words.append(f"--extra-index-url https://download.pytorch.org/whl/{label}")
    return " ".join(words)


def vision_hint() -> str:
    """Where to get torchvision/timm/accelerate, and why the command names versions."""
    torch_version = installed_version("torch")
    if torch_version is None:
        return f"install it with {vision_install()}"
    return (f"install it with {vision_install()} (keeps your torch {torch_version}: each torchvision release "
            "requires its own torch)")


def require(module: str, extra: str) -> object:
    """`module` imported, for an integration that only works beside it (trainmem.integrations); when it is missing,
    an ImportError whose one line says which extra brings it."""
    import importlib

    if not is_installed(module):
        raise ImportError(f"expected {module} installed for this part of trainmem, it is not: "
                          f"pip install 'trainmem[{extra}]'")
    return importlib.import_module(module)
