"""Measure what a TensorFlow CPU training process holds besides the model's tensors, for targets/tf/cpu_process.py.

Every figure comes from fresh processes running measure/keras_child.py (import tensorflow and keras,
build, compile, model.fit on numpy arrays, VmHWM), on synthetic models from benchmarks/keras_models.py
that are not in the accuracy table:

1. import floor: RSS after `import tensorflow; import keras`, anonymous and file-backed apart (median of
   every run below, ≥ 5 per model);
2. graph sweep: dense_stack_{0,24,48,96} (Dense(8) stacks; train-step ops as trace_keras counts them; KB of tensors),
   batch 1, one step: peak RSS over the same run's import RSS, fitted as machinery + per_op × ops by least
   squares. The intercept is what fit adds for a graph of no ops (tf.function tracing, the data adapter,
   callbacks, thread pools, kernels' library pages); the slope is what each op of the traced train step
   costs (the Python FuncGraph objects, GraphDef, the optimized graph, one OpKernel each);
3. data sweep: wide_input (Dense(2) on 4,096 features) at batch 256 for 1 and 64 steps and at batch 2048
   for 8 steps, with RSS recorded when fit has made its dataset (on_train_begin) and when the first step
   is about to run (on_train_batch_begin(0), before the step's graph is traced). Measured here: fit
   converts the numpy arrays into the dataset's tensor and one more copy, so at on_train_begin RSS holds
   the dataset three times (the arrays and two copies), and one copy is gone by the first step: the
   differences between 1 and 64 steps give `setup_factor` and `train_factor` (times the dataset's bytes
   held at each point, the user's arrays included); 2048 × 8 against 256 × 64 (the same dataset) gives
   the batches tf.data holds at the end of a step (the next one gathered while the step ran), and `setup_base` is what fit's set-up adds besides the data.
   With oneDNN on, the MklCPUAllocator's pool keeps the pages of the step's tensors (the batch it consumed
   included) at the end of a step, and the estimate replays those itself (targets/tf/cpu_process.py): the batches held
   are then what the rise leaves beyond the replayed pool's own difference between the two points.
Each path (--onednn on|off: TF_ENABLE_ONEDNN_OPTS=1/0 in every measured process) has its own constants: the
run replaces the entry of this CPU class (targets/tf/cpu_process.py isa_class) and path in
src/trainmem/targets/data/tf_cpu_floor.json, with the versions, CPU, load and this command, and keeps the others.

    python benchmarks/calibrate_tf_cpu.py [--runs 5] [--onednn on|off]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem.measure.keras_cpu import run_keras_child  # noqa: E402

MODELS = ROOT / "benchmarks" / "keras_models.py"
OUT = ROOT / "src" / "trainmem" / "targets" / "data" / "tf_cpu_floor.json"
SWEEP = ("dense_stack_0", "dense_stack_24", "dense_stack_48", "dense_stack_96")
DATA_POINTS = (("wide_input", 256, 1), ("wide_input", 256, 64), ("wide_input", 2048, 8))
STAGES = ("compile", "data", "train_begin", "first_batch_begin", "batch_end_max")
FEATURES = 4096  # wide_input's features: a sample is 4,096 float32 and one int32 label


def step_op_counts(names) -> dict[str, int]:
    """Ops of the train step as the estimate counts them: sum(op_counts) of trace_keras's TraceResult, so that
    the per-op cost is in the tracer's own unit (a change in what the tracer counts needs a new fit)."""
    sys.path.insert(0, str(MODELS.parent))
    import keras_models

    from trainmem.setup import TrainingSetup
    from trainmem.trace.tf.keras_graph import trace_keras

    setup = TrainingSetup(batch_size=1, steps=1)
    return {name: sum(trace_keras(getattr(keras_models, name), setup, name=name).op_counts.values()) for name in names}


