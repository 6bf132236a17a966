"""Catalog of GPU targets for `trainmem devices` / `--device NAME`. No torch.

The entries and each figure's source are in device_catalog_data.py; this module turns them into GpuSpec
objects with PyTorch's compute-capability rules, finds them by name, and parses custom devices. Each entry
records the memory the driver reports, where that number comes from, and whether it was measured
(`capacity_from`).

* `capacity_bytes` is the framebuffer total that nvidia-smi prints ("... / 81559MiB"), times 2**20,
  wherever a public nvidia-smi paste was found (`capacity_from` "nvidia-smi"). This is the driver's
  total for the board. `torch.cuda.get_device_properties().total_memory`
  (= `cudaDeviceProp.totalGlobalMem` = `cudaMemGetInfo` total) is a little lower, because the
  driver keeps some memory for itself. For example, an A100-SXM4-40GB shows 40960MiB in nvidia-smi
  but 42,298,834,944 B (40339 MiB) in deviceQuery (bottlerocket-os/bottlerocket#3873), and an
  H100 80GB HBM3 shows 81559MiB in nvidia-smi but total_memory=81089MB in PyTorch. The exact gap
  depends on the driver; on GeForce cards it is about half a MiB (an RTX 4070 Ti SUPER: 16375.5 MiB
  from torch, 16376 MiB in nvidia-smi). Where only torch's figure was published, the entry has it
  ("torch").
* Where no measured total with a public source was found (H200, GB200, most GeForce cards, the AMD
  Instinct cards), the entry takes the vendor's datasheet figure (`capacity_from` "datasheet"), read as
  GiB: NVIDIA's "GB" for these boards counts 2**30 bytes (A100 80GB and 40GB show exactly 81920 and
  40960 MiB in nvidia-smi, an RTX 3060 12GB 12288 MiB) and AMD's ROCm specification table gives VRAM in
  GiB. It is an assumption, stated in the table and the JSON: on the boards measured here nvidia-smi
  shows 0 to 0.52% less than the datasheet's GiB (H100 80GB 81559 of 81920 MiB, H100 NVL 95830 of
  96256, B200 183359 of 184320, RTX 4090 24564 of 24576, RTX 5070 12227 of 12288), so a datasheet
  capacity may be up to about half a percent high.
* The rules that depend on compute capability follow PyTorch's own source (see the functions
  below). They are not per-GPU guesses. `sm_count` (streaming multiprocessors) is what Reduce.cuh's
  launch rule reads (targets/cuda_reduce.py); its source is the entry's `arch_source`.
* `cuda_context_bytes` is one default for every GPU: the CUDA 12, lazy-loading figure of
  targets/cuda_runtime.py (256 MiB), measured on an RTX 3090. Estimates take the context from that
  module by the target's CUDA version and module loading (--cuda-version, --module-loading), with the
  range reported; only a custom device's `context=` (or --cuda-context) replaces it. No per-GPU
  figures with a public source were found, so every other GPU assumes the RTX 3090's figure
  (`context_from` "assumed"): the context's size is taken to depend on the CUDA version, the driver
  and module loading, not on the board.
* AMD Instinct GPUs (`platform` "rocm") are listed for their capacity and architecture only. PyTorch on
  ROCm uses the same caching allocator, but every runtime fact the CUDA target adds is CUDA's: the
  cuBLAS/cuBLASLt workspace sizes (ROCm builds take hipBLASLt's), the CUDA context and kernel images
  (HIP's and rocBLAS's differ), the flash-attention hardware rule (ROCm's backends have their own), NCCL
  (RCCL). None of them is modelled for ROCm, so an estimate on such a GPU is refused with one line
  (devices.py), never computed with CUDA's figures.
"""

from __future__ import annotations

import dataclasses
import re

from trainmem.device_catalog_data import CUDA as PLATFORM_CUDA
from trainmem.device_catalog_data import DATASHEET, ENTRIES, NVIDIA_SMI, TORCH, Entry
from trainmem.device_catalog_data import ROCM as PLATFORM_ROCM
from trainmem.errors import SetupError
from trainmem.units import parse_bytes

MiB = 1024**2

# PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize() (returned through
# getChosenWorkspaceSize()): the default is ":4096:2:16:8", i.e. 4096*1024*2 + 16*1024*8 bytes.
# Hopper and Blackwell (properties->major in 9, 10, 11, 12) get 4096*8*1024 = 32 MiB instead.
# Older releases used `major == 9 && minor == 0` (sm90 only).
CUBLAS_DEFAULT_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8  # 8,519,680
CUBLAS_LARGE_WORKSPACE = 4096 * 8 * 1024  # 33,554,432
CUBLAS_LARGE_WORKSPACE_MAJORS = frozenset({9, 10, 11, 12})
CUBLAS_SOURCE = ("pytorch aten/src/ATen/cuda/CublasHandlePool.cpp parseChosenWorkspaceSize: "
                 ":4096:2:16:8 default, 32MiB when cc major in {9,10,11,12}")

# PyTorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:
# check_flash_attention_hardware_support -> check_sm_version<sm80, sm121> (older: <sm80, sm90>).
FLASH_MIN_CC = (8, 0)
FLASH_MAX_CC = (12, 1)
# sdp_utils.cpp check_dtypes_low_precision: bf16 is accepted when dprop->major >= 8.
BF16_MIN_MAJOR = 8

# The CUDA 12, lazy-loading context of targets/cuda_runtime.py CONTEXT_FACTS (a process holding only
# its context: 256 MiB in nvidia-smi, torch 2.7.1+cu128, invoke-ai/InvokeAI issue #9413). Estimates
# choose the figure by CUDA version and module loading; this is what `trainmem devices` shows.
DEFAULT_CONTEXT_BYTES = 256 * MiB
DEFAULT_CONTEXT_SOURCE = ("CUDA 12, lazy module loading: 256 MiB (invoke-ai/InvokeAI #9413); estimates pick the "
                          "figure by --cuda-version and --module-loading (targets/cuda_runtime.py)")
# The GPU that figure was measured on (targets/cuda_runtime.py CONTEXT_FACTS: an RTX 3090). Its entry's
# context is "measured"; every other entry's is "assumed", the same size on another board.
DEFAULT_CONTEXT_MEASURED_ON = "rtx3090"

# Where a capacity comes from (GpuSpec.capacity_from): a measured total, or a figure taken on trust.
CAPACITY_FROM_NVIDIA_SMI = NVIDIA_SMI  # "nvidia-smi", measured: the framebuffer total nvidia-smi prints
CAPACITY_FROM_TORCH = TORCH  # "torch", measured: torch.cuda.get_device_properties().total_memory
CAPACITY_FROM_DATASHEET = DATASHEET  # "datasheet", not measured: the vendor's published figure, read as GiB
CAPACITY_FROM_GIVEN = "given"  # custom:capacity= on the command line
MEASURED_CAPACITY = frozenset({CAPACITY_FROM_NVIDIA_SMI, CAPACITY_FROM_TORCH})
# Where a context size comes from (GpuSpec.context_from).
CONTEXT_MEASURED = "measured"  # on this GPU
CONTEXT_ASSUMED = "assumed"  # another GPU's measurement (DEFAULT_CONTEXT_MEASURED_ON), taken as the same here
CONTEXT_GIVEN = "given"  # custom:...,context= on the command line
CONTEXT_NOT_MODELLED = "not modelled"  # a ROCm GPU: no CUDA context, and HIP's is not modelled
ROCM_NOT_MODELLED = ("ROCm: the HIP runtime's context, hipBLASLt workspaces, kernel images and attention backends "
                     "are not modelled, so estimates refuse this GPU")


def cublas_workspace_for(cc: tuple[int, int]) -> int:
    return CUBLAS_LARGE_WORKSPACE if cc[0] in CUBLAS_LARGE_WORKSPACE_MAJORS else CUBLAS_DEFAULT_WORKSPACE


def bf16_for(cc: tuple[int, int]) -> bool:
    return cc[0] >= BF16_MIN_MAJOR


