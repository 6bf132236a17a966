"""Where the small-object model loses heap: the real runtime objects against the table's rows, on one stream.

For each held-out case: run two real steps in a fresh process under the LD_PRELOAD shim (benchmarks/glibc/
malloc_log.c), trace the same setup, and align the log with the estimate's tensor stream
(calibrate_small_objects.py align). Then replay, through trainmem's glibc model (alloc/cpu_heap.py), the same
tensor stream with
- no runtime objects (the tensors alone);
- the real objects, in the order the log has them (what the small-object model tries to reproduce);
- rows calibrated on this run alone (the interleave's own loss: placement by per-op rates, not by the log);
- the rows of each family of the shipped table, "torch" (tests/models.py's zoo) and "transformers"
  (tests/data/tiny_llama, DistilBERT): the transfer's loss.
The figures are the heap's peak over the two logged steps, the parameters (built before the log) included.
None of the cases is a calibration case.

    .venv/bin/python benchmarks/small_object_placement.py   # needs gcc; about 10 minutes on 2 cores
"""

from __future__ import annotations

import collections
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import calibrate_small_objects as calibration  # noqa: E402
from glibc_fidelity import build  # noqa: E402
from trainmem.alloc import small_objects  # noqa: E402
from trainmem.alloc.cpu_heap import replay_actions  # noqa: E402
from trainmem.alloc.small_objects import Action  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "small_object_placement.md"
ZOO = f"{ROOT}/tests/models.py"
CASES = [("hf:openai-community/gpt2", {"batch_size": 2, "seq_len": 128, "optimizer": "adam", "lora": "r=8"},
          "transformers"),
         ("hf:openai-community/gpt2", {"batch_size": 2, "seq_len": 128, "optimizer": "adam"}, "transformers"),
         (f"{ZOO}:tied_lm", {"batch_size": 16, "optimizer": "adam"}, "torch"),
         (f"{ZOO}:mobilenet_like", {"batch_size": 32, "optimizer": "adam"}, "torch")]


def real_order(out: list[tuple], stream) -> list[Action]:
    """The parameters, then the log's events in its order: tensors as the stream sizes them, the main thread's
    runtime objects as logged (other threads allocate in their own arenas)."""
    actions = [Action("alloc", e.key, e.nbytes) for e in stream if e.action == "alloc" and str(e.phase) == "init"]
    main_objects = set()
    for event in out:
        if event[0] == "T":
            actions.append(Action("alloc", stream[event[1]].key, stream[event[1]].nbytes))
        elif event[0] == "t" and event[1] >= 0:
            actions.append(Action("free", stream[event[1]].key))
        elif event[0] == "s" and event[4]:
            main_objects.add(event[1])
            actions.append(Action("alloc", ("object", event[1]), event[2], event[3]))
        elif event[0] == "x" and event[1] in main_objects:
            actions.append(Action("free", ("object", event[1])))
    return actions


def own_rows(out: list[tuple], stream) -> dict:
    """Rows calibrated on this run alone, as calibrate_small_objects.py calibrates a family."""
    kept, _ = calibration.objects(out, stream)
    totals: dict = collections.defaultdict(lambda: {"allocs": 0, "firsts": 0, "objects": collections.Counter()})
    calibration.add_case(totals, stream, kept)
    ops, phases, _ = calibration.table_rows(totals)
    return {"ops": ops, "phases": phases}


def measure_case(ref: str, values: dict, family: str, shim: Path, tmp: Path) -> dict:
    stream = calibration.estimate_stream(ref, values)
    out = calibration.align(calibration.logged_run(shim, tmp, ref, values), stream)
    mib = 2**20
    interleaved = lambda **kw: replay_actions(small_objects.interleave(stream, **kw).actions) / mib  # noqa: E731
    return {"case": f"{ref.rsplit('/', 1)[-1].rsplit(':', 1)[-1]} {json.dumps(values)}", "family": family,
            "tensors": replay_actions([Action(e.action, e.key, e.nbytes) for e in stream]) / mib,
            "real": replay_actions(real_order(out, stream)) / mib, "own": interleaved(table=own_rows(out, stream)),
            "torch": interleaved(family="torch"), "transformers": interleaved(family="transformers")}


def main() -> None:
    import torch

    started, rows = time.time(), []
    with tempfile.TemporaryDirectory() as tmpdir:
        shim, _ = build(Path(tmpdir))
        for ref, values, family in CASES:
            rows.append(measure_case(ref, values, family, shim, Path(tmpdir)))
            print(rows[-1], flush=True)
    lines = [f"| {r['case']} | {r['family']} | {r['tensors']:,.1f} | {r['real']:,.1f} | {r['own']:,.1f} "
             f"({r['own'] / r['real'] - 1:+.1%}) | {r['torch']:,.1f} ({r['torch'] / r['real'] - 1:+.1%}) | "
             f"{r['transformers']:,.1f} ({r['transformers'] / r['real'] - 1:+.1%}) |" for r in rows]
    OUT.write_text("\n".join([
        "# Small objects: the real placement against the table's rows", "",
        f"Generated {datetime.date.today()} by `python benchmarks/small_object_placement.py` (torch {torch.__version__}, "
        f"2 threads, {time.time() - started:.0f} s). Heap peak in MiB over two logged steps, through trainmem's glibc "
        "model, of one tensor stream (the estimate's) with: no runtime objects; the real objects in the log's order; "
        "rows calibrated on this run alone; the shipped table's torch rows; its transformers rows. The family column "
        "is the one trainmem picks for the model. No case is a calibration case.", "",
        "| case | family | tensors alone | real objects | own rows | torch rows | transformers rows |",
        "|---|---|---:|---:|---:|---:|---:|", *lines, "",
        "Own rows against the real objects is the interleave's loss (objects placed by per-op rates rather than "
        "where the log has them); the family's rows against own rows is the transfer's loss (a table calibrated on "
        "other models).", ""]))
    print(OUT.read_text())


if __name__ == "__main__":
    main()
