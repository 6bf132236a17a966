"""What a CUDA process holds outside PyTorch's caching allocator: the CUDA context and the kernel images
of the libraries it loads. nvidia-smi shows these; torch.cuda.max_memory_reserved() does not.

The context is mostly kernel code. Before CUDA 11.7 the runtime loaded every module of a library into
the context when the library initialised (eager loading). From 11.7 the runtime can defer each kernel
until its first launch (lazy loading, `CUDA_MODULE_LOADING=LAZY`); PyTorch sets LAZY when the variable is
unset since 1.13 (pytorch/pytorch PR #86509), and CUDA made it the Linux default in 12.2
(https://docs.nvidia.com/cuda/cuda-programming-guide/04-special-topics/lazy-loading.html, "Change
History"). Libraries built with a runtime older than 11.7 load eagerly whatever the setting (same page,
"CUDA Runtime Version Requirement").

Every figure below is a published measurement, less what the measuring script itself held in the
caching allocator (one segment: 2 MiB for a tensor of ≤ 1 MiB, 20 MiB for one of 1–10 MiB; c10's
CUDACachingAllocator.cpp get_allocation_size). No torch at import.
"""

from __future__ import annotations

import dataclasses

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


_PR_86509 = ("pytorch/pytorch PR #86509 (torch 1.13, CUDA 11.7): cudaMemGetInfo used after "
             "torch.randn(20,16,50,100).cuda() = {total:,} B, less the 20 MiB segment of that 6.4 MB tensor")
_LAZY_HIGH = 426 * MiB
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
                "(unslothai/unsloth-zoo PR #1053); the only CUDA 13 figure found, so point and high coincide"),
)


@dataclasses.dataclass(frozen=True)
class LibraryRule:
    """A library whose kernel images a training run may load into the context, and what is known."""

    name: str
    used_when: str
    point: int
    note: str


LIBRARY_RULES: tuple[LibraryRule, ...] = (
    LibraryRule("cuBLAS/cuBLASLt", "matmul ops", 0,
                "kernel images load at first launch (lazy) or at handle creation (eager); no public "
                "per-library measurement was found, so they are a stated zero beyond the context figure"),
    LibraryRule("cuDNN", "convolution, batch-norm, RNN ops", 0,
                "kernel images load at first launch (lazy) or at handle creation (eager); no public "
                "per-library measurement was found, so they are a stated zero beyond the context figure"),
    LibraryRule("NCCL", "collectives (multi-GPU)", 0,
                "a single-GPU run creates no communicator (torch.distributed is not initialised): zero"),
)


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


def context_fact(runtime: CudaRuntime) -> ContextFact:
    for fact in CONTEXT_FACTS:
        if fact.loading == runtime.module_loading and fact.since <= runtime.cuda_version < fact.until:
            return fact
    raise SetupError(f"expected a CUDA version with a known context size, got {runtime.label}",
                     where="--cuda-version")


def library_notes(used: dict[str, bool], loading: str = LAZY) -> list[str]:
    """One line per library the run loads (`used`: library name -> loaded), with its stated figure. Under
    eager loading a library's whole kernel image for the GPU loads at handle creation, so the stated zero
    is a known under-count there (the eager-minus-lazy gap of libtorch's own kernels alone is 380 MB in
    pytorch/pytorch PR #86509)."""
    lines = [f"{rule.name} kernel images ({rule.used_when}): {rule.point:,} B — {rule.note}"
             for rule in LIBRARY_RULES if used.get(rule.name)]
    if loading == EAGER and any(used.get(name) for name in ("cuBLAS/cuBLASLt", "cuDNN")):
        lines.append("eager module loading: cuBLAS/cuDNN load every kernel for this GPU at handle creation; "
                     "that image is not sized here, so process_bytes and process_bytes_high are low by it")
    return lines
