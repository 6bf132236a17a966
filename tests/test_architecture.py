"""The package map of docs/architecture.md against the code, and no import cycle between packages.

A package is a directory of src/trainmem with an __init__.py; a top-level module (cli.py, fit.py, …) is a unit of
its own. An import counts when it runs as its module is imported: at module scope (also inside `try`), not
inside a function and not under `if TYPE_CHECKING:`. Function-level imports are how a package reaches one that
depends on it without a cycle at import time; they are not counted here.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "trainmem"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str | None:
    """The package (or top-level module) a dotted name belongs to; None for `trainmem` itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "trainmem" else None


def _is_unit(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").exists()


def _imports_at_import_time(tree: ast.Module) -> list[ast.stmt]:
    found: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for statement in node.body if isinstance(node, ast.Try) else [node]:
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                found.append(statement)
    return found


def _imported_names(statement: ast.stmt, module: str, is_package: bool) -> list[str]:
    if isinstance(statement, ast.Import):
        return [alias.name for alias in statement.names]
    assert isinstance(statement, ast.ImportFrom)
    base = statement.module or ""
    if statement.level:  # relative: resolved against the importing module's package
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[:len(anchor) - statement.level + 1]
        base = ".".join(anchor + ([statement.module] if statement.module else []))
    return [base] + [f"{base}.{alias.name}" for alias in statement.names]


def package_edges() -> dict[str, dict[str, str]]:
    """unit → {unit it imports at import time: one module-level import that makes the edge}."""
    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        source = _unit(module)
        for statement in _imports_at_import_time(ast.parse(path.read_text())):
            for name in _imported_names(statement, module, path.name == "__init__.py"):
                target = _unit(name)
                if source and target and target != source and _is_unit(target):
                    edges[source].setdefault(target, f"{module} imports {name}")
    return edges


def _cycles(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_packages():
    edges = package_edges()
    cycles = _cycles(edges)
    described = ["; ".join(edges[a][b] for a in cycle for b in cycle if b in edges[a]) for cycle in cycles]
    assert not cycles, "packages that import each other at import time: " + " | ".join(
        f"{cycle}: {why}" for cycle, why in zip(cycles, described))


def test_the_cycle_check_finds_a_cycle():
    edges = {"a": {"b": "a.x imports b.y"}, "b": {"c": "…"}, "c": {"a": "…"}, "d": {"a": "…"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": ""}, "b": {}}) == []


def _mapped(kind: str) -> set[str]:
    """The names in the architecture document's table rows of one kind: "| `alloc/` |" or "| `cli.py` |"."""
    pattern = r"^\| `([a-z_]+)/` \|" if kind == "package" else r"^\| `([a-z_]+)\.py` \|"
    return set(re.findall(pattern, ARCHITECTURE.read_text(), flags=re.M))


def test_package_map_equals_the_code():
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    modules = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert _mapped("package") == packages, "docs/architecture.md's package map and src/trainmem's packages differ"
    assert _mapped("module") == modules, "docs/architecture.md's top-level modules and src/trainmem's differ"


def test_the_map_says_which_way_packages_depend():
    """Every import edge between packages at import time is one the document allows (its "depends on" column)."""
    allowed: dict[str, set[str]] = {}
    for line in ARCHITECTURE.read_text().splitlines():
        row = re.match(r"^\| `([a-z_]+)(?:/|\.py)` \|[^|]*\| ([^|]*) \|$", line)
        if row:
            allowed[row.group(1)] = set(re.findall(r"`([a-z_]+)(?:/|\.py)?`", row.group(2)))
    unexpected = [why for source, targets in package_edges().items() for target, why in targets.items()
                  if target not in allowed.get(source, set())]
    assert not unexpected, "imports the package map does not list: " + "; ".join(sorted(unexpected))


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore is its module's own: another module that needs it gets it published."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainmem"):
                found += [f"{path.relative_to(PACKAGE)} imports {node.module}.{alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not found, "; ".join(found)


def test_the_library_never_imports_the_cli():
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("cli/") or relative == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            found |= {f"{relative} imports {name}" for name in names if name == "trainmem.cli" or name.startswith("trainmem.cli.")}
    assert not found, f"the library imports the CLI: {sorted(found)}"


def test_files_are_named_by_role_not_twice():
    """No two modules share a file name (three cpu.py once meant three different things). The command modules
    (cli/commands/fit.py …) are named by the command they run, as the library module that does the work is."""
    names: dict[str, list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py" and path.parent.name != "commands":
            names[path.name].append(path.relative_to(PACKAGE).as_posix())
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
