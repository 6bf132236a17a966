"""The GPU catalog's data: one Entry per GPU, every figure with where it comes from. No torch, no trainmem imports.

device_catalog.py turns each Entry into a GpuSpec (the compute-capability rules, the default CUDA context) and
states the conventions these figures follow; this module only records them.

* capacity: bytes. "nvidia-smi": the framebuffer total nvidia-smi prints (NVML's), in MiB. "torch":
  torch.cuda.get_device_properties().total_memory = cudaMemGetInfo's total, which ComfyUI and Fooocus log as
  "Total VRAM N MB" (torch.cuda.mem_get_info() total / 2**20, rounded) and ComfyUI's system report as "VRAM Total"
  in bytes; on GeForce cards it sits half a MiB under nvidia-smi's figure. "datasheet": the vendor's "N GB" read as
  GiB, not measured (device_catalog.py says why and by how much it may be high).
* cc: the CUDA compute capability (https://developer.nvidia.com/cuda-gpus); for an AMD GPU, its GFXIP major.minor,
  which is what torch.cuda.get_device_capability() returns on ROCm.
* sms: streaming multiprocessors, which Reduce.cuh's launch rule reads (targets/cuda_reduce.py). A product page gives
  CUDA cores; an architecture whitepaper gives the cores per SM (Pascal GP100 and Turing 64, Ampere GA10x, Ada and
  RTX Blackwell 128). None for AMD GPUs, whose compute units the CUDA rules do not describe.
"""

from __future__ import annotations

import dataclasses

MiB = 1024**2
GiB = 1024**3

NVIDIA_SMI, TORCH, DATASHEET = "nvidia-smi", "torch", "datasheet"
CUDA, ROCM = "cuda", "rocm"


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    aliases: tuple[str, ...]
    marketing: str  # the product name nvidia-smi and torch print ("NVIDIA GeForce RTX 3060")
    capacity: int  # bytes
    capacity_from: str  # NVIDIA_SMI, TORCH or DATASHEET
    capacity_source: str
    cc: tuple[int, int]
    sms: int | None
    arch_source: str  # where cc and sms come from
    platform: str = CUDA
    gfx: str = ""  # ROCm's LLVM target (gfx942)


_MODAL = "https://github.com/modal-labs/modal-client/pull/2797 (nvidia-smi totals per GPU type)"
# nvidia-smi / nvidia-smi -q pastes of rented machines, one file per GPU type, pinned to their commits
_THAMADA = "https://github.com/thamada/nvidia-smi/blob/{commit}/{path}"
_CUDA_GPUS = "cc: https://developer.nvidia.com/cuda-gpus"
# The first 21 entries' SM counts are targets/cuda_reduce.py SM_COUNTS, which cites the same kind of documents.
_KNOWN = f"SMs: NVIDIA architecture whitepapers and product briefs (as targets/cuda_reduce.py SM_COUNTS); {_CUDA_GPUS}"
_TURING_PDF = ("NVIDIA Turing GPU Architecture whitepaper, https://images.nvidia.com/aem-dam/en-zz/Solutions/"
               "design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf")
_GA102_PDF = ("NVIDIA Ampere GA102 GPU Architecture whitepaper, "
              "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf")
_ADA_PDF = ("NVIDIA Ada GPU Architecture whitepaper, "
            "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf")
_BLACKWELL_PDF = ("NVIDIA RTX Blackwell GPU Architecture whitepaper, https://images.nvidia.com/aem-dam/Solutions/"
                  "geforce/blackwell/nvidia-rtx-blackwell-gpu-architecture.pdf")
