"""What Keras 3 on the torch backend adds to a CPU training process beyond torch's own floor.

The torch floor (targets/cpu_runtime.py) is a process that imports torch and trains with trainmem's loop.
A Keras model on the torch backend (frontends/keras/torch_backend.py) trains in a process that also imports Keras
and what Keras imports (numpy, ml_dtypes, optree, h5py, rich, namex …) and runs model.fit (Keras's
TorchTrainer, its data adapter over a torch DataLoader, callbacks, the progress bar, the metrics tracker).
`benchmarks/calibrate_keras_torch.py` measures both processes the way `trainmem measure` does, with the
same 90-parameter model, and writes the difference to targets/data/keras_torch_floor.json: Keras's import
as file-backed library pages and anonymous memory, and fit's machinery (the rest of the peak difference).

The parts apply to the CPU target only: on a GPU the process figure is nvidia-smi's, where Keras's host
memory does not appear.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data" / "keras_torch_floor.json"

PARTS = {"keras_import_anon": "keras_import_anon_bytes", "keras_import_file": "keras_import_file_bytes",
         "keras_fit_machinery": "keras_fit_machinery_bytes"}


def applies(source) -> bool:
    """Whether the model source is a Keras model traced on the torch backend (frontends/keras/torch_backend.py
    resolve_keras_torch sets resolved {"framework": "keras", "keras_backend": "torch"})."""
    resolved = getattr(source, "resolved", None) or {}
    return resolved.get("framework") == "keras" and resolved.get("keras_backend") == "torch"


def load() -> dict:
    return json.loads(DATA.read_text())


def keras_parts(floor: dict | None = None) -> tuple[dict[str, int], int, list[str]]:
    """The named process parts, the measured spread above their sum (largest Keras process against the
    smallest torch one, less the median difference) and the warnings that state them."""
    floor = floor or load()
    parts = {name: max(0, int(floor[key])) for name, key in PARTS.items()}
    spread = max(0, int(floor["keras_total_max"]) - int(floor["keras_total_bytes"]))
    mib = 2**20
    said = [f"Keras on torch adds to the CPU process's peak RSS {parts['keras_import_anon'] / mib:.0f} MiB anonymous + "
            f"{parts['keras_import_file'] / mib:.0f} MiB library pages (file-backed) for importing Keras and "
            f"{parts['keras_fit_machinery'] / mib:.0f} MiB for model.fit's machinery to the torch floor: "
            f"{floor['keras_total_bytes'] / mib:.0f} MiB in all (median of {floor['runs']} fresh processes, "
            f"{floor['keras_total_min'] / mib:.0f}–{floor['keras_total_max'] / mib:.0f} MiB), measured with "
            f"Keras {floor['keras']}, torch {floor['torch']}, {floor['cpu_capability']}, {floor['threads']} threads "
            "(targets/data/keras_torch_floor.json)"]
    running = getattr(sys.modules.get("keras"), "__version__", None)
    if running and running != floor["keras"]:
        said.append(f"this process runs Keras {running}: Keras's part was measured with {floor['keras']} "
                    "and may differ by some MiB")
    return parts, spread, said
