"""Private PyTorch, TensorFlow and Keras APIs are reached through trace/torch_private.py, trace/fake_cache.py
(FakeTensorMode's dispatch-cache hooks), trace/inductor_private.py (Inductor's, for --compile), parallel/fsdp1_private.py (FSDP1's handles,
for its CPU offload) and trace/tf/private.py only, so that an upgrade that moves one breaks in
one place (each module's docstring lists what it holds).

Read from the code's syntax tree, so comments, docstrings and strings do not count: an import of a private
module or name (a part starting with `_`; TensorFlow's undocumented `tensorflow.python` and `tensorflow.core`,
Keras's `keras.src`), an attribute chain such as `torch._C.x` rooted at the framework's module, and the
underscore methods of TensorFlow graphs and Keras layers and variables that trainmem calls. `torch.ops.aten._x`
is an operator's name, not a private API. measure/keras_child.py, the ground truth's child process, imports
nothing of trainmem by design (its docstring) and asks TensorFlow itself whether oneDNN is on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "trainmem"
GATHERED = {"trace/torch_private.py", "trace/fake_cache.py", "trace/inductor_private.py", "trace/tf/private.py",
            "parallel/fsdp1_private.py"}
INDEPENDENT = {"measure/keras_child.py": {"from tensorflow.python.util import _pywrap_util_port"}}
FRAMEWORKS = ("torch", "tensorflow", "tf", "keras", "tf_keras")
UNDOCUMENTED = ("tensorflow.python", "tensorflow.core", "keras.src")
# underscore methods and attributes of TensorFlow and Keras objects that trainmem uses (trace/tf/private.py), and of
# FSDP1's handles (parallel/fsdp1_private.py)
OBJECT_PRIVATES = {"_flatten_layers", "_get_function", "_track_variables", "_track_variable", "_value",
                   "_torch_params", "_add_existing_weight", "_offload_params", "_local_shard", "_cpu_grad", "_handle"}


def _is_private(dotted: str) -> bool:
    parts = dotted.split(".")
    underscored = any(part.startswith("_") and not part.startswith("__") for part in parts)  # __version__ is API
    return parts[0] in FRAMEWORKS and (underscored or dotted.startswith(UNDOCUMENTED))


def _chain(node: ast.Attribute) -> str | None:
    """'torch._C._x' for an attribute chain rooted at a name; None otherwise."""
    parts, current = [node.attr], node.value
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    return ".".join([current.id, *reversed(parts)]) if isinstance(current, ast.Name) else None


def private_uses(source: str) -> list[str]:
    found, tree = [], ast.parse(source)
    methods = {id(item) for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for item in node.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {alias.name}" for alias in node.names if _is_private(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [f"{node.lineno}: from {node.module} import {alias.name}" for alias in node.names
                      if _is_private(f"{node.module}.{alias.name}")]
        elif isinstance(node, ast.Attribute):
            dotted = _chain(node)
            framework = dotted is not None and dotted.split(".")[0] in FRAMEWORKS
            if framework and _is_private(dotted) and not dotted.startswith("torch.ops."):
                found.append(f"{node.lineno}: {dotted}")
            elif node.attr in OBJECT_PRIVATES and not (isinstance(node.value, ast.Name)
                                                       and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.FunctionDef) and node.name in OBJECT_PRIVATES and id(node) in methods:
            found.append(f"{node.lineno}: def {node.name} (overrides a framework's private hook)")
    return found


def test_private_framework_apis_live_in_the_two_gathering_modules():
    stray = {}
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        if name in GATHERED:
            continue
        allowed = INDEPENDENT.get(name, set())
        uses = [use for use in private_uses(path.read_text()) if use.split(": ", 1)[1] not in allowed]
        if uses:
            stray[name] = uses
    assert not stray, f"private framework APIs outside {sorted(GATHERED)}: {stray}"


@pytest.mark.parametrize(("code", "found"), [
    ("from torch._subclasses.fake_tensor import FakeTensorMode", ["1: from torch._subclasses.fake_tensor import "
                                                                  "FakeTensorMode"]),
    ("import torch._dynamo", ["1: import torch._dynamo"]),
    ("from torch.utils import _pytree", ["1: from torch.utils import _pytree"]),
    ("from tensorflow.python.framework import ops", ["1: from tensorflow.python.framework import ops"]),
    ("x = torch._C._current_autograd_node()", ["1: torch._C._current_autograd_node", "1: torch._C"]),
    ("for l in model._flatten_layers(): pass", ["1: ._flatten_layers"]),
    ("self._value = 1", []),
    ("def _value(x): pass", []),
    ("class L:\n    def _add_existing_weight(self, w): pass", ["2: def _add_existing_weight (overrides a framework's "
                                                              "private hook)"]),
    ("v = torch.__version__", []),
    ("torch.ops.aten._convolution.default", []),
    ("import torch.nn.functional as F", []),
    ("from keras import layers", []),
    ("# torch._C in a comment\n'torch._dynamo in a string'", []),
])
def test_the_scan_finds_what_it_names_and_nothing_else(code, found):
    assert private_uses(code) == found


def test_the_gathering_modules_hold_private_uses():
    # the scan would find them there: the two modules are where they went, not a blind spot of the scan
    for name in GATHERED:
        assert private_uses((SRC / name).read_text()), name