_RTX20 = "https://www.nvidia.com/en-us/geforce/20-series/"
_RTX30 = "https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/"
_RTX40 = "https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/"
_RTX50 = "https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/"
_PRO = "https://www.nvidia.com/en-us/design-visualization/"
_TURING = f"SMs: CUDA cores on NVIDIA's RTX 20 Series page ({_RTX20}) / 64 per SM ({_TURING_PDF}); {_CUDA_GPUS}"
_AMPERE = f"SMs: CUDA cores on NVIDIA's RTX 30 Series pages ({_RTX30}) / 128 per SM ({_GA102_PDF}); {_CUDA_GPUS}"
_AMPERE_PRO = f"SMs: CUDA cores on NVIDIA's RTX A-series pages ({_PRO}) / 128 per SM ({_GA102_PDF}); {_CUDA_GPUS}"
_ADA = f"SMs: CUDA cores on NVIDIA's RTX 40 Series pages ({_RTX40}) / 128 per SM ({_ADA_PDF}); {_CUDA_GPUS}"
_BLACKWELL = f"SMs: CUDA cores on NVIDIA's RTX 50 Series pages ({_RTX50}) / 128 per SM ({_BLACKWELL_PDF}); {_CUDA_GPUS}"
_ROCM_SPECS = ("AMD GPU specifications (VRAM in GiB, compute units, LLVM target, GFXIP version), "
               "https://rocm.docs.amd.com/en/latest/reference/gpu-specs.html")
_COMFY = ("ComfyUI's system report 'VRAM Total: {total} B' (torch.cuda.mem_get_info() total) and log "
          "'Device: cuda:0 {device}', {url}")


def _smi(name, aliases, marketing, mib, source, cc, sms, arch=_KNOWN) -> Entry:
    return Entry(name, aliases, marketing, mib * MiB, NVIDIA_SMI, source, cc, sms, arch)


def _torch(name, aliases, marketing, nbytes, source, cc, sms, arch=_KNOWN) -> Entry:
    return Entry(name, aliases, marketing, nbytes, TORCH, source, cc, sms, arch)


def _sheet(name, aliases, marketing, gib, source, cc, sms, arch=_KNOWN) -> Entry:
    """A datasheet's "N GB", read as N GiB (device_catalog.py: not measured, possibly ~0.5% high)."""
    return Entry(name, aliases, marketing, gib * GiB, DATASHEET, source, cc, sms, arch)


def _geforce(gb: int, memory: str, page: str) -> str:
    return f"datasheet, not measured: {gb} GB {memory} on NVIDIA's product page, {page} (read as {gb} GiB)"


def _comfy(nbytes: int, device: str, url: str) -> str:
    return (f"torch total_memory {nbytes:,} B ({nbytes / MiB:.1f} MiB): "
            + _COMFY.format(total=nbytes, device=device, url=url))


