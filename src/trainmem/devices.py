"""The device table: where training will run. No torch.

Only the CPU target exists so far; its capacity is this machine's physical memory (MemTotal in
/proc/meminfo), and `available_bytes()` is what the kernel says a new process could still use.
"""

from __future__ import annotations

import dataclasses
import os

from trainmem.errors import expected


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    kind: str  # "cpu" or "cuda"
    capacity_bytes: int
    description: str

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "capacity_bytes": self.capacity_bytes}


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_device() -> Device:
    total = _meminfo("MemTotal")
    if total is None:  # not Linux: fall back to sysconf
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Device("cpu", "cpu", total, f"this machine's RAM ({os.cpu_count()} cores)")


def available_bytes() -> int | None:
    """MemAvailable: what a new process can allocate without swapping."""
    return _meminfo("MemAvailable")


def all_devices() -> list[Device]:
    return [cpu_device()]


def get_device(name: str) -> Device:
    for device in all_devices():
        if device.name == name.lower():
            return device
    names = ", ".join(d.name for d in all_devices())
    raise expected(f"a device among {names} (GPU targets are not built yet)", name, "--device")
