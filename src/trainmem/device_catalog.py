"""Catalog of GPU targets for `trainmem devices` / `--device NAME`. No torch.

Each entry records the memory the driver reports, where that number comes from, and whether it was
measured (`capacity_from`).

* `capacity_bytes` is the framebuffer total that nvidia-smi prints ("... / 81559MiB"), times 2**20,
  wherever a public nvidia-smi paste was found (`capacity_from` "nvidia-smi"). This is the driver's
  total for the board. `torch.cuda.get_device_properties().total_memory`
  (= `cudaDeviceProp.totalGlobalMem` = `cudaMemGetInfo` total) is a little lower, because the
  driver keeps some memory for itself. For example, an A100-SXM4-40GB shows 40960MiB in nvidia-smi
  but 42,298,834,944 B (40339 MiB) in deviceQuery (bottlerocket-os/bottlerocket#3873), and an
  H100 80GB HBM3 shows 81559MiB in nvidia-smi but total_memory=81089MB in PyTorch. The exact gap
  depends on the driver. One entry has torch's figure only ("torch").
* Where no measured total with a public source was found (H200, GB200), the entry takes NVIDIA's
  datasheet figure (`capacity_from` "datasheet"), read as GiB: NVIDIA's "GB" for these boards counts
  2**30 bytes (A100 80GB and 40GB show exactly 81920 and 40960 MiB in nvidia-smi). It is an
  assumption, stated in the table and the JSON: on the HBM boards measured here nvidia-smi shows
  0 to 0.52% less than the datasheet's GiB (H100 80GB 81559 of 81920 MiB, H100 NVL 95830 of 96256,
  B200 183359 of 184320), so a datasheet capacity may be up to about half a percent high.
* The rules that depend on compute capability follow PyTorch's own source (see the functions
  below). They are not per-GPU guesses.
* `cuda_context_bytes` is one default for every GPU: the CUDA 12, lazy-loading figure of
  targets/cuda_runtime.py (256 MiB), measured on an RTX 3090. Estimates take the context from that
  module by the target's CUDA version and module loading (--cuda-version, --module-loading), with the
  range reported; only a custom device's `context=` (or --cuda-context) replaces it. No per-GPU
  figures with a public source were found, so every other GPU assumes the RTX 3090's figure
  (`context_from` "assumed"): the context's size is taken to depend on the CUDA version, the driver
  and module loading, not on the board.
"""

from __future__ import annotations

import dataclasses
import re

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
CAPACITY_FROM_NVIDIA_SMI = "nvidia-smi"  # measured: the framebuffer total nvidia-smi prints
CAPACITY_FROM_TORCH = "torch"  # measured: torch.cuda.get_device_properties().total_memory
CAPACITY_FROM_DATASHEET = "datasheet"  # not measured: NVIDIA's published figure, read as GiB
CAPACITY_FROM_GIVEN = "given"  # custom:capacity= on the command line
MEASURED_CAPACITY = frozenset({CAPACITY_FROM_NVIDIA_SMI, CAPACITY_FROM_TORCH})
# Where a context size comes from (GpuSpec.context_from).
CONTEXT_MEASURED = "measured"  # on this GPU
CONTEXT_ASSUMED = "assumed"  # another GPU's measurement (DEFAULT_CONTEXT_MEASURED_ON), taken as the same here
CONTEXT_GIVEN = "given"  # custom:...,context= on the command line


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

    @property
    def capacity_measured(self) -> bool:
        """False where the capacity is a datasheet's or the user's figure, not a measured total."""
        return self.capacity_from in MEASURED_CAPACITY

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name, "aliases": list(self.aliases), "marketing_name": self.marketing_name,
            "capacity_bytes": self.capacity_bytes, "capacity_source": self.capacity_source,
            "compute_capability": f"{self.compute_capability[0]}.{self.compute_capability[1]}",
            "cublas_workspace_bytes": self.cublas_workspace_bytes, "bf16": self.bf16,
            "flash_attention": self.flash_attention, "cuda_context_bytes": self.cuda_context_bytes,
            "context_source": self.context_source, "capacity_from": self.capacity_from,
            "capacity_measured": self.capacity_measured, "context_from": self.context_from,
        }