# ---- datacenter and workstation GPUs the catalog started with -------------------------------------------------
_FIRST = (
    _smi("v100-16gb", ("v100-sxm2-16gb",), "Tesla V100-SXM2-16GB", 16384,
         "nvidia-smi '5MiB / 16384MiB', https://github.com/1CatAI/1Cat-vLLM/issues/85", (7, 0), 80),
    _smi("v100-32gb", ("v100-pcie-32gb",), "Tesla V100-PCIE-32GB", 32480,
         "nvidia-smi '31194MiB / 32480MiB' (driver 410.48, Tesla V100-PCIE), "
         "https://blog.cachecha.com/csdn/kunhe0512/126265050.html", (7, 0), 80),
    _smi("v100-sxm2-32gb", (), "Tesla V100-SXM2-32GB", 32768,
         "nvidia-smi 32768MiB (driver 510.39.01; other drivers show 32510MiB), deviceQuery 34089926656 B, "
         "https://github.com/sdsc/sdsc-summer-institute-2023/blob/main/5.3a_gpu_computing_programming/README.md",
         (7, 0), 80),
    _smi("t4", ("tesla-t4",), "Tesla T4", 15360, f"nvidia-smi 15360MiB, {_MODAL}", (7, 5), 40),
    _smi("a10g", (), "NVIDIA A10G", 23028,
         "nvidia-smi '8722MiB / 23028MiB', https://github.com/NVIDIA/DCGM/issues/232; "
         f"also 23028MiB in {_MODAL}", (8, 6), 80),
    _smi("a40", (), "NVIDIA A40", 46068,
         "nvidia-smi '1MiB / 46068MiB' (driver 550.127.05), "
         + _THAMADA.format(commit="5f6b772848f86e938c96cb7b6ff46d11f4957cba", path="nvsim/A40x10_smi.py"), (8, 6), 84),
    _smi("l4", (), "NVIDIA L4", 23034, f"nvidia-smi 23034MiB, {_MODAL}", (8, 9), 58),
    _smi("l40s", (), "NVIDIA L40S", 46068, f"nvidia-smi 46068MiB, {_MODAL}", (8, 9), 142),
    _smi("a100-40gb", ("a100-sxm4-40gb",), "NVIDIA A100-SXM4-40GB", 40960,
         f"nvidia-smi 40960MiB, {_MODAL}; deviceQuery totalGlobalMem 42298834944 B, "
         "https://github.com/bottlerocket-os/bottlerocket/pull/3873", (8, 0), 108),
    _smi("a100-80gb", ("a100-sxm4-80gb",), "NVIDIA A100-SXM4-80GB", 81920,
         f"nvidia-smi 81920MiB, {_MODAL}", (8, 0), 108),
    _smi("h100-80gb", ("h100-sxm", "h100-80gb-hbm3"), "NVIDIA H100 80GB HBM3", 81559,
         "nvidia-smi '0MiB / 81559MiB', https://github.com/NVIDIA/nccl/issues/1264; "
         f"also 81559MiB in {_MODAL}", (9, 0), 132),
    _smi("h100-pcie", ("h100-pcie-80gb",), "NVIDIA H100 PCIe", 81559,
         "nvidia-smi '25169MiB / 81559MiB' (driver 535.129.03), "
         "https://github.com/triton-inference-server/tensorrtllm_backend/blob/main/docs/llama.md", (9, 0), 114),
    _smi("h100-nvl", ("h100-nvl-94gb",), "NVIDIA H100 NVL", 95830,
         "nvidia-smi '0MiB / 95830MiB' and -q 'FB Memory Usage Total: 95830 MiB' (driver 550.54.14), "
         + _THAMADA.format(commit="198aebb60732de6969556867659756f4685637c2", path="nvsim/H100NVLx2_smi.py"),
         (9, 0), 132),
    # datasheet capacities (h200, gb200): no measured total with a public source was found (device_catalog.py)
    _sheet("h200", ("h200-sxm", "h200-141gb", "h200-nvl"), "NVIDIA H200", 141,
           "datasheet, not measured: 141 GB HBM3e for H200 SXM and H200 NVL, "
           "https://www.nvidia.com/en-us/data-center/h200/ (read as 141 GiB; nvidia-smi pastes showing "
           "143771MiB, 0.4% less, could not be traced to a citable page)", (9, 0), 132),
    _smi("b200", (), "NVIDIA B200", 183359,
         "nvidia-smi '166593MiB / 183359MiB', https://github.com/NVIDIA/TensorRT-LLM/issues/10278", (10, 0), 148),
    _sheet("gb200", ("gb200-nvl72",), "NVIDIA GB200", 186,
           "datasheet, not measured: 186 GB HBM3e per Blackwell GPU of a GB200 superchip (372 GB for its two; "
           "13.4 TB for the 72 of a GB200 NVL72), https://www.nvidia.com/en-us/data-center/gb200-nvl72/; MLPerf "
           "system descriptions list 'accelerator_memory_capacity: 186 GB' for 'NVIDIA GB200', "
           "https://github.com/mlcommons/inference_results_v6.1/blob/main/closed/Crusoe/systems/"
           "GB200-NVL72_GB200-186GB_aarch64x16_Dynamo.json (read as 186 GiB; 2024 announcements said 192 GB, "
           "the shipping specification says 186)", (10, 0), 148),
    _smi("rtx3090", ("3090", "rtx-3090"), "NVIDIA GeForce RTX 3090", 24576,
         "nvidia-smi '22598MiB / 24576MiB', https://github.com/noonghunna/club-3090/issues/1128", (8, 6), 82),
    _smi("rtx4090", ("4090", "rtx-4090"), "NVIDIA GeForce RTX 4090", 24564,
         "nvidia-smi '507MiB / 24564MiB', https://github.com/RLinf/RLinf/issues/255", (8, 9), 128),
    _torch("rtx-a6000", ("a6000",), "NVIDIA RTX A6000", 48676 * MiB,
           "torch total_memory=48676MB, https://github.com/pytorch/ao/blob/main/torchao/prototype/hqq/README.md "
           "(torch's figure: nvidia-smi shows about 464 MiB more with ECC off; no citable nvidia-smi paste found)",
           (8, 6), 84),
    _smi("rtx-6000-ada", ("rtx6000-ada", "6000-ada"), "NVIDIA RTX 6000 Ada Generation", 49140,
         "nvidia-smi '2MiB / 49140MiB' and -q 'FB Memory Usage Total: 49140 MiB' (driver 550.127.05, ECC off), "
         + _THAMADA.format(commit="b09ef139265ffc7e3c78006346981de8e4d70499", path="gls/RTX6000Ada_x8_smi.py"),
         (8, 9), 142),
    _smi("rtx5090", ("5090", "rtx-5090"), "NVIDIA GeForce RTX 5090", 32607,
         "nvidia-smi '29024MiB / 32607MiB', https://github.com/noonghunna/club-3090/issues/1261", (12, 0), 170),
)

