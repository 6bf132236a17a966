"""Where the CPU process facts come from: this machine's own calibration, else a bundled machine's.

The process floor and the kernel families' and libraries' increments (targets/cpu_runtime.py) are
measured, not derived, and they move with the machine: the same torch 2.13.0 CPU build floors at
317,030,400 B on an AMD EPYC and at 323,362,816 B on an Intel Xeon with AMX (2 threads each; the
Intel figures in targets/data/cpu_runtime.json came from benchmarks/calibrate_cpu.py run there).
`trainmem calibrate` measures them on the user's machine (trainmem/calibrate.py) and stores them in the
user's cache directory; from then on every estimate on that machine uses them and says so. Without a
calibration of its own, an estimate takes the bundled entry of the nearest torch build measured on the
most similar CPU (same vendor, instruction set and thread count first, then the same CPU model) and widens its high end by the
spread between the bundled machines of that build: how far the floor moved between the CPUs measured.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from trainmem.targets.cpu_info import CpuInfo

USER_FILE = "cpu_runtime.json"
ENV_DIR = "TRAINMEM_CACHE_DIR"  # overrides the cache directory (tests, shared clusters)


def cache_dir() -> Path:
    """The user's cache directory for trainmem: $TRAINMEM_CACHE_DIR, else platformdirs' user cache dir,
    else $XDG_CACHE_HOME/trainmem or ~/.cache/trainmem (what platformdirs answers on Linux)."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    try:
        import platformdirs
    except ImportError:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "trainmem"
    return Path(platformdirs.user_cache_dir("trainmem", appauthor=False))


def machine_of(cpu: CpuInfo) -> dict[str, Any]:
    """The facts that tell two machines' calibrations apart: vendor, capability, AVX512-BF16, AMX, threads."""
    return {"vendor": getattr(cpu, "vendor", "unknown"), "capability": cpu.capability,
            "avx512_bf16": bool(cpu.avx512_bf16), "amx": bool(getattr(cpu, "amx", False)), "threads": cpu.threads}


def user_calibrations() -> list[dict]:
    """Entries `trainmem calibrate` stored on this machine; none when there is no readable file."""
    path = cache_dir() / USER_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    entries = data.get("calibrations") if isinstance(data, dict) else None
    return [entry for entry in entries or [] if isinstance(entry, dict) and _well_formed(entry)]


def _well_formed(entry: dict) -> bool:
    return (isinstance(entry.get("floor_bytes"), int) and isinstance(entry.get("torch"), str)
            and isinstance(entry.get("machine_facts"), dict))


def store(entry: dict) -> Path:
    """Adds `entry` to this machine's calibrations, replacing one of the same torch build and machine."""
    path = cache_dir() / USER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = [old for old in user_calibrations()
            if (old["torch"], old["machine_facts"]) != (entry["torch"], entry["machine_facts"])]
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"calibrations": kept + [entry]}, indent=1) + "\n")
    temporary.replace(path)
    return path


@dataclasses.dataclass(frozen=True)
class MachineChoice:
    entry: dict
    own: bool  # measured on this machine by `trainmem calibrate`
    spread: int  # bytes the high end widens by: how far the bundled machines of this build differ
    said: str  # one line for the estimate: where the figures come from


def machine_spread(entries: list[dict]) -> tuple[int, str]:
    """The largest difference of floors between bundled machines measuring one torch build, over all builds
    measured on more than one machine, and the build it was seen on."""
    builds: dict[str, list[int]] = {}
    for entry in entries:
        builds.setdefault(entry["torch"], []).append(int(entry["floor_bytes"]))
    spreads = [(max(floors) - min(floors), torch) for torch, floors in builds.items() if len(floors) > 1]
    return max(spreads, default=(0, ""))


def choose_machine(entries: list[dict], cpu: CpuInfo, torch_text: str,
                   spread: tuple[int, str] = (0, "")) -> MachineChoice:
    """Among bundled entries of one torch build, the one measured on the most similar CPU; a user
    calibration of this machine and build wins over them all. `spread`: machine_spread of every bundled
    entry, which the high end allows when the figures are another machine's."""
    here = machine_of(cpu)
    for own in user_calibrations():
        if own["torch"] == torch_text and own["machine_facts"] == here:
            return MachineChoice(own, True, 0, f"calibrated on this machine, {own.get('measured', 'date unknown')} "
                                                "(trainmem calibrate)")
    same_build = [entry for entry in entries if entry["torch"] == entries[0]["torch"]] if entries else []

    model_id = getattr(cpu, "model_id", "")

    def distance(entry: dict) -> tuple[int, ...]:
        facts = entry.get("machine_facts", {})
        # then, among machines alike in all of those: the one of this CPU model (family/model), where known; and
        # among those still alike, the largest floor: another machine's figure stands in, and it must not be low
        return (*(int(facts.get(key) != here[key]) for key in ("vendor", "amx", "avx512_bf16", "capability", "threads")),
                int(bool(model_id) and entry.get("cpu_model_id") != model_id), -int(entry.get("floor_bytes", 0)))

    chosen = min(same_build, key=distance)
    spread, seen_on = spread
    name = chosen.get("cpu", chosen.get("machine", "a bundled machine"))
    said = (f"process floor from the bundled calibration of {name} (torch {chosen['torch']}); this machine has no "
            "calibration of its own (`trainmem calibrate` measures one, in about a minute)")
    if spread:
        said += (f"; the high end allows {spread / 2**20:.1f} MiB more, how far the floor moved between the "
                 f"bundled machines that measured torch {seen_on}")
    return MachineChoice(chosen, False, spread, said)
