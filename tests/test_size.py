"""Sizes only shrink: no module of src/trainmem over 400 lines and no function over 40, except those listed here
as they were when the check began (2026-12-05). A listed one may not grow; once it is split below the limit, its
line here must go (the test says so), so the lists only get shorter.

Lines are physical lines of the file; a function's are from its `def` to its last line, nested functions
counted on their own as well (named outer.inner).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "trainmem"
FILE_LIMIT = 400
FUNCTION_LIMIT = 40

# path under src/trainmem → its lines when this check began
LONG_FILES = {
    "alloc/cuda_caching.py": 663,
    "frontends/hf.py": 455,
    "frontends/onnx_ref.py": 542,
    "setup/__init__.py": 417,
    "targets/onednn/rnn_transients.py": 423,
    "trace/tf/lifetimes.py": 405,
    "trace/torch_private.py": 418,
}

# path:qualified name → its lines when this check began
LONG_FUNCTIONS = {
    "alloc/glibc_arenas.py:trace_nodes": 42,
    "alloc/replay.py:CudaAllocator._replay": 42,
    "alloc/small_objects.py:_interleave": 77,
    "alloc/steady_state.py:compose": 51,
    "alloc/tf_bfc.py:replay_bfc": 41,
    "calibrate.py:measure": 41,
    "cli/parser.py:add_setup_flags": 83,
    "device_catalog.py:parse_custom": 45,
    "fit.py:fit": 52,
    "frontends/__init__.py:resolve": 46,
    "frontends/hf.py:from_hf_ref": 55,
    "frontends/hf_hub.py:_fetch": 44,
    "frontends/onnx_ref.py:_graph_module": 84,
    "frontends/onnx_ref.py:_numpy_ops": 51,
    "frontends/onnx_ref.py:_ops": 207,
    "measure/child.py:run": 44,
    "plan/__init__.py:plan": 48,
    "targets/cuda_reduce.py:_buffer": 44,
    "targets/onednn/conv_thread_balance.py:jit_minibatch_threads": 58,
    "targets/onednn/conv_weights_plan.py:backward_weights_plan": 41,
    "targets/onednn/rnn_transients.py:lstm_backward_transients": 56,
    "targets/onednn/rnn_transients.py:lstm_scratchpad_bytes": 55,
    "trace/run.py:_traced": 49,
}


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def sizes() -> tuple[dict[str, int], dict[str, int]]:
    """(every module's lines, every function's lines) of src/trainmem."""
    files, functions = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        relative = path.relative_to(PACKAGE).as_posix()
        files[relative] = len(text.splitlines())
        for name, lines in _functions(ast.parse(text)):
            functions[f"{relative}:{name}"] = lines
    return files, functions


def _over(measured: dict[str, int], allowed: dict[str, int], limit: int, what: str) -> list[str]:
    problems = []
    for name, lines in sorted(measured.items()):
        if lines > limit and name not in allowed:
            problems.append(f"{name}: {lines} lines, a new {what} over {limit}")
        elif name in allowed and lines > allowed[name]:
            problems.append(f"{name}: {lines} lines, grew from {allowed[name]}")
    for name in sorted(allowed):
        if measured.get(name, 0) <= limit:
            problems.append(f"{name}: now {measured.get(name, 0)} lines (or gone), within {limit}: drop it from the list")
    return problems


def test_modules_and_functions_only_shrink():
    files, functions = sizes()
    problems = _over(files, LONG_FILES, FILE_LIMIT, "module") + _over(functions, LONG_FUNCTIONS, FUNCTION_LIMIT, "function")
    assert not problems, "\n".join(problems)


def test_the_check_sees_growth_and_shrinking():
    assert _over({"a.py": 401}, {}, 400, "module") == ["a.py: 401 lines, a new module over 400"]
    assert _over({"a.py": 450}, {"a.py": 420}, 400, "module") == ["a.py: 450 lines, grew from 420"]
    assert _over({"a.py": 390}, {"a.py": 420}, 400, "module")[0].endswith("drop it from the list")
    assert _over({"a.py": 410}, {"a.py": 420}, 400, "module") == []
