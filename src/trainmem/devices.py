"""The device table: where training will run. No torch at import.

The CPU's capacity is this machine's physical memory (MemTotal in /proc/meminfo), and
`available_bytes()` is what the kernel says a new process could still use. GPUs come from
device_catalog.py (facts with their sources) or `custom:capacity=24GiB,cc=8.9`; estimates for them
go through the CUDA target (targets/cuda.py CudaTarget).

A device may be named by a string ("cpu", "h100-80gb", "custom:…"), a `torch.device`, or a `Device`.
"cuda" (or "cuda:N", torch.device("cuda"[, N])) names no GPU model, so it is read as "the GPU of this
machine": where torch sees that GPU, its name picks the catalog entry that nvidia-smi names alike, and
a GPU the catalog lacks (an A100 PCIe, a MIG slice) is described by its own properties (total_memory,
compute capability), the way `trainmem measure --device cuda` does. Where no GPU is visible (a laptop
planning for a cloud GPU) it is refused with a line asking for the GPU model. Only that path imports torch.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import torch

from trainmem.device_catalog import (CAPACITY_FROM_TORCH, CATALOG, CONTEXT_ASSUMED, DEFAULT_CONTEXT_BYTES,
                                     DEFAULT_CONTEXT_SOURCE, GpuSpec, bf16_for, cublas_workspace_for, find_gpu,
                                     flash_attention_for, parse_custom)
from trainmem.errors import SetupError, expected


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
                       capacity_source=self.gpu.capacity_source, context_source=self.gpu.context_source,
                       capacity_from=self.gpu.capacity_from, capacity_measured=self.gpu.capacity_measured,
                       context_from=self.gpu.context_from)
        return out

    @property
    def capacity_from(self) -> str:
        """Where the capacity comes from: the GPU entry's (device_catalog.CAPACITY_FROM_*), the CPU's MemTotal."""
        return CPU_CAPACITY_FROM if self.gpu is None else self.gpu.capacity_from


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


# What the Python API takes as a device: "cpu", a catalog name or custom:…, a torch.device, or a Device
DeviceRef = Union[str, "torch.device", Device]
CPU_CAPACITY_FROM = "MemTotal"  # /proc/meminfo: measured on this machine
# "cuda", "cuda:0": torch's names for "a GPU of this machine", which name no GPU model
_LOCAL_CUDA = re.compile(r"^cuda(?::(\d+))?$")
_DEVICE_FORMS = "cpu, a GPU from `trainmem devices` (e.g. h100-80gb), or custom:capacity=SIZE,cc=X.Y"


def device_name(device: Any) -> str:
    """The device reference as a string: a str as given, a torch.device as torch prints it ("cuda:0"),
    a Device by its name. Anything else is refused on one line."""
    if isinstance(device, str):
        return device
    if isinstance(device, Device):
        return device.name
    if type(device).__name__ == "device" and type(device).__module__ == "torch":  # torch.device, without torch
        return str(device)
    raise expected(f"a device: {_DEVICE_FORMS}, or a torch.device", device, "--device")


def get_device(name: DeviceRef) -> Device:
    """The Device a reference names (module docstring): a str, a torch.device or a Device."""
    if isinstance(name, Device):
        return name
    name = device_name(name).strip()
    if name.lower().startswith("custom:"):
        return gpu_device(parse_custom(name))
    if name.lower() == "cpu":
        return cpu_device()
    local = _LOCAL_CUDA.match(name.lower())
    if local:
        return local_gpu(int(local.group(1) or 0), name)
    spec = find_gpu(name)
    if spec is None:
        names = ", ".join(d.name for d in all_devices())
        raise expected(f"a device among {names}, or custom:capacity=SIZE,cc=X.Y", name, "--device")
    return gpu_device(spec)


@dataclasses.dataclass(frozen=True)
class GpuProperties:
    """What torch.cuda.get_device_properties(index) says of a GPU of this machine."""

    index: int
    name: str  # as nvidia-smi prints it: "NVIDIA H100 80GB HBM3"
    total_memory: int
    compute_capability: tuple[int, int]


def local_gpu(index: int, given: str) -> Device:
    """"cuda[:N]": this machine's GPU N, identified by torch (module docstring); refused where none is visible."""
    properties = _visible_gpu(index)
    if properties is None:
        raise SetupError(f"expected the GPU model to estimate for ({_DEVICE_FORMS}), got {given!r}, which names "
                         "none: no CUDA GPU is visible here to identify it", where="--device")
    return gpu_device(identify_gpu(properties))


