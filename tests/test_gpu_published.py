"""benchmarks/data/gpu_published.jsonl: every published GPU row says what was run, where, with which
software, by which counter and from which source; and benchmarks/accuracy_gpu.py's summary counts what it
claims (median, worst low, low rows, rows outside 10% with their reason)."""

from __future__ import annotations

import ast
import importlib.util
import sys

import pytest

from conftest import ROOT
from trainmem.devices import get_device
from trainmem.setup import TrainingSetup

spec = importlib.util.spec_from_file_location("accuracy_gpu", ROOT / "benchmarks/accuracy_gpu.py")
accuracy_gpu = importlib.util.module_from_spec(spec)
sys.modules["accuracy_gpu"] = accuracy_gpu
spec.loader.exec_module(accuracy_gpu)

ROWS = accuracy_gpu.load_rows()
COUNTERS = set(accuracy_gpu.TARGETS)


def _factories(path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_rows_are_many_and_from_several_sources():
    assert len(ROWS) >= 50
    assert len({r["id"] for r in ROWS}) == len(ROWS), "row ids must be unique"
    sources = {r["source_key"] for r in ROWS}
    assert len(sources) >= 4, sources


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_row_schema(row):
    missing = [key for key in accuracy_gpu.REQUIRED if not row.get(key)]
    assert not missing, f"{row['id']} lacks {missing}"
    assert set(row["measured"]) <= COUNTERS and row["measured"]
    assert all(isinstance(v, int) and v > 0 for v in row["measured"].values())
    assert "http" in row["source"], "a source a reader can open"
    assert row.get("notes"), "what was run, and what was assumed where the source is silent"
    get_device(row["device"])
    TrainingSetup.from_mapping(row["setup"], where=row["id"])


@pytest.mark.parametrize("row", [r for r in ROWS if ":" in r["model"] and r["model"].startswith("benchmarks/")],
                         ids=lambda r: r["id"])
def test_row_factories_exist(row):
    path, _, name = row["model"].partition(":")
    assert name in _factories(ROOT / path)


def _result(id_, source, errors, loose=False, why=""):
    measured = {k: 1000 * MB for k in errors}
    estimated = {k: round(1000 * MB * (1 + e)) for k, e in errors.items()}
    return {"id": id_, "source_key": source, "gpu": "g", "measured": measured, "estimated": estimated,
            "errors": errors, "notes": f"notes of {id_}.", "why": why, "versions": "v", "counter": "c", "source": "s",
            "loose": loose}


MB = accuracy_gpu.MB


def test_report_counts_low_rows_and_explains_far_ones():
    results = [_result("a", "s1", {"reserved_bytes": -0.02}), _result("b", "s1", {"reserved_bytes": 0.04}),
               _result("c", "s2", {"reserved_bytes": -0.15}, why="fragmentation across shapes"),
               _result("d", "s2", {"allocated_bytes": 0.30}, loose=True),
               {"id": "e", "source_key": "s3", "skipped": "FSDP", "loose": False, "gpu": "g", "measured": {}}]
    text = accuracy_gpu.report(results)
    assert "5 from 3 sources" in text and "3 with published settings, 1 partly published, 1 skipped" in text
    assert "low on at least one counter: 2 of 4 evaluated rows (1 more than 10% low)" in text
    # reserved over a, b, c: median +(-2%), worst low -15%, worst high +4%, 2 low, 1 beyond 10%
    assert "| reserved | 3 | 2/3 within 5% | -2.00% | -15.00% | +4.00% | 2 | 1 |" in text
    assert "| reserved | s2 | 1 | -15.00% | -15.00% | -15.00% | 1 | 1 |" in text
    assert "**c** (reserved -15.0%): fragmentation across shapes" in text
    assert "**d** (allocated +30.0%, partly published): (from the row's notes) notes of d." in text
    assert "- e (s3): FSDP" in text
    assert "**a**" not in text and "**b**" not in text
