"""`trainmem measure --framework keras` on the CPU: the estimate beside real `model.fit` runs
(measure/keras_cpu.py measure_keras: fresh processes, peak RSS as median and spread), with the error.

The measured runs fit the model for the setup's steps on synthetic numpy data of steps × batch samples,
which is the dataset the CPU estimate assumes (targets/tf/cpu_process.py), so the two answer the same question.
The measured process runs a factory file (measure/keras_child.py) and imports nothing of trainmem, so its
RSS is what a user's script shows: `mlp:` and `model.keras` are measured through a factory file written
here with Keras alone (the mlp's layers from frontends/keras/builders.py; the .keras file's config.json
rebuilt under safe_mode, fresh weights: the same memory as the file's own).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from trainmem.setup import TrainingSetup
from trainmem.units import format_bytes


@dataclasses.dataclass(frozen=True)
class KerasMeasured:
    estimate: Any  # estimate/result.py Estimate, with its Keras section
    measured: Any  # measure/keras_cpu.py KerasMeasurement

    @property
    def error(self) -> float:
        """Estimated process bytes over the measured median, minus 1 (negative: the estimate is low)."""
        return self.estimate.process_bytes / self.measured.peak_rss_bytes - 1

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        return {"model": est.model_name, "framework": "keras", "keras_backend": "tensorflow",
                "estimate": {"process_bytes": est.process_bytes, "process_bytes_high": est.process_bytes_high,
                             "tensor_bytes": est.tensor_bytes, "process": dict(est.process_parts)},
                "measured": self.measured.to_dict(), "error": self.error,
                "within_high": self.measured.peak_rss_bytes <= est.process_bytes_high}

    def __str__(self) -> str:
        est, m = self.estimate, self.measured
        low, high = m.spread
        lines = [f"trainmem measure — {est.model_name} (Keras on TensorFlow, CPU): batch {m.batch_size}, "
                 f"{m.steps} model.fit steps, {len(m.runs)} fresh process(es)",
                 f"  estimated peak RSS  {format_bytes(est.process_bytes)} (high end {format_bytes(est.process_bytes_high)})",
                 f"  measured peak RSS   {format_bytes(m.peak_rss_bytes)} median (spread {format_bytes(low)}–"
                 f"{format_bytes(high)})",
                 f"  error               {self.error:+.1%} of the measured median",
                 f"  measured at the peak: anonymous {format_bytes(m.anon_at_peak)}, file-backed "
                 f"{format_bytes(m.file_at_peak)} (library pages)"]
        if m.gpu_peak_bytes is not None:
            lines.append(f"  GPU get_memory_info peak {format_bytes(m.gpu_peak_bytes)} (the runs found a GPU)")
        return "\n".join(lines)


def measure_keras_beside_estimate(model_ref: str, setup: TrainingSetup, *, runs: int = 1,
                                  force: bool = False) -> KerasMeasured:
    """Estimate first (a model that cannot be traced is not run); then `runs` real fits in fresh processes.
    Without `force`, a run the estimate says does not fit this machine's memory is refused."""
    from trainmem.errors import MeasureError
    from trainmem.estimate.orchestrate import estimate
    from trainmem.measure.keras_cpu import measure_keras

    est = estimate(model_ref, setup=setup, device="cpu", framework="keras")
    if not est.fits and not force:
        raise MeasureError(f"expected a run that fits this machine's memory, the estimate says "
                           f"{format_bytes(est.process_bytes)} (--force runs it anyway)", where=model_ref)
    with tempfile.TemporaryDirectory(prefix="trainmem-keras-") as directory:
        factory = factory_to_measure(model_ref.strip(), setup, Path(directory))
        measured = measure_keras(factory, setup, runs=runs)
    return KerasMeasured(est, dataclasses.replace(measured, model_ref=model_ref))


def factory_to_measure(ref: str, setup: TrainingSetup, directory: Path) -> str:
    """`ref` as a file.py:factory the measuring child can run: as given, or written into `directory`."""
    from trainmem.errors import MeasureError
    from trainmem.frontends import Kind, reference_kind
    from trainmem.frontends.framework import is_keras_file

    kind = reference_kind(ref)
    if kind == Kind.PYTHON:
        return ref
    if kind == Kind.MLP:
        from trainmem.frontends.keras.builders import mlp_factory_source
        from trainmem.frontends.mlp import parse_widths

        text = mlp_factory_source(parse_widths(ref), str(setup.activation), setup.dropout)
    elif is_keras_file(ref):
        from trainmem.frontends.keras.keras_file import read_keras_config

        config = {key: value for key, value in read_keras_config(ref).items() if key != "compile_config"}
        (directory / "config.json").write_text(json.dumps(config))
        text = ("import json\nimport keras\n\n\ndef model():\n    with open(__file__.rpartition('/')[0] + "
                "'/config.json') as handle:\n        return keras.saving.deserialize_keras_object(json.load(handle), "
                "safe_mode=True)\n")
    else:
        raise MeasureError(f"expected file.py:factory, mlp:… or model.keras to measure a Keras model, got {ref!r}",
                           where="measure --framework keras")
    (directory / "measured_model.py").write_text(text)
    return f"{directory / 'measured_model.py'}:model"