def _visible_gpu(index: int) -> GpuProperties | None:
    """GPU `index` as torch sees it, or None without one. Reading the properties initialises CUDA, which the
    caller asked for by naming "cuda"; torch.cuda.is_available() alone does not (it asks NVML)."""
    import torch

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    props = torch.cuda.get_device_properties(index)
    return GpuProperties(index, props.name, props.total_memory, (props.major, props.minor))


def identify_gpu(properties: GpuProperties) -> GpuSpec:
    """The catalog entry whose name nvidia-smi prints alike, else a spec from the GPU's own properties:
    its total_memory as the capacity (torch's figure, a little under nvidia-smi's: device_catalog.py)
    and its compute capability, with the default CUDA context. An entry whose capacity is only a
    datasheet's takes the measured total_memory instead."""
    measured = (f"torch.cuda.get_device_properties({properties.index}).total_memory, measured on this machine")
    for spec in CATALOG:
        if spec.marketing_name.lower() == properties.name.strip().lower():
            if spec.capacity_measured:
                return spec
            return dataclasses.replace(spec, capacity_bytes=properties.total_memory, capacity_from=CAPACITY_FROM_TORCH,
                                       capacity_source=measured + " (the catalog has only a datasheet's figure)")
    cc = properties.compute_capability
    return GpuSpec(name=f"cuda:{properties.index}", aliases=(), marketing_name=properties.name,
                   capacity_bytes=properties.total_memory, capacity_source=measured + " (not in the catalog)",
                   compute_capability=cc, cublas_workspace_bytes=cublas_workspace_for(cc), bf16=bf16_for(cc),
                   flash_attention=flash_attention_for(cc), cuda_context_bytes=DEFAULT_CONTEXT_BYTES,
                   context_source=DEFAULT_CONTEXT_SOURCE, capacity_from=CAPACITY_FROM_TORCH,
                   context_from=CONTEXT_ASSUMED)


# The `trainmem devices` table: (header, cell of a device). Every column is left-aligned, so each starts
# at the same offset on every line; cells never hold two spaces in a row (the columns' separator).
def _cells(device: Device) -> list[str]:
    from trainmem.units import format_bytes

    gpu = device.gpu
    if gpu is None:
        return [device.name, device.kind, format_bytes(device.capacity_bytes), device.capacity_from,
                "-", "-", "-", "-", "-", "-", device.description]
    return [device.name, device.kind, format_bytes(device.capacity_bytes), gpu.capacity_from,
            ".".join(map(str, gpu.compute_capability)), "yes" if gpu.bf16 else "no",
            "yes" if gpu.flash_attention else "no", format_bytes(gpu.cublas_workspace_bytes),
            format_bytes(gpu.cuda_context_bytes), gpu.context_from, gpu.marketing_name]


TABLE_HEADER = ["name", "kind", "capacity", "capacity from", "cc", "bf16", "flash", "cuBLAS workspace", "context",
                "context from", "description"]
COLUMN_GAP = "  "


def format_table(devices: list[Device]) -> str:
    """The `trainmem devices` table: a header row, one device a line in aligned columns, then where each
    capacity and context size comes from, with what "measured", "datasheet" and "assumed" mean."""
    rows = [TABLE_HEADER] + [_cells(device) for device in devices]
    widths = [max(len(row[column]) for row in rows) for column in range(len(TABLE_HEADER))]
    lines = [COLUMN_GAP.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines + [""] + _sources(devices))


def _sources(devices: list[Device]) -> list[str]:
    gpus = [device for device in devices if device.gpu is not None]
    lines = ["capacity from: nvidia-smi = the total nvidia-smi prints, measured on that GPU; torch = "
             "torch.cuda total_memory, measured; datasheet = NVIDIA's published figure, read as GiB, not measured "
             "(may be about 0.5% above nvidia-smi's); given = on the command line; MemTotal = this machine's RAM.",
             "context from: measured = on that GPU; assumed = measured on another GPU (the RTX 3090) and taken "
             "as the same here; estimates choose it by --cuda-version and --module-loading.",
             "", "Capacity sources"]
    width = max((len(device.name) for device in gpus), default=0)
    lines += [f"  {device.name.ljust(width)}  {device.gpu.capacity_source}" for device in gpus]
    by_source: dict[str, list[str]] = {}
    for device in gpus:
        by_source.setdefault(device.gpu.context_source, []).append(device.name)
    lines += ["", "CUDA context sources"]
    for source, names in by_source.items():
        lines.append(f"  {'every GPU above' if len(names) == len(gpus) else ', '.join(names)}: {source}")
    return lines