# ---- GeForce RTX 20 (Turing, cc 7.5, 64 CUDA cores per SM) ------------------------------------------------------
_RTX20_ENTRIES = (
    _sheet("rtx2060", ("2060", "rtx-2060"), "NVIDIA GeForce RTX 2060", 6, _geforce(6, "GDDR6", _RTX20),
           (7, 5), 30, _TURING),  # 1,920 CUDA cores
    _sheet("rtx2060-super", ("2060-super", "rtx-2060-super"), "NVIDIA GeForce RTX 2060 SUPER", 8,
           _geforce(8, "GDDR6", _RTX20), (7, 5), 34, _TURING),  # 2,176
    _sheet("rtx2070", ("2070", "rtx-2070"), "NVIDIA GeForce RTX 2070", 8, _geforce(8, "GDDR6", _RTX20),
           (7, 5), 36, _TURING),  # 2,304
    _sheet("rtx2070-super", ("2070-super", "rtx-2070-super"), "NVIDIA GeForce RTX 2070 SUPER", 8,
           _geforce(8, "GDDR6", _RTX20), (7, 5), 40, _TURING),  # 2,560
    _sheet("rtx2080", ("2080", "rtx-2080"), "NVIDIA GeForce RTX 2080", 8, _geforce(8, "GDDR6", _RTX20),
           (7, 5), 46, _TURING),  # 2,944
    _sheet("rtx2080-super", ("2080-super", "rtx-2080-super"), "NVIDIA GeForce RTX 2080 SUPER", 8,
           _geforce(8, "GDDR6", _RTX20), (7, 5), 48, _TURING),  # 3,072
    _sheet("rtx2080ti", ("2080ti", "rtx-2080-ti"), "NVIDIA GeForce RTX 2080 Ti", 11, _geforce(11, "GDDR6", _RTX20),
           (7, 5), 68, _TURING),  # 4,352
)

