"""The device table: where training will run. No torch.

The CPU's capacity is this machine's physical memory (MemTotal in /proc/meminfo), and
`available_bytes()` is what the kernel says a new process could still use. GPUs come from
device_catalog.py (facts with their sources) or `custom:capacity=24GiB,cc=8.9`; estimates for them
go through the CUDA target (targets/cuda.py CudaTarget).
"""

from __future__ import annotations

import dataclasses
import os

from trainmem.device_catalog import CATALOG, GpuSpec, find_gpu, parse_custom
from trainmem.errors import expected


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    kind: str  # "cpu" or "cuda"
    capacity_bytes: int
    description: str
    gpu: GpuSpec | None = None  # the catalog entry, for kind "cuda"

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "kind": self.kind, "capacity_bytes": self.capacity_bytes}
        if self.gpu is not None:
            out.update(compute_capability=".".join(map(str, self.gpu.compute_capability)),
                       cublas_workspace_bytes=self.gpu.cublas_workspace_bytes, bf16=self.gpu.bf16,
                       flash_attention=self.gpu.flash_attention, cuda_context_bytes=self.gpu.cuda_context_bytes,
                       capacity_source=self.gpu.capacity_source, context_source=self.gpu.context_source)
        return out


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


def gpu_device(spec: GpuSpec) -> Device:
    cc = ".".join(map(str, spec.compute_capability))
    return Device(spec.name, "cuda", spec.capacity_bytes, f"{spec.marketing_name}, cc {cc}", spec)


def all_devices() -> list[Device]:
    return [cpu_device(), *(gpu_device(spec) for spec in CATALOG)]


def get_device(name: str) -> Device:
    if name.lower().startswith("custom:"):
        return gpu_device(parse_custom(name))
    if name.lower() == "cpu":
        return cpu_device()
    spec = find_gpu(name)
    if spec is None:
        names = ", ".join(d.name for d in all_devices())
        raise expected(f"a device among {names}, or custom:capacity=SIZE,cc=X.Y", name, "--device")
    return gpu_device(spec)


def format_table(devices: list[Device]) -> str:
    """The `trainmem devices` table, one device a line."""
    from trainmem.units import format_bytes

    lines = []
    for d in devices:
        extra = "" if d.gpu is None else (f"  bf16 {'yes' if d.gpu.bf16 else 'no'}, flash "
                                          f"{'yes' if d.gpu.flash_attention else 'no'}, cuBLAS workspace "
                                          f"{format_bytes(d.gpu.cublas_workspace_bytes)}")
        lines.append(f"{d.name:12s} {d.kind:5s} {format_bytes(d.capacity_bytes):>12s}  {d.description}{extra}")
    return "\n".join(lines)