def measure(name: str, batch: int, steps: int, runs: int, timeline: bool = False) -> list[dict]:
    request = {"model": f"{MODELS}:{name}", "batch_size": batch, "steps": steps, "optimizer": "adam",
               "loss": None, "input_max": None, "seed": 0, "timeline": timeline}
    results = [run_keras_child(request) for _ in range(runs)]
    return [{"peak": r["peak_rss_bytes"], "import_rss": r["stages"]["import_keras"]["VmRSS"],
             "import_anon": r["stages"]["import_keras"]["RssAnon"],
             "import_file": r["stages"]["import_keras"]["RssFile"],
             "file_at_peak": r["fit_samples"]["file_at_max"], "load": r["environment"]["load_average"],
             "stages": {k: r["stages"][k]["VmRSS"] for k in STAGES if k in r["stages"]},
             "environment": r["environment"]} for r in results]


def least_squares(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Intercept and slope of the ordinary least-squares line through (xs, ys)."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def increment(run: dict) -> int:
    return run["peak"] - run["import_rss"]


def pool_rise(onednn: bool) -> float:
    """With oneDNN on: the estimate's replayed tensor pages (the pool's, without batches held ahead) at the
    data sweep's batch-2048 point over its batch-256 point; 0 with oneDNN off (glibc gives those back)."""
    if not onednn:
        return 0.0
    sys.path.insert(0, str(MODELS.parent))
    import keras_models

    from trainmem.setup import TrainingSetup
    from trainmem.targets.tf.cpu_process import tensor_heap
    from trainmem.trace.tf.keras_graph import trace_keras

    heaps = []
    for name, batch, steps in DATA_POINTS[1:]:
        traced = trace_keras(getattr(keras_models, name), TrainingSetup(batch_size=batch, steps=steps), name=name)
        heaps.append(tensor_heap(traced, steps, onednn=True, threads=len(os.sched_getaffinity(0))))
    return float(heaps[1] - heaps[0])


def data_factors(data: dict, replayed: float = 0.0) -> dict:
    """setup_factor, train_factor, setup_base and batches_held from the data sweep's stage RSS; `replayed`: what
    the estimate replays itself of the batch-end rise (pool_rise)."""
    def rise(point, stage) -> float:  # RSS at `stage` over RSS after compile, median over runs
        return statistics.median(r["stages"][stage] - r["stages"]["compile"] for r in data[point])

    sample_bytes = FEATURES * 4 + 8  # float32 features and one int64 label
    (small, large, big_batch) = DATA_POINTS
    extra = sample_bytes * (large[1] * large[2] - small[1] * small[2])
    setup_factor = (rise(large, "train_begin") - rise(small, "train_begin")) / extra
    train_factor = (rise(large, "first_batch_begin") - rise(small, "first_batch_begin")) / extra
    batch_extra = sample_bytes * (big_batch[1] - large[1])
    # at the end of a step its own tensors are freed; what grows with the batch is what tf.data holds (the
    # next batch gathered and prefetched while the step ran)
    batches = (rise(big_batch, "batch_end_max") - rise(large, "batch_end_max") - replayed) / batch_extra
    return {"setup_factor": round(setup_factor, 3), "train_factor": round(train_factor, 3),
            "setup_base_bytes": int(rise(small, "train_begin") - setup_factor * sample_bytes * small[1] * small[2]),
            "batches_held": round(max(0.0, batches), 2), "sample_bytes": sample_bytes}


def graph_sweep(runs: int, ops: dict) -> tuple[list[dict], list[dict]]:
    sweep = {name: measure(name, 1, 1, runs) for name in SWEEP}
    rows = [{"model": name, "batch": 1, "steps": 1, "step_ops": ops[name],
             "increment_median": int(statistics.median(increment(r) for r in sweep[name])),
             "increments": [increment(r) for r in sweep[name]],
             "import_anon": [r["import_anon"] for r in sweep[name]], "import_file": [r["import_file"] for r in sweep[name]],
             "file_rise": [r["file_at_peak"] - r["import_file"] for r in sweep[name]],
             "load": [r["load"] for r in sweep[name]]} for name in SWEEP]
    return rows, [run["environment"] for runs_ in sweep.values() for run in runs_]


def _flag(args) -> str:
    return f" --onednn {args.onednn}" if args.onednn else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--reuse-sweep", action="store_true",
                        help="keep the graph sweep already in this CPU class and path's entry (its own command is kept)")
    parser.add_argument("--onednn", choices=("on", "off"), help="TF_ENABLE_ONEDNN_OPTS=1/0 in every measured "
                        "process (default: TensorFlow's own choice here)")
    args = parser.parse_args()
    from trainmem.targets.tf.cpu_process import isa_class, onednn_choice

    if args.onednn:
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if args.onednn == "on" else "0"
    onednn, isa = onednn_choice().on, isa_class()
    ops = step_op_counts([*SWEEP, "wide_input"])
    doc = json.loads(OUT.read_text()) if OUT.exists() else {"entries": []}
    old = next((e for e in doc["entries"] if e["isa"] == isa and bool(e["onednn"]) == onednn), {})
    if args.reuse_sweep and old.get("sweep"):
        sweep, environments = old["sweep"], [old]
        sweep_command = old.get("sweep_command", old.get("command"))
    else:
        sweep, environments = graph_sweep(args.runs, ops)
        sweep_command = f"python benchmarks/calibrate_tf_cpu.py --runs {args.runs}" + _flag(args)
    for row in sweep:  # the tracer's count now, whatever count the sweep was stored with
        row["step_ops"] = ops[row["model"]]
    xs = [row["step_ops"] for row in sweep for _ in row["increments"]]
    ys = [value for row in sweep for value in row["increments"]]
    machinery, per_op = least_squares(xs, ys)
    runs = max(3, args.runs - 2)
    data = {point: measure(*point, runs, timeline=True) for point in DATA_POINTS}
    env = data[DATA_POINTS[0]][0]["environment"]
    if bool(env["onednn"]) != onednn:
        raise SystemExit(f"expected the measured processes to run with oneDNN {'on' if onednn else 'off'}, "
                         f"TensorFlow reported IsMklEnabled() {env['onednn']}")
    every_import = [r for rows in data.values() for r in rows]
    anon = [v for row in sweep for v in row.get("import_anon", [])] + [r["import_anon"] for r in every_import]
    files = [v for row in sweep for v in row.get("import_file", [])] + [r["import_file"] for r in every_import]
    result = {
        "isa": isa, "tensorflow": env["tensorflow"], "keras": env["keras"], "numpy": env["numpy"], "python": env["python"],
        "cpu_model": env["cpu_model"], "nproc": env["nproc"], "onednn": env["onednn"],
        "inter_op_threads": env["inter_op_threads"], "intra_op_threads": env["intra_op_threads"],
        "date": datetime.date.today().isoformat(),
        "command": f"python benchmarks/calibrate_tf_cpu.py --runs {args.runs}" + _flag(args)
                   + (" --reuse-sweep" if args.reuse_sweep else ""),
        "sweep_command": sweep_command,
        "load_average_median": statistics.median(r["load"] for r in every_import),
        "import_anon_bytes": int(statistics.median(anon)), "import_file_bytes": int(statistics.median(files)),
        "import_file_min": min(files), "import_file_max": max(files),
        "fit_machinery_bytes": int(machinery), "per_op_bytes": int(round(per_op)),
        **data_factors(data, pool_rise(onednn)),
        "sweep": sweep,
        "data_sweep": [{"model": name, "batch": batch, "steps": steps, "step_ops": ops[name],
                        "stages_rss": [r["stages"] for r in data[(name, batch, steps)]],
                        "increments": [increment(r) for r in data[(name, batch, steps)]]}
                       for name, batch, steps in DATA_POINTS],
    }
    others = [e for e in doc["entries"] if not (e["isa"] == isa and bool(e["onednn"]) == onednn)]
    OUT.write_text(json.dumps({**doc, "entries": others + [result]}, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("sweep", "data_sweep")}, indent=1))


if __name__ == "__main__":
    main()
