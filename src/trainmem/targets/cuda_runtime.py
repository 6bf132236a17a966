"""What a CUDA process holds outside PyTorch's caching allocator: the CUDA context and the kernel images
of the libraries it loads. nvidia-smi shows these; torch.cuda.max_memory_reserved() does not.

The context is mostly kernel code. Before CUDA 11.7 the runtime loaded every module of a library into
the context when the library initialised (eager loading). From 11.7 the runtime can defer each kernel
until its first launch (lazy loading, `CUDA_MODULE_LOADING=LAZY`); PyTorch sets LAZY when the variable is
unset since 1.13 (pytorch/pytorch PR #86509), and CUDA made it the Linux default in 12.2
(https://docs.nvidia.com/cuda/cuda-programming-guide/04-special-topics/lazy-loading.html, "Change
History"). Libraries built with a runtime older than 11.7 load eagerly whatever the setting (same page,
"CUDA Runtime Version Requirement").

Every context figure below is a published measurement, less what the measuring script itself held in
the caching allocator (one segment: 2 MiB for a tensor of ≤ 1 MiB, 20 MiB for one of 1–10 MiB; c10's
CUDACachingAllocator.cpp get_allocation_size). Those scripts ran no matmul and no convolution, so the
kernel images of cuBLAS/cuBLASLt and cuDNN come on top: under eager loading, the device code of those
libraries for the GPU's architecture, measured from the libraries themselves
(benchmarks/cuda_library_images.py → data/cuda_library_images.json). No torch at import.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

from trainmem.errors import SetupError

MiB = 1024**2
LAZY, EAGER = "lazy", "eager"
LAZY_SINCE = (11, 7)
DEFAULT_CUDA = (12, 8)  # assumed when this torch is a CPU build (see default_cuda_version)


@dataclasses.dataclass(frozen=True)
class ContextFact:
    """The CUDA context for CUDA versions [since, until) under one loading mode: the point figure, the
    upper end of what was reported, and where each comes from."""

    since: tuple[int, int]
    until: tuple[int, int]
    loading: str
    point: int
    high: int
    source: str
    # the compute capabilities [low, high) the figure was measured for; None: any GPU (no per-arch figure)
    archs: tuple[tuple[int, int], tuple[int, int]] | None = None

    def covers(self, compute_capability: tuple[int, int]) -> bool:
        return self.archs is None or self.archs[0] <= tuple(compute_capability) < self.archs[1]


_PR_86509 = ("pytorch/pytorch PR #86509 (torch 1.13, CUDA 11.7): cudaMemGetInfo used after "
             "torch.randn(20,16,50,100).cuda() = {total:,} B, less the 20 MiB segment of that 6.4 MB tensor")
_LAZY_HIGH = 426 * MiB
_H200_CU130, _H200_CU130_HIGH = 851_443_712, 868_220_928  # measured: the Hopper CUDA 13 fact below
_LAZY_HIGH_SOURCE = ("high: 426 MiB in nvidia-smi after torch.cuda.mem_get_info() alone, torch 2.10+cu130, "
                     "RTX 6000 Ada (unslothai/unsloth-zoo PR #1053), the largest lazy-loading context reported; "
                     "'around 400MB' with CUDA >= 11.7 and lazy loading (pytorch/pytorch issue #109888)")

CONTEXT_FACTS: tuple[ContextFact, ...] = (
    ContextFact((0, 0), LAZY_SINCE, EAGER, 1343 * MiB - 2 * MiB, 1343 * MiB - 2 * MiB,
                "Hugging Face transformers guide 'Efficient Training on a Single GPU' (v4.21, "
                "perf_train_gpu_one.mdx): 1343 MiB used after torch.ones((1, 1)).to('cuda') on a V100, CUDA 11.2, "
                "less that tensor's 2 MiB segment; '>1000MB' before CUDA 11.7 (pytorch/pytorch issue #107667)"),
    ContextFact(LAZY_SINCE, (99, 0), EAGER, 666_632_192 - 20 * MiB, 666_632_192 - 20 * MiB,
                _PR_86509.format(total=666_632_192) + " (CUDA_MODULE_LOADING=DEFAULT, i.e. eager on 11.7)"),
    ContextFact(LAZY_SINCE, (12, 0), LAZY, 287_047_680 - 20 * MiB, _LAZY_HIGH,
                _PR_86509.format(total=287_047_680) + "; " + _LAZY_HIGH_SOURCE),
    ContextFact((12, 0), (13, 0), LAZY, 256 * MiB, _LAZY_HIGH,
                "256 MiB in nvidia-smi for a process holding only its context, torch 2.7.1+cu128, RTX 3090 "
                "(invoke-ai/InvokeAI issue #9413); " + _LAZY_HIGH_SOURCE),
    ContextFact((13, 0), (99, 0), LAZY, 426 * MiB, _LAZY_HIGH,
                "426 MiB in nvidia-smi after torch.cuda.mem_get_info() alone, torch 2.10+cu130, RTX 6000 Ada "
                "(unslothai/unsloth-zoo PR #1053); the only CUDA 13 figure found below Hopper, so point and high "
                "coincide", archs=((0, 0), (9, 0))),
    # Hopper and newer under CUDA 13, measured on an H200 (compute capability 9.0), torch 2.11.0+cu130, CUDA 13.0,
    # driver 580.159.04 (benchmarks/gpu_measure_distributed.py → benchmarks/data/gpu_measurements.jsonl, 2026-12-04):
    # the context alone (cudaMemGetInfo total - free right after torch.cuda.mem_get_info(), idle GPU) is
    # 552,402,944 B in every world-size-1 row (`device_used_bytes_start`); after 3 Adam steps the process holds
    # 851,443,712 B beyond max_memory_reserved in every fp32 row over gloo (MLP and GPT-2, DDP, ZeRO-1 and FSDP2
    # alike; gloo makes no device allocation outside the caching allocator) and 868,220,928 B in the bf16-mixed
    # GPT-2 rows: lazy loading adds the kernels the step launches (299,040,768 B) to the context. The point is the
    # fp32 figure, the high the bf16 one. Newer architectures (no figure) take it too: the largest measured.
    ContextFact((13, 0), (99, 0), LAZY, _H200_CU130, _H200_CU130_HIGH,
                "552,402,944 B at context creation and 851,443,712 B (812 MiB) beyond max_memory_reserved after 3 Adam "
                "steps (the kernels loaded lazily on top), high 868,220,928 B (bf16-mixed GPT-2): torch 2.11.0+cu130, "
                "H200, driver 580 (benchmarks/data/gpu_measurements.jsonl, benchmarks/gpu_measure_distributed.py)",
                archs=((9, 0), (99, 0))),
)


# Kernel images of the libraries a run initialises, measured from the real libraries of the nvidia-*
# wheels (benchmarks/cuda_library_images.py): per GPU architecture, the loadable sections (.text,
# .nv.constant, .nv.global) of the cubin the driver picks for each module. Under eager loading a library
# loads all of them when it first calls into the CUDA runtime (cublasCreate, cudnnCreate), after the
# context figures above were taken (those scripts ran no matmul and no convolution), so they add to it.
# The cubin sections are a lower bound of what the driver allocates for a module (it also aligns them
# and keeps per-module state; no published figure for that overhead was found).
IMAGES = Path(__file__).parent / "data" / "cuda_library_images.json"
PACKAGES = {  # library → package measured, by CUDA major version (CUDA 10 and 11 both take the 11.x build)
    "cuBLAS/cuBLASLt": {11: "nvidia-cublas-cu11", 12: "nvidia-cublas-cu12", 13: "nvidia-cublas"},
    "cuDNN": {11: "nvidia-cudnn-cu11", 12: "nvidia-cudnn-cu12", 13: "nvidia-cudnn-cu13"},
}
# cuDNN's RNN / multi-head-attention sub-library (libcudnn_adv*) loads only when those APIs are called,
# which the trace does not tell apart here: it is in the high figure, not the point.
OPTIONAL_PREFIX = "libcudnn_adv"
USED_WHEN = {"cuBLAS/cuBLASLt": "matmul ops", "cuDNN": "convolution, batch-norm, RNN ops"}


@dataclasses.dataclass(frozen=True)
class LibraryImage:
    """The device code one library loads under eager module loading on one GPU architecture."""

    name: str
    point: int  # the sub-libraries every use of the library loads
    high: int  # and those some uses load (cuDNN's adv)
    source: str


@functools.lru_cache(maxsize=1)
def _measured() -> dict:
    return json.loads(IMAGES.read_text())


def _arch_key(compute_capability: tuple[int, int], rows: dict) -> str | None:
    """The measured arch for this GPU: its own, else the newest of its major version below it (the
    driver runs a same-major cubin on a newer minor)."""
    sm = compute_capability[0] * 10 + compute_capability[1]
    arches = [int(k[3:]) for k in rows if int(k[3:]) // 10 == sm // 10 and int(k[3:]) <= sm]
    return f"sm_{max(arches)}" if arches else None


def library_image(name: str, cuda_version: tuple[int, int],
                  compute_capability: tuple[int, int]) -> LibraryImage | None:
    """The measured image of `name` for the closest measured build of this CUDA major version and this
    GPU; None when no build measured has code for it."""
    package = PACKAGES[name][min(max(cuda_version[0], 11), 13)]
    records = [r for r in _measured()["libraries"] if r["package"].split("==")[0] == package]
    key = _arch_key(compute_capability, records[0]["arches"]) if records else None
    rows = [(r, r["arches"][key]) for r in records] if key else []
    if not any(row["modules"] for _r, row in rows):
        return None
    point = sum(row["loaded_bytes"] for r, row in rows if not r["library"].startswith(OPTIONAL_PREFIX))
    ptx = sum(row["ptx_only"] for _r, row in rows)
    source = (f"{records[0]['package']}, {key} cubins"
              + (f" ({ptx} PTX-only modules JIT-compiled, not sized)" if ptx else "")
              + "; benchmarks/results/cuda_library_images.md")
    return LibraryImage(name, point, sum(row["loaded_bytes"] for _r, row in rows), source)


def library_bytes(used: dict[str, bool], runtime: CudaRuntime,
                  compute_capability: tuple[int, int]) -> tuple[int, int, list[str]]:
    """(point, high, notes): the kernel images the run's libraries add to nvidia-smi. Under eager loading,
    each used library's whole image for this GPU. Under lazy loading only the kernels launched load: at most
    the whole image, but which kernels cuBLAS/cuDNN pick depends on their heuristics, so nothing is added to
    the point, and the high keeps the context range (the notes give the bound that was not added)."""
    point = high = 0
    notes = []
    for name in ("cuBLAS/cuBLASLt", "cuDNN"):
        if not used.get(name):
            continue
        image = library_image(name, runtime.cuda_version, compute_capability)
        head = f"{name} kernel images ({USED_WHEN[name]})"
        if image is None:
            notes.append(f"{head}: no measured build has code for compute capability "
                         f"{compute_capability[0]}.{compute_capability[1]}; not sized, so the figures are low by it")
        elif runtime.module_loading == EAGER:
            point, high = point + image.point, high + image.high
            notes.append(f"{head}: {image.point:,} B (high {image.high:,} B) loaded at handle creation under eager "
                         f"module loading ({image.source}); a lower bound of the driver's allocation")
        else:
            notes.append(f"{head}: lazy module loading loads only the kernels launched, at most {image.high:,} B "
                         f"({image.source}); not added: which kernels load depends on the library's heuristics")
    if used.get("NCCL"):
        notes.append("NCCL kernel images (collectives (multi-GPU)): 0 B — a single-GPU run creates no "
                     "communicator (torch.distributed is not initialised): zero")
    return point, high, notes


@dataclasses.dataclass(frozen=True)
class CudaRuntime:
    """The target run's CUDA stack: version, module loading, cuDNN benchmark mode."""

    cuda_version: tuple[int, int]
    module_loading: str
    cudnn_benchmark: bool
    version_source: str

    @property
    def label(self) -> str:
        bench = "on" if self.cudnn_benchmark else "off"
        return (f"CUDA {self.cuda_version[0]}.{self.cuda_version[1]} ({self.version_source}), "
                f"{self.module_loading} module loading, cudnn.benchmark {bench}")

    def to_dict(self) -> dict[str, object]:
        return {"cuda_version": f"{self.cuda_version[0]}.{self.cuda_version[1]}",
                "cuda_version_source": self.version_source, "module_loading": self.module_loading,
                "cudnn_benchmark": self.cudnn_benchmark}


