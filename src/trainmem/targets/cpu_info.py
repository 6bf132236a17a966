"""The facts about the CPU that the CPU target's kernel rules depend on, read in one place.

oneDNN picks its kernels by instruction set (the capability decides the channel block: 16 on
AVX512, 8 on AVX2) and sizes its per-thread scratchpads by the thread count, which is PyTorch's
intra-op thread count (oneDNN's `dnnl_get_max_threads()` under PyTorch's OpenMP runtime). The rules
take both, and the instruction sets that switch kernels (AVX512-BF16, AMX), as an explicit
`CpuInfo`, so an estimate for another machine is a different `CpuInfo`, not a different process.
`CpuInfo.this_machine()` reads them from torch and /proc/cpuinfo (once), less what oneDNN's
ONEDNN_MAX_CPU_ISA switches off.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable

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
    # AMX (oneDNN's avx512_core_amx: amx_tile, amx_int8, amx_bf16 and AVX512-FP16; Sapphire Rapids on). oneDNN's
    # bf16 RNN brgemm kernels then block K by 32, may use N blocks of 64 and book a per-thread accumulator
    # (rnn_brgemm_utils.cpp brgemm_calc_isa / init_scratchpad). Default False: the brgemm figures above
    # were profiled on an AVX512-BF16 CPU without AMX.
    amx: bool = False
    # Recorded so that an estimate names the CPU it is for; no rule reads these yet (oneDNN's f16 kernels
    # key on avx512_core_fp16 / AMX-FP16, its int8 ones on avx512_core_vnni). The defaults are those of an
    # AVX512-BF16 CPU without AMX.
    avx512_fp16: bool = False
    avx512_vnni: bool = True
    vendor: str = "GenuineIntel"  # /proc/cpuinfo vendor_id: "GenuineIntel", "AuthenticAMD", ...
    # /proc/cpuinfo's "cpu family/model", e.g. "26/2" (an AMD Zen 5 EPYC), "" when unknown. No kernel rule reads it:
    # it tells apart the bundled calibrations of machines that share vendor and instruction sets (the process floor
    # moved by 6.8 MiB between two such AMD EPYCs, targets/calibrations.py)
    model_id: str = ""

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"a CPU runs at least one thread, got threads={self.threads}")

    @classmethod
    def this_machine(cls) -> CpuInfo:
        """The running process's capability, intra-op thread count and instruction sets, as its kernels
        will see them: torch's own probes (torch.cpu.get_capabilities, cpuinfo-based) where it has them,
        /proc/cpuinfo's flags otherwise."""
        import torch

        has = _instruction_sets()
        cap = _onednn_max_isa()
        bf16 = has("avx512_bf16") and cap not in _CAPS_BELOW_BF16
        return cls(
            torch.backends.cpu.get_cpu_capability(),
            torch.get_num_threads(),
            avx512_bf16=bf16,
            # cpu_isa_traits.hpp mayiuse(avx512_core_amx): amx_tile, amx_int8 and amx_bf16 on top of
            # avx512_core_fp16 (avx512_fp16, avx512_core_bf16, avx_vnni)
            amx=bf16 and all(map(has, ("amx_tile", "amx_int8", "amx_bf16", "avx512_fp16", "avx_vnni")))
            and (cap in ("", "all") or "amx" in cap),
            avx512_fp16=has("avx512_fp16"),
            avx512_vnni=has("avx512_vnni"),
            vendor=proc_cpuinfo()[1],
            model_id=proc_cpuinfo()[2],
        )


# ONEDNN_MAX_CPU_ISA values (cpu_isa_traits.cpp init_max_cpu_isa, lower-cased) that leave oneDNN without
# avx512_core_bf16; any value without "amx" in it (other than "all") leaves it without AMX.
_CAPS_BELOW_BF16 = frozenset({"sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2", "avx512_core", "avx512_core_vnni"})


def _onednn_max_isa() -> str:
    """oneDNN's ISA cap from the environment (utils.cpp getenv_string_user: ONEDNN_ then DNNL_), or ""."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        if os.environ.get(name):
            return os.environ[name].lower()
    return ""


# torch.cpu's older per-flag probes (torch 2.1 to 2.x, before get_capabilities), by /proc/cpuinfo flag
_TORCH_PROBES = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_tile": "_is_amx_tile_supported",
                 "avx512_vnni": "_is_vnni_supported"}


def _instruction_sets() -> Callable[[str], bool]:
    """`has(flag)` for a /proc/cpuinfo flag name, answered by torch where it probes that flag."""
    import torch

    probe = getattr(torch.cpu, "get_capabilities", None)
    capabilities = dict(probe()) if probe is not None else {}
    flags = proc_cpuinfo()[0]

    def has(flag: str) -> bool:
        if flag in capabilities:
            return bool(capabilities[flag])
        older = getattr(torch.cpu, _TORCH_PROBES.get(flag, ""), None)
        return bool(older()) if older is not None else flag in flags

    return has


@functools.lru_cache(maxsize=1)
def proc_cpuinfo() -> tuple[frozenset[str], str, str]:
    """The first processor's flags, vendor_id and "cpu family/model" in /proc/cpuinfo (empty, "unknown" and ""
    where there is none)."""
    flags: frozenset[str] = frozenset()
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("vendor_id", "cpu family", "model"):
                    fields.setdefault(key, value.strip())
                elif key == "flags":
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    model_id = f"{fields['cpu family']}/{fields['model']}" if "cpu family" in fields and "model" in fields else ""
    return flags, fields.get("vendor_id", "unknown"), model_id
