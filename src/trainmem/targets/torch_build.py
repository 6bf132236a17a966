"""Which measured torch build's facts apply to the torch running here.

Some facts are measured per torch build, not derived: the CPU process floor (targets/data/cpu_runtime.json,
one entry per build, by benchmarks/calibrate_cpu.py). trainmem runs under any supported torch, so a build
without a measurement of its own takes the nearest measured one, and the estimate says which
(`FactChoice.warning`).

Nearest means, in this order: the same kind of build, then the closest release. The kind comes first
because it moves the floor most: a CUDA build maps its CUDA libraries at `import torch` even on a machine
without a GPU (711 MB against 317 MB for the CPU build, torch 2.14.1 against 2.13.0 on one machine), while
releases of one kind differ by tens of MB. Between two equally close releases the newer is taken.
"""

from __future__ import annotations

import dataclasses
import re

CPU, CUDA, ROCM, OTHER = "cpu", "cuda", "rocm", "other"
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


@dataclasses.dataclass(frozen=True)
class TorchBuild:
    """A torch build as `torch.__version__` names it: its release (2, 14, 1) and its kind."""

    text: str
    release: tuple[int, int, int]
    kind: str

    @classmethod
    def parse(cls, version: str, kind: str | None = None) -> TorchBuild:
        """`kind` is read from the local label (+cpu, +cu130, +rocm6.1) unless given: a version without one
        (a wheel from PyPI for macOS, a source build) says nothing about it."""
        match = _RELEASE.match(str(version))
        release = (int(match[1]), int(match[2]), int(match[3] or 0)) if match else (0, 0, 0)
        return cls(str(version), release, kind or _kind_of_label(str(version)))

    @classmethod
    def running(cls) -> TorchBuild:
        """This process's torch; its kind from what it was built with (a label may be missing): neither
        CUDA nor ROCm is a CPU build."""
        import torch

        kind = CUDA if torch.version.cuda else ROCM if getattr(torch.version, "hip", None) else CPU
        return cls.parse(torch.__version__, kind)


def _kind_of_label(version: str) -> str:
    label = version.partition("+")[2]
    if label.startswith("cpu"):
        return CPU
    if label.startswith("cu"):
        return CUDA
    if label.startswith("rocm"):
        return ROCM
    return OTHER


def _release_distance(one: tuple[int, int, int], other: tuple[int, int, int]) -> int:
    """How far apart two releases are, minor releases weighing more than patches (no patch reaches 100)."""
    def ordinal(release):
        return (release[0] * 100 + release[1]) * 100 + release[2]
    return abs(ordinal(one) - ordinal(other))


@dataclasses.dataclass(frozen=True)
class FactChoice:
    """The measured entry used for the running build, and whether it is the running build's own."""

    entry: dict
    measured_on: str  # the torch build the entry was measured on
    running: str  # the torch build running here
    exact: bool

    def warning(self, what: str) -> str | None:
        """One line for Estimate.warnings when the facts are another build's; None when they are this one's."""
        if self.exact:
            return None
        return (f"{what}: no measurement for torch {self.running}; the nearest measured build's, torch "
                f"{self.measured_on}, is used (benchmarks/calibrate_cpu.py measures this build)")


def nearest(entries: list[dict], running: TorchBuild, key: str = "torch") -> FactChoice:
    """The entry measured on `running` itself, else the nearest (module docstring): same kind first,
    then the closest release, then the newer."""
    if not entries:
        raise ValueError("no measured entries to choose from")
    for entry in entries:
        if entry[key] == running.text:
            return FactChoice(entry, entry[key], running.text, True)

    def rank(entry: dict) -> tuple[int, int, tuple[int, int, int]]:
        build = TorchBuild.parse(entry[key])
        newer_first = tuple(-part for part in build.release)
        return (build.kind != running.kind, _release_distance(build.release, running.release), newer_first)

    chosen = min(entries, key=rank)
    return FactChoice(chosen, chosen[key], running.text, False)