def parse_cuda_version(text: str) -> tuple[int, int]:
    parts = str(text).strip().split(".")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise SetupError(f"expected a CUDA version MAJOR.MINOR (e.g. 12.4), got {text!r}", where="--cuda-version")
    major, minor = int(parts[0]), int(parts[1])
    if not 8 <= major <= 98:
        raise SetupError(f"expected a CUDA version from 8.0 on, got {text!r}", where="--cuda-version")
    return major, minor


def default_cuda_version() -> tuple[tuple[int, int], str]:
    """This torch's CUDA; a CPU build has none, and then 12.8 is assumed (every CUDA 12 release gives
    the same figures here)."""
    import torch

    if torch.version.cuda:
        return parse_cuda_version(torch.version.cuda), f"this torch's CUDA, torch {torch.__version__}"
    return DEFAULT_CUDA, "assumed: this torch is a CPU build; pass --cuda-version"


def resolve_runtime(cuda_version: str | None, module_loading: str | None,
                    cudnn_benchmark: bool | None) -> CudaRuntime:
    if cuda_version is None:
        version, source = default_cuda_version()
    else:
        version, source = parse_cuda_version(cuda_version), "given with --cuda-version"
    loading = LAZY if module_loading is None else str(module_loading).strip().lower()
    if loading not in (LAZY, EAGER):
        raise SetupError(f"expected --module-loading lazy or eager, got {module_loading!r}", where="--module-loading")
    if loading == LAZY and version < LAZY_SINCE:
        if module_loading is not None:
            raise SetupError(f"expected CUDA 11.7 or newer for lazy module loading, got CUDA "
                             f"{version[0]}.{version[1]}", where="--module-loading")
        loading = EAGER  # nothing to choose: older runtimes load every module eagerly
    return CudaRuntime(version, loading, bool(cudnn_benchmark), source)


def context_fact(runtime: CudaRuntime, compute_capability: tuple[int, int] | None = None) -> ContextFact:
    """The context figure for this CUDA version and module loading on a GPU of `compute_capability`; when the
    caller does not name the GPU and the version has figures for several architectures, the largest (never low)."""
    facts = [fact for fact in CONTEXT_FACTS
             if fact.loading == runtime.module_loading and fact.since <= runtime.cuda_version < fact.until]
    if compute_capability is not None:
        facts = [fact for fact in facts if fact.covers(compute_capability)]
    if facts:
        return max(facts, key=lambda fact: fact.point)
    raise SetupError(f"expected a CUDA version with a known context size, got {runtime.label}",
                     where="--cuda-version")
