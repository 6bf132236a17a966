"""The device table: where training will run. No torch at import.

The CPU's capacity is this machine's physical memory (MemTotal in /proc/meminfo), and
`available_bytes()` is what the kernel says a new process could still use. GPUs come from
device_catalog.py (facts with their sources) or `custom:capacity=24GiB,cc=8.9`; estimates for them
go through the CUDA target (targets/cuda_stream.py CudaTarget).

A device may be named by a string ("cpu", "h100-80gb", "custom:…"), a `torch.device`, or a `Device`.
"cuda" (or "cuda:N", torch.device("cuda"[, N])) names no GPU model, so it is read as "the GPU of this
machine": where torch sees that GPU, its name picks the catalog entry that nvidia-smi names alike, and
a GPU the catalog lacks (an A100 PCIe, a MIG slice) is described by its own properties (total_memory,
compute capability), the way `trainmem measure --device cuda` does. Where no GPU is visible (a laptop
planning for a cloud GPU) it is refused with a line asking for the GPU model. Only that path imports torch.

AMD Instinct GPUs are in the table for their capacity (kind "rocm"), but the CUDA target's runtime facts are not
theirs (device_catalog.py), so every path that would estimate on one, a ROCm GPU of this machine included, is
refused with one line. `search_devices` finds devices by a piece of their name (`trainmem devices --search`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import torch

from trainmem.device_catalog import (CAPACITY_FROM_TORCH, CATALOG, CONTEXT_ASSUMED, CONTEXT_NOT_MODELLED,
                                     DEFAULT_CONTEXT_BYTES, DEFAULT_CONTEXT_SOURCE, PLATFORM_CUDA, PLATFORM_ROCM,
                                     ROCM_NOT_MODELLED, GpuSpec, bf16_for, cublas_workspace_for, find_gpu,
                                     flash_attention_for, parse_custom)
from trainmem.errors import SetupError, expected, quote


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    kind: str  # "cpu", "cuda", or "rocm" (listed only: estimates refuse it)
    capacity_bytes: int
    description: str
    gpu: GpuSpec | None = None  # the catalog entry, for a GPU

    def to_dict(self) -> dict[str, object]:
        """The device as an estimate's JSON states it (keys scripts rely on: DESIGN.md)."""
        out: dict[str, object] = {"name": self.name, "kind": self.kind, "capacity_bytes": self.capacity_bytes}
        gpu = self.gpu
        if gpu is None:
            return out
        cc = ".".join(map(str, gpu.compute_capability))
        if gpu.modelled:
            out.update(compute_capability=cc, cublas_workspace_bytes=gpu.cublas_workspace_bytes, bf16=gpu.bf16,
                       flash_attention=gpu.flash_attention, cuda_context_bytes=gpu.cuda_context_bytes)
        else:  # a ROCm GPU: listed only, none of the CUDA runtime's figures (device_catalog.py)
            out.update(compute_capability=cc, gfx_target=gpu.gfx_target, bf16=gpu.bf16, estimates=ROCM_NOT_MODELLED)
        out.update(capacity_source=gpu.capacity_source, context_source=gpu.context_source,
                   capacity_from=gpu.capacity_from, capacity_measured=gpu.capacity_measured,
                   context_from=gpu.context_from)
        return out

    def listing(self) -> dict[str, object]:
        """The device as `trainmem devices --format json` lists it: to_dict() and what finds it (aliases, product
        name) and where its architecture figures come from."""
        out = self.to_dict()
        if self.gpu is not None:
            out.update(aliases=list(self.gpu.aliases), marketing_name=self.gpu.marketing_name,
                       sm_count=self.gpu.sm_count, arch_source=self.gpu.arch_source)
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
    arch = f"cc {'.'.join(map(str, spec.compute_capability))}" if spec.modelled else spec.gfx_target
    return Device(spec.name, spec.platform, spec.capacity_bytes, f"{spec.marketing_name}, {arch}", spec)


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
    """The Device a reference names (module docstring): a str, a torch.device or a Device. A GPU whose runtime
    the CUDA target does not model (an AMD Instinct) is refused."""
    if isinstance(name, Device):
        return _modelled(name, name.name)
    given = device_name(name).strip()
    if given.lower().startswith("custom:"):
        return gpu_device(parse_custom(given))
    if given.lower() == "cpu":
        return cpu_device()
    local = _LOCAL_CUDA.match(given.lower())
    if local:
        return _modelled(local_gpu(int(local.group(1) or 0), given), given)
    spec = find_gpu(given)
    if spec is None:
        raise _unknown_device(given)
    return _modelled(gpu_device(spec), given)


