"""`trainmem measure --framework keras` on the CPU: real `model.fit` runs of a Keras model (TensorFlow
backend) in fresh processes (measure/keras_child.py), their peak RSS as median and spread.

RSS varies run to run (page cache residency of TensorFlow's libraries, where glibc places the heap),
so `runs` fresh processes are measured and the median is the figure; min and max are the spread.
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

from trainmem.errors import MeasureError, ModelRefError
from trainmem.setup import TrainingSetup

# Run as a script by its path, not with -m: `-m trainmem.measure.keras_child` would import the trainmem package
# first (about 9 MB of RSS here, measured: VmHWM of `import trainmem.measure` 19.3 MB vs 10.5 MB for the child's
# own imports), which a user's training process does not hold. -P keeps the script's folder (measure/, with its
# cuda.py) off sys.path, where it could shadow a module TensorFlow imports.
CHILD = Path(__file__).resolve().with_name("keras_child.py")


def child_request(model_ref: str, setup: TrainingSetup, steps: int | None = None) -> dict[str, Any]:
    """What the child needs, as plain values: it imports nothing of trainmem."""
    path, sep, factory = model_ref.rpartition(":")
    if not sep or not path.endswith(".py") or not factory.isidentifier():
        raise ModelRefError(f"expected a Keras factory reference file.py:factory to measure, got {model_ref!r}",
                            where="measure --framework keras")
    if not Path(path).is_file():
        raise ModelRefError(f"expected an existing file, got {path!r}", where="measure --framework keras")
    input_max = setup.inputs[0].max_value if setup.inputs and setup.inputs[0].is_integer else None
    return {"model": str(Path(path).resolve()) + ":" + factory, "batch_size": setup.batch_size,
            "steps": steps or setup.steps, "optimizer": str(setup.optimizer),
            "loss": str(setup.loss) if setup.loss else None, "input_max": input_max, "seed": 0}


def run_keras_child(request: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """One fresh process; its JSON result, or MeasureError with the child's last line."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}
    try:
        done = subprocess.run([sys.executable, "-P", str(CHILD), json.dumps(request)], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise MeasureError(f"expected the measured fit to finish within {timeout:.0f} s, it did not",
                           where=request["model"]) from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MeasureError(f"the measured fit died (exit {done.returncode}): {tail}", where=request["model"])
    result = json.loads(lines[-1])
    if "error" in result:
        raise MeasureError(f"the measured fit failed: {result['error']}", where=request["model"])
    return result


@dataclasses.dataclass(frozen=True)
class KerasMeasurement:
    """Medians over fresh runs; `runs` keeps each run's whole result."""

    model_ref: str
    batch_size: int
    steps: int
    runs: tuple[dict[str, Any], ...]

    def _median(self, pick) -> int:
        return int(statistics.median(pick(run) for run in self.runs))

    @property
    def peak_rss_bytes(self) -> int:
        return self._median(lambda r: r["peak_rss_bytes"])

    @property
    def spread(self) -> tuple[int, int]:
        peaks = [r["peak_rss_bytes"] for r in self.runs]
        return min(peaks), max(peaks)

    def stage_median(self, stage: str, field: str = "VmRSS") -> int:
        """Median of a /proc/self/status field after a stage (start, import_tensorflow, build, compile, data, fit)."""
        return self._median(lambda r: r["stages"][stage][field])

    @property
    def anon_at_peak(self) -> int:
        return self._median(lambda r: r["fit_samples"]["anon_at_max"])

    @property
    def file_at_peak(self) -> int:
        return self._median(lambda r: r["fit_samples"]["file_at_max"])

    @property
    def gpu_peak_bytes(self) -> int | None:
        peaks = [r["gpu_peak_bytes"] for r in self.runs if r.get("gpu_peak_bytes") is not None]
        return int(statistics.median(peaks)) if peaks else None

    @property
    def environment(self) -> dict[str, Any]:
        return self.runs[0]["environment"]

    def to_dict(self) -> dict[str, Any]:
        low, high = self.spread
        return {"model": self.model_ref, "batch_size": self.batch_size, "steps": self.steps,
                "peak_rss_bytes": self.peak_rss_bytes, "peak_rss_min": low, "peak_rss_max": high,
                "peak_rss_runs": [r["peak_rss_bytes"] for r in self.runs],
                "rss_after_import": self.stage_median("import_keras"),
                "rss_anon_after_import": self.stage_median("import_keras", "RssAnon"),
                "rss_file_after_import": self.stage_median("import_keras", "RssFile"),
                "rss_anon_at_peak": self.anon_at_peak, "rss_file_at_peak": self.file_at_peak,
                "gpu_peak_bytes": self.gpu_peak_bytes, "environment": self.environment}


def measure_keras(model_ref: str, setup: TrainingSetup, *, runs: int = 3, steps: int | None = None,
                  timeout: float = 900) -> KerasMeasurement:
    """Peak RSS of `runs` fresh processes that fit the model for `steps` (default setup.steps) steps on
    numpy data of steps × batch samples."""
    if runs < 1:
        raise MeasureError(f"expected --runs of at least 1, got {runs}", where="--runs")
    request = child_request(model_ref, setup, steps)
    results = tuple(run_keras_child(request, timeout) for _ in range(runs))
    return KerasMeasurement(model_ref, setup.batch_size, request["steps"], results)