# ---- GeForce RTX 30 (Ampere GA10x, cc 8.6, 128 CUDA cores per SM) ----------------------------------------------
_RTX3060 = _RTX30 + "rtx-3060-3060ti/"
_RTX3080 = _RTX30 + "rtx-3080-3080ti/"
_RTX30_ENTRIES = (
    _sheet("rtx3050", ("3050", "rtx-3050"), "NVIDIA GeForce RTX 3050", 8,
           _geforce(8, "GDDR6", _RTX30 + "rtx-3050/"), (8, 6), 20, _AMPERE),  # 2,560 CUDA cores
    _smi("rtx3060-12gb", ("rtx3060", "3060", "rtx-3060", "rtx-3060-12gb"), "NVIDIA GeForce RTX 3060", 12288,
         "nvidia-smi '1MiB / 12288MiB' (driver 580.95.05), "
         "https://github.com/geerlingguy/raspberry-pi-pcie-devices/issues/790", (8, 6), 28, _AMPERE),  # 3,584
    _sheet("rtx3060ti", ("3060ti", "rtx-3060-ti"), "NVIDIA GeForce RTX 3060 Ti", 8,
           _geforce(8, "GDDR6", _RTX3060), (8, 6), 38, _AMPERE),  # 4,864
    _torch("rtx3070", ("3070", "rtx-3070"), "NVIDIA GeForce RTX 3070", 8_589_410_304,
           _comfy(8_589_410_304, "NVIDIA GeForce RTX 3070", "https://github.com/kijai/ComfyUI-MochiWrapper/issues/87"),
           (8, 6), 46, _AMPERE),  # 5,888
    _sheet("rtx3070ti", ("3070ti", "rtx-3070-ti"), "NVIDIA GeForce RTX 3070 Ti", 8,
           _geforce(8, "GDDR6X", _RTX30), (8, 6), 48, _AMPERE),  # 6,144
    _sheet("rtx3080", ("3080", "rtx-3080", "rtx3080-10gb"), "NVIDIA GeForce RTX 3080", 10,
           _geforce(10, "GDDR6X", _RTX3080), (8, 6), 68, _AMPERE),  # 8,704
    _sheet("rtx3080-12gb", ("rtx-3080-12gb",), "NVIDIA GeForce RTX 3080", 12,
           _geforce(12, "GDDR6X", _RTX3080), (8, 6), 70, _AMPERE),  # 8,960
    _torch("rtx3080ti", ("3080ti", "rtx-3080-ti"), "NVIDIA GeForce RTX 3080 Ti", 12_884_377_600,
           _comfy(12_884_377_600, "NVIDIA GeForce RTX 3080 Ti",
                  "https://github.com/kijai/ComfyUI-HunyuanVideoWrapper/issues/120"), (8, 6), 80, _AMPERE),  # 10,240
    _sheet("rtx3090ti", ("3090ti", "rtx-3090-ti"), "NVIDIA GeForce RTX 3090 Ti", 24,
           _geforce(24, "GDDR6X", _RTX30 + "rtx-3090-3090ti/"), (8, 6), 84, _AMPERE),  # 10,752
)