def _unknown_device(given: str) -> SetupError:
    """A name no entry has: the nearest names, not all of them (the catalog lists dozens)."""
    keys = [spec.name for spec in CATALOG]
    wanted = given.lower()
    close = [key for key in keys if key.startswith(wanted)][:3] or \
        difflib.get_close_matches(wanted, ["cpu", *keys, *(alias for spec in CATALOG for alias in spec.aliases)],
                                  n=2, cutoff=0.6)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return expected(f"a device among cpu, the {len(CATALOG)} GPUs of `trainmem devices` (`trainmem devices "
                    f"--search TEXT` finds one), or custom:capacity=SIZE,cc=X.Y{hint}", given, "--device")


def _modelled(device: Device, given: str) -> Device:
    """The device, if estimates can run on it: a ROCm GPU is refused on one line (module docstring)."""
    gpu = device.gpu
    if gpu is None or gpu.modelled:
        return device
    raise SetupError(f"expected a GPU the CUDA target models (kind cuda in `trainmem devices`), got {quote(given)}: "
                     f"{gpu.marketing_name} ({gpu.gfx_target or 'ROCm'}) runs PyTorch on ROCm, whose runtime "
                     "(HIP context, hipBLASLt/rocBLAS workspaces, kernel images, attention backends, RCCL) trainmem "
                     "does not model; it is listed for its capacity only", where="--device")


@dataclasses.dataclass(frozen=True)
class GpuProperties:
    """What torch.cuda.get_device_properties(index) says of a GPU of this machine."""

    index: int
    name: str  # as nvidia-smi prints it: "NVIDIA H100 80GB HBM3"
    total_memory: int
    compute_capability: tuple[int, int]  # on ROCm: the GFXIP major.minor (9.4 for an MI300X)
    platform: str = PLATFORM_CUDA  # "rocm" where torch is a ROCm build (torch.version.hip)


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
    platform = PLATFORM_ROCM if getattr(torch.version, "hip", None) else PLATFORM_CUDA
    return GpuProperties(index, props.name, props.total_memory, (props.major, props.minor), platform)


def identify_gpu(properties: GpuProperties) -> GpuSpec:
    """The catalog entry whose name nvidia-smi prints alike, else a spec from the GPU's own properties:
    its total_memory as the capacity (torch's figure, a little under nvidia-smi's: device_catalog.py)
    and its compute capability, with the default CUDA context. Several entries may share a name (an RTX
    3080 with 10 or 12 GB): the one nearest total_memory is taken. An entry whose capacity is only a
    datasheet's, or is more than 10% off total_memory (a memory size the catalog lacks, an RTX 3060 8GB),
    takes the measured total_memory instead. A ROCm GPU stays a ROCm GPU (refused by get_device)."""
    measured = (f"torch.cuda.get_device_properties({properties.index}).total_memory, measured on this machine")
    name = properties.name.strip().lower()
    named = [spec for spec in CATALOG if spec.marketing_name.lower() == name and spec.platform == properties.platform]
    if named:
        spec = min(named, key=lambda entry: abs(entry.capacity_bytes - properties.total_memory))
        if spec.capacity_measured and abs(spec.capacity_bytes - properties.total_memory) <= spec.capacity_bytes / 10:
            return spec
        why = "the catalog has only a datasheet's figure" if not spec.capacity_measured else \
            f"the catalog's {spec.name} has {spec.capacity_bytes:,} B"
        return dataclasses.replace(spec, capacity_bytes=properties.total_memory, capacity_from=CAPACITY_FROM_TORCH,
                                   capacity_source=f"{measured} ({why})")
    cc = properties.compute_capability
    if properties.platform != PLATFORM_CUDA:
        return GpuSpec(name=f"cuda:{properties.index}", aliases=(), marketing_name=properties.name,
                       capacity_bytes=properties.total_memory, capacity_source=measured + " (not in the catalog)",
                       compute_capability=cc, cublas_workspace_bytes=0, bf16=False, flash_attention=False,
                       cuda_context_bytes=0, context_source=ROCM_NOT_MODELLED, capacity_from=CAPACITY_FROM_TORCH,
                       context_from=CONTEXT_NOT_MODELLED, platform=properties.platform)
    return GpuSpec(name=f"cuda:{properties.index}", aliases=(), marketing_name=properties.name,
                   capacity_bytes=properties.total_memory, capacity_source=measured + " (not in the catalog)",
                   compute_capability=cc, cublas_workspace_bytes=cublas_workspace_for(cc), bf16=bf16_for(cc),
                   flash_attention=flash_attention_for(cc), cuda_context_bytes=DEFAULT_CONTEXT_BYTES,
                   context_source=DEFAULT_CONTEXT_SOURCE, capacity_from=CAPACITY_FROM_TORCH,
                   context_from=CONTEXT_ASSUMED)


_SEPARATORS = re.compile(r"[\s_\-]+")


def _squash(text: str) -> str:
    return _SEPARATORS.sub("", text.lower())


def _search_text(device: Device) -> list[str]:
    """What a search looks at: the key, the aliases and the product name (the CPU: its name)."""
    gpu = device.gpu
    return [device.name] if gpu is None else [device.name, *gpu.aliases, gpu.marketing_name]


