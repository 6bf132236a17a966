"""`trainmem measure`: the same setup run for real in fresh processes, beside the estimate.

Two kinds of child process (measure/child.py): `tensors` runs the steps under the profiler and sums
its memory events (which include kernel-internal buffers); `rss` runs without the profiler and reads
VmHWM. RSS varies a few percent run to run, so `runs` > 1 reports the median.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainmem.devices import available_bytes
from trainmem.errors import MeasureError, ModelRefError
from trainmem.progress import Progress
from trainmem.setup import TrainingSetup
from trainmem.units import format_bytes


def run_child(model_ref: str, setup: TrainingSetup, mode: str, timeout: float = 1800,
              keras_backend: str | None = None) -> dict[str, Any]:
    """One measured run in a fresh process. With `keras_backend` the child imports Keras on that backend before
    torch (Keras takes its backend at its first import) and runs the Keras model's own model.fit."""
    request = {"model": model_ref, "setup": setup.to_dict(), "mode": mode, "seed": 0}
    if keras_backend is not None:
        request["keras_backend"] = keras_backend
    src = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, "-m", "trainmem.measure.child", json.dumps(request)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise MeasureError(f"expected the measured run to finish within {timeout:.0f} s, it did not",
                           where=model_ref) from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MeasureError(f"the measured run died (exit {done.returncode}): {tail}", where=model_ref)
    result = json.loads(lines[-1])
    if "error" in result:
        raise MeasureError(f"the measured run failed: {result['error']}", where=model_ref)
    return result


def _relative(estimated: int, measured: int) -> float:
    return (estimated - measured) / measured if measured else 0.0


@dataclasses.dataclass
class Comparison:
    estimate: Any
    tensors: dict[str, Any]
    rss_runs: list[dict[str, Any]]

    @property
    def measured_tensor_bytes(self) -> int:
        return int(self.tensors["tensor_peak_bytes"])

    @property
    def measured_process_bytes(self) -> int:
        return int(statistics.median(r["peak_rss_bytes"] for r in self.rss_runs))

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        return {
            "estimate": est.to_dict(),
            "measured": {"tensor_bytes": self.measured_tensor_bytes, "process_bytes": self.measured_process_bytes,
                         "process_bytes_runs": [r["peak_rss_bytes"] for r in self.rss_runs],
                         "torch": self.tensors["torch"], "cpu_capability": self.tensors["cpu_capability"],
                         "threads": self.tensors["threads"]},
            "error": {"tensor_bytes": _relative(est.tensor_bytes, self.measured_tensor_bytes),
                      "process_bytes": _relative(est.process_bytes, self.measured_process_bytes)},
        }

    def __str__(self) -> str:
        est = self.estimate
        rows = [("tensors (peak live storage)", est.tensor_bytes, self.measured_tensor_bytes),
                ("process (peak RSS)", est.process_bytes, self.measured_process_bytes)]
        lines = [f"trainmem measure — {est.model_name}, batch {est.setup.batch_size}, {est.setup.optimizer}, "
                 f"{est.setup.precision} (torch {self.tensors['torch']}, {self.tensors['cpu_capability']}, "
                 f"{self.tensors['threads']} threads)", "",
                 f"  {'':28s} {'estimated':>12s} {'measured':>12s} {'error':>8s}"]
        for name, estimated, measured in rows:
            lines.append(f"  {name:28s} {format_bytes(estimated):>12s} {format_bytes(measured):>12s} "
                         f"{_relative(estimated, measured):>+8.2%}")
        if len(self.rss_runs) > 1:
            lines.append(f"  RSS over {len(self.rss_runs)} runs: "
                         + ", ".join(format_bytes(r["peak_rss_bytes"]) for r in self.rss_runs))
        return "\n".join(lines)


def rss_run_steps(setup: TrainingSetup, est: Any = None) -> int:
    """The steps an RSS run runs: as many as the estimate's heap stands for (--steps N, else the long run its replay
    stands for: alloc/steady_state.py), never fewer than the traced steps; the profiled tensor run keeps those."""
    heap_steps = est.coverage.get("heap_steps") if est is not None else None
    return max(setup.steps, setup.run_steps or heap_steps or setup.steps)


def measure(model_ref: Any, setup: TrainingSetup, *, force: bool = False, runs: int = 1, depth: int = 2,
            framework: str = "auto", keras_backend: str | None = None) -> Comparison:
    """The estimate beside real runs of the same setup. `framework` and `keras_backend` are the estimate's
    (--framework, --keras-backend): a Keras model on the torch backend is measured running its own model.fit."""
    from trainmem.estimate import estimate

    if not isinstance(model_ref, str):
        raise ModelRefError("expected a model reference string (a module object cannot be rebuilt in a fresh "
                            "process)", where="measure")
    if runs < 1:
        raise MeasureError(f"expected --runs of at least 1, got {runs}", where="--runs")
    est = estimate(model_ref, setup=setup, depth=depth, framework=framework, keras_backend=keras_backend)
    free = available_bytes()
    if free is not None and est.process_bytes > free and not force:
        raise MeasureError(f"expected the run to fit in available memory ({format_bytes(free)}), the estimate is "
                           f"{format_bytes(est.process_bytes)}; use --force to run anyway", where="measure")
    child_backend = est.resolved.get("keras_backend") if est.resolved.get("framework") == "keras" else None
    rss_setup = dataclasses.replace(setup, steps=rss_run_steps(setup, est))
    with Progress("measure: runs", unit="run") as bar:  # each run a fresh process, seconds each
        bar.total(runs + 1)
        rss_runs = []
        for _ in range(runs):
            rss_runs.append(run_child(model_ref, rss_setup, "rss", keras_backend=child_backend))
            bar.advance()
        tensors = run_child(model_ref, setup, "tensors", keras_backend=child_backend)
        bar.advance()
    return Comparison(est, tensors, rss_runs)