# ---- GeForce RTX 40 (Ada, cc 8.9, 128 CUDA cores per SM) -------------------------------------------------------
_RTX4060 = _RTX40 + "rtx-4060-4060ti/"
_RTX4070 = _RTX40 + "rtx-4070-family/"
_RTX40_ENTRIES = (
    _sheet("rtx4060", ("4060", "rtx-4060"), "NVIDIA GeForce RTX 4060", 8, _geforce(8, "GDDR6", _RTX4060),
           (8, 9), 24, _ADA),  # 3,072 CUDA cores
    _sheet("rtx4060ti-8gb", ("rtx-4060-ti-8gb",), "NVIDIA GeForce RTX 4060 Ti", 8, _geforce(8, "GDDR6", _RTX4060),
           (8, 9), 34, _ADA),  # 4,352
    _torch("rtx4060ti-16gb", ("rtx-4060-ti-16gb", "4060ti-16gb"), "NVIDIA GeForce RTX 4060 Ti", 16380 * MiB,
           "torch total_memory 16380 MiB: Fooocus logs torch.cuda.mem_get_info()'s total as 'Total VRAM 16380 MB' "
           "(rounded to MiB) beside 'Device: cuda:0 NVIDIA GeForce RTX 4060 Ti' for a card its user calls "
           "'4060ti 16G', https://github.com/lllyasviel/Fooocus/issues/1604 (nvidia-smi pastes of this card show "
           "16380MiB too)", (8, 9), 34, _ADA),  # 4,352
    _sheet("rtx4070", ("4070", "rtx-4070"), "NVIDIA GeForce RTX 4070", 12, _geforce(12, "GDDR6X", _RTX4070),
           (8, 9), 46, _ADA),  # 5,888
    _sheet("rtx4070-super", ("4070-super", "rtx-4070-super"), "NVIDIA GeForce RTX 4070 SUPER", 12,
           _geforce(12, "GDDR6X", _RTX4070), (8, 9), 56, _ADA),  # 7,168
    _sheet("rtx4070ti", ("4070ti", "rtx-4070-ti"), "NVIDIA GeForce RTX 4070 Ti", 12,
           _geforce(12, "GDDR6X", _RTX4070), (8, 9), 60, _ADA),  # 7,680
    _torch("rtx4070ti-super", ("4070ti-super", "rtx-4070-ti-super"), "NVIDIA GeForce RTX 4070 Ti SUPER",
           17_170_956_288, _comfy(17_170_956_288, "NVIDIA GeForce RTX 4070 Ti SUPER",
                                  "https://github.com/EvilBT/ComfyUI_SLK_joy_caption_two/issues/55"),
           (8, 9), 66, _ADA),  # 8,448
    _sheet("rtx4080", ("4080", "rtx-4080"), "NVIDIA GeForce RTX 4080", 16, _geforce(16, "GDDR6X", _RTX40),
           (8, 9), 76, _ADA),  # 9,728
    _sheet("rtx4080-super", ("4080-super", "rtx-4080-super"), "NVIDIA GeForce RTX 4080 SUPER", 16,
           _geforce(16, "GDDR6X", _RTX40), (8, 9), 80, _ADA),  # 10,240
)

# ---- GeForce RTX 50 (Blackwell, cc 12.0, 128 CUDA cores per SM) ------------------------------------------------
_RTX5060 = _RTX50 + "rtx-5060-family/"
_RTX5070 = _RTX50 + "rtx-5070-family/"
_RTX50_ENTRIES = (
    _sheet("rtx5060", ("5060", "rtx-5060"), "NVIDIA GeForce RTX 5060", 8, _geforce(8, "GDDR7", _RTX5060),
           (12, 0), 30, _BLACKWELL),  # 3,840 CUDA cores
    _smi("rtx5060ti-16gb", ("rtx-5060-ti-16gb", "5060ti-16gb"), "NVIDIA GeForce RTX 5060 Ti", 16311,
         "nvidia-smi: 'nvidia-smi reports NVIDIA GeForce RTX 5060 Ti with 16311MiB' (16 GB card), "
         "https://github.com/akash-network/provider-configs/pull/87", (12, 0), 36, _BLACKWELL),  # 4,608
    _smi("rtx5070", ("5070", "rtx-5070"), "NVIDIA GeForce RTX 5070", 12227,
         "nvidia-smi '1731MiB / 12227MiB' (driver 575.64.03), https://github.com/shkhln/libc6-shim/issues/14",
         (12, 0), 48, _BLACKWELL),  # 6,144
    _torch("rtx5070ti", ("5070ti", "rtx-5070-ti"), "NVIDIA GeForce RTX 5070 Ti", 17_094_475_776,
           _comfy(17_094_475_776, "NVIDIA GeForce RTX 5070 Ti", "https://github.com/Comfy-Org/ComfyUI/issues/7126")
           + "; the same total in https://github.com/OpenImagingLab/FlashVSR/issues/24",
           (12, 0), 70, _BLACKWELL),  # 8,960
    _sheet("rtx5080", ("5080", "rtx-5080"), "NVIDIA GeForce RTX 5080", 16, _geforce(16, "GDDR7", _RTX50 + "rtx-5080/"),
           (12, 0), 84, _BLACKWELL),  # 10,752
)