def flash_attention_for(cc: tuple[int, int]) -> bool:
    return FLASH_MIN_CC <= tuple(cc) <= FLASH_MAX_CC


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    name: str
    aliases: tuple[str, ...]
    marketing_name: str
    capacity_bytes: int
    capacity_source: str
    compute_capability: tuple[int, int]
    cublas_workspace_bytes: int
    bf16: bool
    flash_attention: bool
    cuda_context_bytes: int
    context_source: str
    context_given: bool = False  # a custom device's context=: used as is instead of the runtime's figure
    capacity_from: str = CAPACITY_FROM_NVIDIA_SMI  # one of the CAPACITY_FROM_* values above
    context_from: str = CONTEXT_ASSUMED  # one of the CONTEXT_* values above
    sm_count: int | None = None  # streaming multiprocessors; None: unknown (custom:, a ROCm GPU)
    arch_source: str = ""  # where compute_capability and sm_count come from
    platform: str = PLATFORM_CUDA  # "cuda", or "rocm": listed only, estimates refuse it
    gfx_target: str = ""  # a ROCm GPU's LLVM target (gfx942)

    @property
    def modelled(self) -> bool:
        """True where the CUDA target's runtime facts apply (an NVIDIA GPU)."""
        return self.platform == PLATFORM_CUDA

    @property
    def capacity_measured(self) -> bool:
        """False where the capacity is a datasheet's or the user's figure, not a measured total."""
        return self.capacity_from in MEASURED_CAPACITY

    def to_dict(self) -> dict[str, object]:
        """The entry's facts; a ROCm GPU has none of the CUDA runtime's (workspace, context, flash attention)."""
        out: dict[str, object] = {
            "name": self.name, "aliases": list(self.aliases), "marketing_name": self.marketing_name,
            "platform": self.platform, "capacity_bytes": self.capacity_bytes, "capacity_source": self.capacity_source,
            "capacity_from": self.capacity_from, "capacity_measured": self.capacity_measured,
            "compute_capability": f"{self.compute_capability[0]}.{self.compute_capability[1]}",
            "sm_count": self.sm_count, "arch_source": self.arch_source, "bf16": self.bf16,
            "context_source": self.context_source, "context_from": self.context_from,
        }
        if self.modelled:
            out.update(cublas_workspace_bytes=self.cublas_workspace_bytes, flash_attention=self.flash_attention,
                       cuda_context_bytes=self.cuda_context_bytes)
        else:
            out.update(gfx_target=self.gfx_target)
        return out


def _spec(entry: Entry) -> GpuSpec:
    """A catalog entry with the rules its platform follows: PyTorch's CUDA rules for an NVIDIA GPU; for a ROCm GPU
    nothing of the CUDA runtime (no workspace, context or flash-attention figure: estimates refuse it)."""
    if entry.platform == PLATFORM_ROCM:
        return GpuSpec(name=entry.name, aliases=entry.aliases, marketing_name=entry.marketing,
                       capacity_bytes=entry.capacity, capacity_source=entry.capacity_source,
                       compute_capability=entry.cc, cublas_workspace_bytes=0, bf16=True, flash_attention=False,
                       cuda_context_bytes=0, context_source=ROCM_NOT_MODELLED, capacity_from=entry.capacity_from,
                       context_from=CONTEXT_NOT_MODELLED, sm_count=None, arch_source=entry.arch_source,
                       platform=PLATFORM_ROCM, gfx_target=entry.gfx)
    cc = entry.cc
    context_from = CONTEXT_MEASURED if entry.name == DEFAULT_CONTEXT_MEASURED_ON else CONTEXT_ASSUMED
    return GpuSpec(name=entry.name, aliases=entry.aliases, marketing_name=entry.marketing,
                   capacity_bytes=entry.capacity, capacity_source=entry.capacity_source, compute_capability=cc,
                   cublas_workspace_bytes=cublas_workspace_for(cc), bf16=bf16_for(cc),
                   flash_attention=flash_attention_for(cc), cuda_context_bytes=DEFAULT_CONTEXT_BYTES,
                   context_source=DEFAULT_CONTEXT_SOURCE, capacity_from=entry.capacity_from, context_from=context_from,
                   sm_count=entry.sms, arch_source=entry.arch_source)


