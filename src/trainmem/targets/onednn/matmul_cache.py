"""oneDNN's reduced-precision matmuls on the CPU: code and cache entries per distinct shape, kept for the run.

PyTorch sends a bf16 (fp16) mm/addmm/bmm/baddbmm on an AVX512 CPU to oneDNN (aten/src/ATen/native/mkldnn/
Matmul.cpp use_mkldnn_bf16_matmul: mkldnn_bf16_device_check wants AVX512 core; fp16 wants AVX512-FP16 or
AMX-FP16); fp32 goes to the BLAS. oneDNN creates a primitive per distinct problem (shapes, strides, data
types, post-ops), JIT-compiles its brgemm kernels and keeps the primitive in its cache
(ONEDNN_PRIMITIVE_CACHE_CAPACITY, 1024 entries by default, least recently used out), so each distinct shape a
run meets leaves resident memory behind that no tensor accounts for. Measured on an Intel Xeon (Sapphire
Rapids, torch 2.13.0+cpu, oneDNN 3.12, 2 threads): RSS grows by 2,117 KiB for each new batch size through
forward and backward of a bf16 bmm (three new primitives: the product and its two gradients), 2,074 KiB
for a bf16 nn.Linear (256 → 256), 2,004 KiB in fp16; capped with ONEDNN_MAX_CPU_ISA to oneDNN's
avx512_core_bf16 (AVX512-BF16 without AMX) 1,992 KiB, to avx512_core (AVX512 without bf16 instructions)
400 KiB (a bmm there: 181 KiB); fp32 (the BLAS) 6 KiB. Measured over 100 new shapes each (400 for Linear:
1,972, 1,842 and 400 KiB). The rule takes the largest figure of each path.
With ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 a new shape still leaves about 60% of that behind (the kernels' code is
held apart from the primitive cache), so the cache's capacity bounds only part of it: past the capacity this
rule keeps charging each shape in full, which is high, never low.

A fake trace sees every matmul with its shapes, so the distinct problems of a run are counted from the trace's
kernel calls; a model whose shapes change from step to step (routing in a mixture of experts) makes a new
problem each time, which two traced steps cannot show — the estimate says so where it counts them.
"""

from __future__ import annotations

from trainmem.targets.cpu_info import CpuInfo
from trainmem.trace.events import KernelCall, TensorMeta

MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm")
_KIB = 1024
# bytes per primitive: the measured growth per new shape over three primitives, by the ISA oneDNN runs
PER_PRIMITIVE = {"amx": 2117 * _KIB // 3, "avx512_core_bf16": 1992 * _KIB // 3, "avx512_core": 400 * _KIB // 3}
_REDUCED = ("bfloat16", "float16")


def isa_path(cpu: CpuInfo, dtype: str) -> str | None:
    """The oneDNN path a reduced-precision matmul takes on `cpu`, or None where PyTorch uses the BLAS."""
    if cpu.capability != "AVX512":
        return None  # mkldnn_bf16_device_check: AVX512 core (avx512bw, avx512vl, avx512dq) or none
    if dtype == "float16" and not (getattr(cpu, "avx512_fp16", False) or getattr(cpu, "amx", False)):
        return None
    if getattr(cpu, "amx", False):
        return "amx"
    return "avx512_core_bf16" if cpu.avx512_bf16 else "avx512_core"


def _signature(call: KernelCall) -> tuple:
    return (call.op,) + tuple((arg.shape, arg.dtype, arg.contiguous) if isinstance(arg, TensorMeta) else None
                              for arg in call.args if isinstance(arg, TensorMeta))


def resident_bytes(calls: list[KernelCall], cpu: CpuInfo) -> tuple[int, int, str | None]:
    """(bytes, distinct problems, the ISA path) the run's reduced-precision oneDNN matmuls leave resident."""
    problems: dict[tuple, str] = {}
    for call in calls:
        if call.op not in MATMUL_OPS:
            continue
        dtypes = {arg.dtype for arg in call.args if isinstance(arg, TensorMeta)}
        dtype = next((d for d in _REDUCED if d in dtypes), None)
        path = isa_path(cpu, dtype) if dtype else None
        if path is not None:
            problems.setdefault(_signature(call), path)
    if not problems:
        return 0, 0, None
    paths = set(problems.values())
    path = max(paths, key=lambda name: PER_PRIMITIVE[name])
    return len(problems) * PER_PRIMITIVE[path], len(problems), path
