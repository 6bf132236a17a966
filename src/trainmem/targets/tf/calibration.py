"""TensorFlow's import floor measured on this machine by `trainmem calibrate`, and read back by the Keras estimate.

Of the constants of targets/tf/cpu_process.py only the import floor moves between machines: the calibration of an
AMD EPYC Zen 5 (benchmarks/calibrate_tf_cpu.py, 2026-12-06) matched the Intel Xeon's (AMX) within 0.1% in fit's
machinery (26.6 vs 26.4 MB) and the cost per op (51,491 vs 51,496 B), and its import floor matched too once the
library files were in the same page-cache state; the file-backed part is what the page cache decides
(benchmarks/library_pages.py). So `trainmem calibrate` measures what `import tensorflow, keras` keeps resident in
fresh processes (anonymous and file-backed apart, a few seconds each) when TensorFlow is installed, and an estimate
on this machine under the same TensorFlow takes that floor from it, the rest from the bundled entry, and says so.

Kept beside the torch calibrations in the user's cache directory (targets/calibrations.py cache_dir), keyed by the
machine as /proc/cpuinfo names it (vendor, family/model), the CPU count and the TensorFlow version: no torch needed.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

USER_FILE = "tf_cpu_runtime.json"
IMPORT = "import tensorflow, keras"
_PROBE = ("\nfor line in open('/proc/self/status'):\n    if line.startswith(('RssFile:', 'RssAnon:')): "
          "print(line.split()[0], line.split()[1])")


def import_resident(code: str, timeout: float = 300) -> dict[str, int]:
    """RssFile and RssAnon (bytes) of a fresh interpreter after running `code`, TensorFlow's logging silenced."""
    out = subprocess.run([sys.executable, "-c", code + _PROBE], capture_output=True, text=True, check=True,
                         timeout=timeout, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}).stdout.splitlines()
    fields = dict(line.split() for line in out if line.startswith(("RssFile:", "RssAnon:")))
    return {"file": int(fields["RssFile:"]) * 1024, "anon": int(fields["RssAnon:"]) * 1024}


def distribution_version(package: str) -> str | None:
    """The installed version of `package`, or of `package`-cpu (tensorflow installs as tensorflow-cpu); None where
    neither is installed."""
    for distribution in (package, f"{package}-cpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None


def installed_versions() -> dict[str, str] | None:
    """{tensorflow, keras} versions, None where TensorFlow is not installed."""
    found = {package: number for package in ("tensorflow", "keras") if (number := distribution_version(package))}
    return found if "tensorflow" in found else None


def this_machine() -> dict[str, object]:
    """The machine as /proc/cpuinfo and the OS name it, without torch."""
    from trainmem.targets.cpu_info import proc_cpuinfo

    _, vendor, model_id = proc_cpuinfo()
    return {"vendor": vendor, "model_id": model_id, "cpus": os.cpu_count() or 1}


def measure(runs: int = 3) -> dict | None:
    """This machine's TensorFlow import floor from `runs` fresh processes (medians; the file-backed range), or None
    where TensorFlow is not installed."""
    versions = installed_versions()
    if versions is None:
        return None
    seen = [import_resident(IMPORT) for _ in range(max(1, runs))]
    files = [run["file"] for run in seen]
    return {"machine": this_machine(), **versions, "import_anon_bytes": int(statistics.median(r["anon"] for r in seen)),
            "import_file_bytes": int(statistics.median(files)), "import_file_min": min(files),
            "import_file_max": max(files), "runs": len(seen), "measured": datetime.date.today().isoformat()}


def store(entry: dict, folder: Path) -> Path:
    """Adds `entry` to the folder's TensorFlow calibrations, replacing one of the same machine and TensorFlow."""
    path = folder / USER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = [old for old in stored(folder) if (old["machine"], old["tensorflow"]) != (entry["machine"], entry["tensorflow"])]
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"calibrations": kept + [entry]}, indent=1) + "\n")
    temporary.replace(path)
    return path


def stored(folder: Path) -> list[dict]:
    try:
        data = json.loads((folder / USER_FILE).read_text())
    except (OSError, ValueError):
        return []
    entries = data.get("calibrations") if isinstance(data, dict) else None
    return [entry for entry in entries or [] if isinstance(entry, dict) and isinstance(entry.get("machine"), dict)
            and all(isinstance(entry.get(key), int) for key in ("import_anon_bytes", "import_file_bytes",
                                                                "import_file_min", "import_file_max"))]


def with_own_floor(floor: dict, folder: Path, tensorflow: str | None) -> dict:
    """The bundled entry `floor` with this machine's measured import floor in place of its own, where `trainmem
    calibrate` measured one here under this TensorFlow; `floor` as it is otherwise."""
    here = this_machine()
    own = [entry for entry in stored(folder) if entry["machine"] == here and entry.get("tensorflow") == tensorflow]
    if not own:
        return floor
    entry = own[-1]
    keys = ("import_anon_bytes", "import_file_bytes", "import_file_min", "import_file_max")
    return {**floor, **{key: entry[key] for key in keys}, "own_import_floor": entry["measured"]}