# The entries and every figure's source: device_catalog_data.py.
CATALOG: tuple[GpuSpec, ...] = tuple(_spec(entry) for entry in ENTRIES)


def _key(text: str) -> str:
    return text.strip().lower().replace("_", "-").replace(" ", "-")


def find_gpu(name: str) -> GpuSpec | None:
    """A catalog entry by name or alias, ignoring case; None when unknown."""
    key = _key(name)
    for spec in CATALOG:
        if key == spec.name or key in spec.aliases:
            return spec
    return None


_CC = re.compile(r"^\s*(\d+)\.(\d+)\s*$")
_FORM = "custom:capacity=SIZE,cc=MAJOR.MINOR[,context=SIZE]"
# A custom GPU's bounds. Capacity: 1 PiB, about 3,500 times the largest GPU memory sold (B300, 288 GB), so
# any figure above it is a slip of units, and every byte count derived from it stays far inside int64.
MAX_CUSTOM_CAPACITY = 2**50
# Compute capability: from Kepler (3.0, the oldest any torch build ran on) to the newest architecture the
# rules above know (12.x, Blackwell RTX: sm_120/121); a minor version is one digit on every GPU made.
MIN_CC, MAX_CC_MAJOR, MAX_CC_MINOR = (3, 0), 12, 9


def _bad(got: object) -> SetupError:
    return SetupError(f"expected {_FORM} (e.g. custom:capacity=24GiB,cc=8.9), got {got!r}",
                      where="--device")


def parse_custom(text: str) -> GpuSpec:
    """'custom:capacity=24GiB,cc=8.9[,context=500MiB]' -> GpuSpec named 'custom'."""
    raw = str(text).strip()
    if not raw.lower().startswith("custom:"):
        raise _bad(text)
    fields: dict[str, str] = {}
    for part in raw[len("custom:"):].split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("capacity", "cc", "context") or key in fields or not value.strip():
            raise _bad(text)
        fields[key] = value.strip()
    if "capacity" not in fields or "cc" not in fields:
        raise _bad(text)
    try:
        capacity = parse_bytes(fields["capacity"], "--device")
        context = parse_bytes(fields["context"], "--device") if "context" in fields else None
    except SetupError:
        raise _bad(text) from None
    match = _CC.match(fields["cc"])
    if not match or capacity <= 0:
        raise _bad(text)
    if capacity > MAX_CUSTOM_CAPACITY:
        raise SetupError(f"expected custom:capacity= at most 1 PiB (the largest GPU has 288 GB), got "
                         f"{fields['capacity']!r}", where="--device")
    cc = (int(match.group(1)), int(match.group(2)))
    if not (MIN_CC <= cc and cc[0] <= MAX_CC_MAJOR and cc[1] <= MAX_CC_MINOR):
        raise SetupError(f"expected cc= a CUDA compute capability from {MIN_CC[0]}.{MIN_CC[1]} to "
                         f"{MAX_CC_MAJOR}.{MAX_CC_MINOR} (e.g. 8.0 for an A100, 9.0 for an H100), got "
                         f"{fields['cc']!r}", where="--device")
    if context is not None and context >= capacity:
        raise SetupError(f"expected context= smaller than capacity= ({fields['capacity']}), got "
                         f"{fields['context']!r}", where="--device")
    given = context is not None
    if context is None:
        context, context_source = DEFAULT_CONTEXT_BYTES, DEFAULT_CONTEXT_SOURCE
    else:
        context_source = "given on the command line"
    return GpuSpec(name="custom", aliases=(), marketing_name=f"custom (cc {cc[0]}.{cc[1]})",
                   capacity_bytes=capacity, capacity_source="given on the command line",
                   compute_capability=cc, cublas_workspace_bytes=cublas_workspace_for(cc),
                   bf16=bf16_for(cc), flash_attention=flash_attention_for(cc),
                   cuda_context_bytes=context, context_source=context_source, context_given=given,
                   capacity_from=CAPACITY_FROM_GIVEN, context_from=CONTEXT_GIVEN if given else CONTEXT_ASSUMED,
                   arch_source="cc= given on the command line; SM count unknown")
