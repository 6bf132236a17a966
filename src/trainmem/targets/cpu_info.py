"""The facts about the CPU that the CPU target's kernel rules depend on, read in one place.

oneDNN picks its kernels by instruction set (the capability decides the channel block: 16 on
AVX512, 8 on AVX2) and sizes its per-thread scratchpads by the thread count, which is PyTorch's
intra-op thread count (oneDNN's `dnnl_get_max_threads()` under PyTorch's OpenMP runtime). The rules
take both as an explicit `CpuInfo`, so an estimate for another machine is a different `CpuInfo`,
not a different process.
"""

from __future__ import annotations

import dataclasses

from trainmem.targets.onednn.version import OneDnnVersion


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX512", "AVX2", "DEFAULT", ...
    threads: int  # torch.get_num_threads()
    # the oneDNN release whose kernels the rules size (its RNN layout changed between releases,
    # targets/onednn/rnn_layout.py); None: the one the running torch bundles (onednn/version.py)
    onednn_version: OneDnnVersion | None = None
    # AVX512-BF16 (oneDNN's avx512_core_bf16; torch.cpu._is_avx512_bf16_supported()). oneDNN's bf16 RNN
    # runs on brgemm kernels only with it (rnn_brgemm_utils.cpp brgemm_calc_isa asks for avx512_core_bf16);
    # an AVX512 CPU without it (Skylake-X, Ice Lake) falls back to the ref (gemm) path, whose buffers differ
    # (targets/onednn/rnn_transients.py). Default True: the brgemm figures were profiled on such a CPU.
    avx512_bf16: bool = True

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"a CPU runs at least one thread, got threads={self.threads}")

    @classmethod
    def this_machine(cls) -> CpuInfo:
        """The running process's capability, intra-op thread count and bf16 instructions, as its kernels
        will see them."""
        import torch

        return cls(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), avx512_bf16=_has_avx512_bf16())


def _has_avx512_bf16() -> bool:
    """Whether this CPU has AVX512-BF16, as torch (2.1 and later) reports it, else as /proc/cpuinfo lists it."""
    import torch

    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    if probe is not None:
        return bool(probe())
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            return any(line.startswith("flags") and "avx512_bf16" in line.split() for line in cpuinfo)
    except OSError:
        return False