def _gpu(name: str, aliases: tuple[str, ...], marketing: str, mib: int, source: str,
         cc: tuple[int, int], capacity_from: str = CAPACITY_FROM_NVIDIA_SMI) -> GpuSpec:
    context_from = CONTEXT_MEASURED if name == DEFAULT_CONTEXT_MEASURED_ON else CONTEXT_ASSUMED
    return GpuSpec(name=name, aliases=aliases, marketing_name=marketing, capacity_bytes=mib * MiB,
                   capacity_source=source, compute_capability=cc,
                   cublas_workspace_bytes=cublas_workspace_for(cc), bf16=bf16_for(cc),
                   flash_attention=flash_attention_for(cc), cuda_context_bytes=DEFAULT_CONTEXT_BYTES,
                   context_source=DEFAULT_CONTEXT_SOURCE, capacity_from=capacity_from, context_from=context_from)


def _datasheet_gib(gib: int) -> int:
    """A datasheet's "N GB" as MiB, read as GiB (module docstring: NVIDIA's GB for these boards)."""
    return gib * 1024


_MODAL = "https://github.com/modal-labs/modal-client/pull/2797 (nvidia-smi totals per GPU type)"
# nvidia-smi / nvidia-smi -q pastes of rented machines, one file per GPU type, pinned to their commits
_THAMADA = "https://github.com/thamada/nvidia-smi/blob/{commit}/{path}"