# ---- RTX A-series workstation cards (Ampere GA10x, cc 8.6) and more datacenter GPUs -----------------------------
_MORE = (
    _smi("rtx-a4000", ("a4000", "rtxa4000"), "NVIDIA RTX A4000", 16376,
         "nvidia-smi '1MiB / 16376MiB' (driver 580.95.05), "
         "https://github.com/geerlingguy/raspberry-pi-pcie-devices/issues/791", (8, 6), 48, _AMPERE_PRO),  # 6,144
    _sheet("rtx-a4500", ("a4500", "rtxa4500"), "NVIDIA RTX A4500", 20,
           _geforce(20, "GDDR6", _PRO + "rtx-a4500/"), (8, 6), 56, _AMPERE_PRO),  # 7,168
    _smi("rtx-a5000", ("a5000", "rtxa5000"), "NVIDIA RTX A5000", 24564,
         "nvidia-smi --query-gpu 'NVIDIA RTX A5000, 24564 MiB, 570.211.01', "
         "https://github.com/akash-network/provider-configs/pull/83", (8, 6), 64, _AMPERE_PRO),  # 8,192
    _smi("p100-16gb", ("p100", "p100-pcie-16gb", "tesla-p100"), "Tesla P100-PCIE-16GB", 16384,
         "nvidia-smi '0MiB / 16384MiB' (Tesla P100-PCIE-16GB, driver 515.65.01), "
         "https://github.com/wookayin/gpustat/issues/130", (6, 0), 56,
         "SMs and cc: Tesla P100 (GP100) 56 SMs, compute capability 6.0, NVIDIA Tesla P100 whitepaper, "
         "https://images.nvidia.com/content/pdf/tesla/whitepaper/pascal-architecture-whitepaper.pdf"),
    _smi("a10", (), "NVIDIA A10", 23028,
         "nvidia-smi's figure (NVML memory total): 'Total': 24146608128 B = 23028 MiB for 'NVIDIA A10' "
         "(driver 535.129.03), https://github.com/mayooot/detect-gpu/issues/3", (8, 6), 72,
         "SMs: 9,216 CUDA cores on the NVIDIA A10 page (https://www.nvidia.com/en-us/data-center/products/a10-gpu/) "
         f"/ 128 per SM ({_GA102_PDF}); {_CUDA_GPUS}"),
)

# ---- AMD Instinct: PyTorch on ROCm. Listed for their capacity; estimates refuse them (device_catalog.py) --------
_AMD = (
    Entry("mi250", ("instinct-mi250",), "AMD Instinct MI250", 64 * GiB, DATASHEET,
          "datasheet, not measured: 128 GiB of HBM2e per MI250 module, " + _ROCM_SPECS + ", split over its two "
          "GCDs, 'each of which constitutes one GPU device in the system' (AMD Instinct MI250 microarchitecture, "
          "https://rocm.docs.amd.com/en/latest/reference/gpu-arch/mi250.html): 64 GiB per device torch sees",
          (9, 0), None, "gfx90a, GFXIP 9.0, 104 compute units per GCD: " + _ROCM_SPECS + "; bf16 (Matrix BF16, "
          "362.1 TFLOPS): https://rocm.docs.amd.com/en/latest/reference/gpu-arch/mi250.html", ROCM, "gfx90a"),
    Entry("mi300x", ("instinct-mi300x",), "AMD Instinct MI300X", 192 * GiB, DATASHEET,
          "datasheet, not measured: 192 GiB HBM3, " + _ROCM_SPECS
          + "; https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
          (9, 4), None, "gfx942, GFXIP 9.4, 304 compute units: " + _ROCM_SPECS + "; bf16: "
          "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html", ROCM, "gfx942"),
)

ENTRIES: tuple[Entry, ...] = _FIRST + _RTX20_ENTRIES + _RTX30_ENTRIES + _RTX40_ENTRIES + _RTX50_ENTRIES + _MORE + _AMD