def _matches(query: str, texts: list[str]) -> bool:
    """Case-insensitive: the query with spaces, '-' and '_' dropped is part of one text so squashed ("rtx 3060"
    in "rtx3060-12gb"), or each of its words is part of one of the texts ("geforce 3060")."""
    squashed = _squash(query)
    if any(squashed in _squash(text) for text in texts):
        return True
    words = [word for word in _SEPARATORS.split(query.lower()) if word]
    return bool(words) and all(any(word in text.lower() for text in texts) for word in words)


def search_devices(text: str) -> list[Device]:
    """The devices of `trainmem devices` whose key, alias or product name contains `text` (_matches); none is
    bad input, refused on one line, as is empty text."""
    if not isinstance(text, str) or not _squash(text):
        raise expected("a piece of a device's name to look for (e.g. 3060, 'a100 80gb', mi300x)", text, "--search")
    found = [device for device in all_devices() if _matches(text, _search_text(device))]
    if not found:
        raise SetupError(f"expected a piece of a device's name, alias or product name, got {quote(text)}: no device "
                         "matches (`trainmem devices` lists them all)", where="--search")
    return found


# The `trainmem devices` table: (header, cell of a device). Every column is left-aligned, so each starts
# at the same offset on every line; cells never hold two spaces in a row (the columns' separator).
def _cells(device: Device) -> list[str]:
    from trainmem.units import format_bytes

    gpu = device.gpu
    if gpu is None:
        return [device.name, device.kind, format_bytes(device.capacity_bytes), device.capacity_from,
                "-", "-", "-", "-", "-", "-", "-", device.description]
    sms = "-" if gpu.sm_count is None else str(gpu.sm_count)
    if not gpu.modelled:  # a ROCm GPU: no CUDA runtime figures (device_catalog.py)
        return [device.name, device.kind, format_bytes(device.capacity_bytes), gpu.capacity_from, gpu.gfx_target,
                sms, "yes" if gpu.bf16 else "no", "-", "-", "-", gpu.context_from, gpu.marketing_name]
    return [device.name, device.kind, format_bytes(device.capacity_bytes), gpu.capacity_from,
            ".".join(map(str, gpu.compute_capability)), sms, "yes" if gpu.bf16 else "no",
            "yes" if gpu.flash_attention else "no", format_bytes(gpu.cublas_workspace_bytes),
            format_bytes(gpu.cuda_context_bytes), gpu.context_from, gpu.marketing_name]


TABLE_HEADER = ["name", "kind", "capacity", "capacity from", "cc", "SMs", "bf16", "flash", "cuBLAS workspace",
                "context", "context from", "description"]
COLUMN_GAP = "  "


def format_table(devices: list[Device]) -> str:
    """The `trainmem devices` table: a header row, one device a line in aligned columns, then where each
    capacity, architecture and context size comes from, with what "measured", "datasheet" and "assumed" mean."""
    rows = [TABLE_HEADER] + [_cells(device) for device in devices]
    widths = [max(len(row[column]) for row in rows) for column in range(len(TABLE_HEADER))]
    lines = [COLUMN_GAP.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines + [""] + _sources(devices))


def _grouped(gpus: list[Device], source_of) -> list[str]:
    """One line per source: the GPUs that share it, then the source."""
    by_source: dict[str, list[str]] = {}
    for device in gpus:
        by_source.setdefault(source_of(device.gpu), []).append(device.name)
    return [f"  {'every GPU above' if len(names) == len(gpus) else ', '.join(names)}: {source}"
            for source, names in by_source.items()]


def _sources(devices: list[Device]) -> list[str]:
    gpus = [device for device in devices if device.gpu is not None]
    lines = ["capacity from: nvidia-smi = the total nvidia-smi prints, measured on that GPU; torch = "
             "torch.cuda total_memory, measured; datasheet = the vendor's published figure, read as GiB, not measured "
             "(may be about 0.5% above nvidia-smi's); given = on the command line; MemTotal = this machine's RAM.",
             "context from: measured = on that GPU; assumed = measured on another GPU (the RTX 3090) and taken "
             "as the same here; estimates choose it by --cuda-version and --module-loading.",
             "kind rocm: an AMD GPU, listed for its capacity; its runtime is not modelled, so estimates refuse it."]
    if not gpus:
        return lines
    width = max(len(device.name) for device in gpus)
    lines += ["", "Capacity sources"]
    lines += [f"  {device.name.ljust(width)}  {device.gpu.capacity_source}" for device in gpus]
    lines += ["", "Compute capability and SM count sources"] + _grouped(gpus, lambda gpu: gpu.arch_source)
    lines += ["", "CUDA context sources"] + _grouped(gpus, lambda gpu: gpu.context_source)
    return lines