CATALOG: tuple[GpuSpec, ...] = (
    _gpu("v100-16gb", ("v100-sxm2-16gb",), "Tesla V100-SXM2-16GB", 16384,
         "nvidia-smi '5MiB / 16384MiB', https://github.com/1CatAI/1Cat-vLLM/issues/85", (7, 0)),
    _gpu("v100-32gb", ("v100-pcie-32gb",), "Tesla V100-PCIE-32GB", 32480,
         "nvidia-smi '31194MiB / 32480MiB' (driver 410.48, Tesla V100-PCIE), "
         "https://blog.cachecha.com/csdn/kunhe0512/126265050.html", (7, 0)),
    _gpu("v100-sxm2-32gb", (), "Tesla V100-SXM2-32GB", 32768,
         "nvidia-smi 32768MiB (driver 510.39.01; other drivers show 32510MiB), deviceQuery 34089926656 B, "
         "https://github.com/sdsc/sdsc-summer-institute-2023/blob/main/5.3a_gpu_computing_programming/README.md",
         (7, 0)),
    _gpu("t4", ("tesla-t4",), "Tesla T4", 15360, f"nvidia-smi 15360MiB, {_MODAL}", (7, 5)),
    _gpu("a10g", ("a10",), "NVIDIA A10G", 23028,
         "nvidia-smi '8722MiB / 23028MiB', https://github.com/NVIDIA/DCGM/issues/232; "
         f"also 23028MiB in {_MODAL}", (8, 6)),
    _gpu("a40", (), "NVIDIA A40", 46068,
         "nvidia-smi '1MiB / 46068MiB' (driver 550.127.05), "
         + _THAMADA.format(commit="5f6b772848f86e938c96cb7b6ff46d11f4957cba", path="nvsim/A40x10_smi.py"), (8, 6)),
    _gpu("l4", (), "NVIDIA L4", 23034, f"nvidia-smi 23034MiB, {_MODAL}", (8, 9)),
    _gpu("l40s", (), "NVIDIA L40S", 46068, f"nvidia-smi 46068MiB, {_MODAL}", (8, 9)),
    _gpu("a100-40gb", ("a100-sxm4-40gb",), "NVIDIA A100-SXM4-40GB", 40960,
         f"nvidia-smi 40960MiB, {_MODAL}; deviceQuery totalGlobalMem 42298834944 B, "
         "https://github.com/bottlerocket-os/bottlerocket/pull/3873", (8, 0)),
    _gpu("a100-80gb", ("a100-sxm4-80gb",), "NVIDIA A100-SXM4-80GB", 81920,
         f"nvidia-smi 81920MiB, {_MODAL}", (8, 0)),
    _gpu("h100-80gb", ("h100-sxm", "h100-80gb-hbm3"), "NVIDIA H100 80GB HBM3", 81559,
         "nvidia-smi '0MiB / 81559MiB', https://github.com/NVIDIA/nccl/issues/1264; "
         f"also 81559MiB in {_MODAL}", (9, 0)),
    _gpu("h100-pcie", ("h100-pcie-80gb",), "NVIDIA H100 PCIe", 81559,
         "nvidia-smi '25169MiB / 81559MiB' (driver 535.129.03), "
         "https://github.com/triton-inference-server/tensorrtllm_backend/blob/main/docs/llama.md", (9, 0)),
    _gpu("h100-nvl", ("h100-nvl-94gb",), "NVIDIA H100 NVL", 95830,
         "nvidia-smi '0MiB / 95830MiB' and -q 'FB Memory Usage Total: 95830 MiB' (driver 550.54.14), "
         + _THAMADA.format(commit="198aebb60732de6969556867659756f4685637c2", path="nvsim/H100NVLx2_smi.py"),
         (9, 0)),
    # datasheet capacities (h200, gb200): no measured total with a public source was found (module docstring)
    _gpu("h200", ("h200-sxm", "h200-141gb", "h200-nvl"), "NVIDIA H200", _datasheet_gib(141),
         "datasheet, not measured: 141 GB HBM3e for H200 SXM and H200 NVL, "
         "https://www.nvidia.com/en-us/data-center/h200/ (read as 141 GiB; nvidia-smi pastes showing "
         "143771MiB, 0.4% less, could not be traced to a citable page)", (9, 0), CAPACITY_FROM_DATASHEET),
    _gpu("b200", (), "NVIDIA B200", 183359,
         "nvidia-smi '166593MiB / 183359MiB', https://github.com/NVIDIA/TensorRT-LLM/issues/10278",
         (10, 0)),
    _gpu("gb200", ("gb200-nvl72",), "NVIDIA GB200", _datasheet_gib(186),
         "datasheet, not measured: 186 GB HBM3e per Blackwell GPU of a GB200 superchip (372 GB for its two; "
         "13.4 TB for the 72 of a GB200 NVL72), https://www.nvidia.com/en-us/data-center/gb200-nvl72/; MLPerf "
         "system descriptions list 'accelerator_memory_capacity: 186 GB' for 'NVIDIA GB200', "
         "https://github.com/mlcommons/inference_results_v6.1/blob/main/closed/Crusoe/systems/"
         "GB200-NVL72_GB200-186GB_aarch64x16_Dynamo.json (read as 186 GiB; 2024 announcements said 192 GB, "
         "the shipping specification says 186)", (10, 0), CAPACITY_FROM_DATASHEET),
    _gpu("rtx3090", ("3090", "rtx-3090"), "NVIDIA GeForce RTX 3090", 24576,
         "nvidia-smi '22598MiB / 24576MiB', https://github.com/noonghunna/club-3090/issues/1128",
         (8, 6)),
    _gpu("rtx4090", ("4090", "rtx-4090"), "NVIDIA GeForce RTX 4090", 24564,
         "nvidia-smi '507MiB / 24564MiB', https://github.com/RLinf/RLinf/issues/255", (8, 9)),
    _gpu("rtx-a6000", ("a6000",), "NVIDIA RTX A6000", 48676,
         "torch total_memory=48676MB, https://github.com/pytorch/ao/blob/main/torchao/prototype/hqq/README.md "
         "(torch's figure: nvidia-smi shows about 464 MiB more with ECC off; no citable nvidia-smi paste found)",
         (8, 6), CAPACITY_FROM_TORCH),
    _gpu("rtx-6000-ada", ("rtx6000-ada", "6000-ada"), "NVIDIA RTX 6000 Ada Generation", 49140,
         "nvidia-smi '2MiB / 49140MiB' and -q 'FB Memory Usage Total: 49140 MiB' (driver 550.127.05, ECC off), "
         + _THAMADA.format(commit="b09ef139265ffc7e3c78006346981de8e4d70499", path="gls/RTX6000Ada_x8_smi.py"),
         (8, 9)),
    _gpu("rtx5090", ("5090", "rtx-5090"), "NVIDIA GeForce RTX 5090", 32607,
         "nvidia-smi '29024MiB / 32607MiB', https://github.com/noonghunna/club-3090/issues/1261",
         (12, 0)),
)


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
                   capacity_from=CAPACITY_FROM_GIVEN, context_from=CONTEXT_GIVEN if given else CONTEXT_ASSUMED)
