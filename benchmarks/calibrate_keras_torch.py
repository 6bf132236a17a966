"""Measure what Keras 3 on the torch backend adds to a CPU training process beyond torch's own floor.

trainmem's torch floor (targets/data/cpu_runtime.json, benchmarks/calibrate_cpu.py) is the peak RSS of a
fresh process that imports torch and trains mlp:8-8-2 for two steps with trainmem's loop. A Keras model on
the torch backend runs in a process that also imports Keras and what Keras imports (numpy, ml_dtypes,
optree, h5py, rich, namex …) and trains with model.fit (Keras's trainer, its torch data adapter,
callbacks, the progress bar, the metrics tracker). Three kinds of fresh process, measured the way
`trainmem measure` does (trainmem.measure.child, /proc/self/status), train the same synthetic model
(mlp:8-8-2: 90 parameters in either framework, batch 1, Adam, two steps):

  torch   — import torch; the torch model, trainmem's hand-written loop (the floor's own process);
  import  — import keras (on torch) first, then the same torch model and loop;
  fit     — import keras; the Keras model, model.fit (measure/child.py _fit_keras).

Keras's import: peak RSS (VmHWM) of `import` less that of `torch`, split into file-backed library pages
(the RssFile difference after the steps) and the rest (anonymous). Taken at the peak, not right after the
import: importing Keras loads torch modules (torch._dynamo, torch.fx …) that the torch process loads later
anyway, so the difference right after the import (kept as `after_import`) overstates it. fit's
machinery: peak RSS of `fit` less that of `import`. Each is the median of --runs processes per kind, with
the min–max; a bare probe (python -c 'import torch' vs 'import torch, keras', nothing of trainmem) is
kept beside them. Writes src/trainmem/targets/data/keras_torch_floor.json.

    python benchmarks/calibrate_keras_torch.py [--runs 5]
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem.measure.single_process import run_child  # noqa: E402
from trainmem.setup import TrainingSetup  # noqa: E402

MODEL = "mlp:8-8-2"
OUT = ROOT / "src/trainmem/targets/data/keras_torch_floor.json"
REQUEST = {"model": MODEL, "mode": "rss", "seed": 0,
           "setup": {"batch_size": 1, "optimizer": "adam", "input_shape": "8"}}
# the `import` kind: Keras imported on torch before the child's own run, which then trains the torch model
IMPORT_FIRST = ("import json, sys\nfrom trainmem.frontends.keras.imports import import_keras\nimport_keras('torch')\n"
                "from trainmem.measure import child\nprint(json.dumps(child.run(json.loads(sys.argv[1]))))")
PROBE = ("import {mods}\n"
         "f = {{l.split(':')[0]: int(l.split()[1]) * 1024 for l in open('/proc/self/status') if ':' in l "
         "and l.split(':')[0] in ('VmHWM', 'RssAnon', 'RssFile')}}\nprint(f)")
ENV = {**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT / "src")}


def _stats(values: list[int]) -> dict:
    return {"median": int(statistics.median(values)), "min": min(values), "max": max(values), "runs": values}


def _difference(upper: list[int], lower: list[int]) -> dict:
    """Median difference of two kinds of run, and its range (largest against smallest and back)."""
    return {"median": int(statistics.median(upper) - statistics.median(lower)),
            "min": min(upper) - max(lower), "max": max(upper) - min(lower)}


def _python(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV, check=True)
    return done.stdout.strip().splitlines()[-1]


def child_runs(runs: int, kind: str) -> list[dict]:
    if kind == "import":
        return [json.loads(_python(IMPORT_FIRST, json.dumps(REQUEST))) for _ in range(runs)]
    setup = TrainingSetup.from_mapping(REQUEST["setup"])
    return [run_child(MODEL, setup, "rss", keras_backend="torch" if kind == "fit" else None) for _ in range(runs)]


def bare_probe(runs: int, mods: str) -> dict:
    probes = [ast.literal_eval(_python(PROBE.format(mods=mods))) for _ in range(runs)]
    return {field: _stats([p[field] for p in probes]) for field in ("VmHWM", "RssAnon", "RssFile")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = {kind: child_runs(args.runs, kind) for kind in ("torch", "import", "fit")}
    peak = {kind: [r["peak_rss_bytes"] for r in rs] for kind, rs in runs.items()}
    file_end = {kind: [r["rss_after_steps"]["rss_file"] for r in rs] for kind, rs in runs.items()}
    importing = _difference(peak["import"], peak["torch"])
    import_file = _difference(file_end["import"], file_end["torch"])["median"]
    fit = _difference(peak["fit"], peak["import"])
    total = _difference(peak["fit"], peak["torch"])
    import torch  # the versions; keras's without importing it (this process has no KERAS_BACKEND)
    from importlib.metadata import version

    data = {
        "torch": torch.__version__, "keras": version("keras"), "numpy": version("numpy"),
        "python": platform.python_version(), "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
        "date": datetime.date.today().isoformat(), "runs": args.runs, "model": MODEL,
        "command": f"python benchmarks/calibrate_keras_torch.py --runs {args.runs}",
        "keras_import_anon_bytes": importing["median"] - import_file, "keras_import_file_bytes": import_file,
        "keras_fit_machinery_bytes": fit["median"], "keras_import": importing, "keras_fit_machinery": fit,
        "keras_total_bytes": importing["median"] + fit["median"], "keras_total_min": total["min"],
        "keras_total_max": total["max"], "keras_total_direct": total,
        "peak": {kind: _stats(values) for kind, values in peak.items()},
        "rss_file_after_steps": {kind: _stats(values) for kind, values in file_end.items()},
        "after_import": {kind: {"anon": _stats([r["rss_after_torch"] - r["rss_file_after_torch"] for r in rs]),
                                "file": _stats([r["rss_file_after_torch"] for r in rs])} for kind, rs in runs.items()},
        "bare_import": {"torch": bare_probe(args.runs, "torch"),
                        "torch+keras": bare_probe(args.runs, "torch, keras")},
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    mib = 2**20
    print(f"keras import: {data['keras_import_anon_bytes'] / mib:.1f} MiB anonymous + {import_file / mib:.1f} MiB "
          f"file-backed ({importing['min'] / mib:.1f}–{importing['max'] / mib:.1f} in all); fit machinery "
          f"{fit['median'] / mib:.1f} MiB ({fit['min'] / mib:.1f}–{fit['max'] / mib:.1f}); total "
          f"{data['keras_total_bytes'] / mib:.1f} MiB ({total['min'] / mib:.1f}–{total['max'] / mib:.1f})")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
