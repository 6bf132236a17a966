"""What a bf16 matmul allocates inside itself on this CPU, for a future kernel rule (not modelled yet).

On a CPU with AMX (or AVX512-BF16), torch runs a bf16 addmm/mm through oneDNN's brgemm matmul, which allocates a
scratch buffer inside the op (packed operands and accumulators) and frees it before returning: the profiler sees
it, the dispatcher does not. fp32 matmuls on the same machine allocate nothing inside. trainmem's CPU kernel rules
do not model it yet, so a peak that falls on such a matmul is low by it (benchmarks/results/trainers_cpu.md: the
MLP under a Lightning Trainer at bf16-mixed).

    python benchmarks/onednn_matmul_scratch.py      # prints a table, writes benchmarks/data/onednn_matmul_scratch.jsonl

Each row: one warm-up call, then one profiled call; the allocations inside the op besides its output. The data file
keeps the rows of every CPU measured: a run replaces only the rows of its own CPU (vendor, model name, ISA path).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [(256, 1000, 100), (256, 100, 100), (256, 100, 10), (256, 1024, 128), (256, 2048, 128), (256, 1024, 256),
          (512, 1024, 128), (128, 1024, 128), (1, 1024, 128), (256, 1000, 1000), (64, 64, 64), (1024, 4096, 4096)]


def inside(m: int, k: int, n: int, dtype: torch.dtype, bias: bool) -> list[int]:
    """Bytes of each allocation a [m, k] x [k, n] matmul makes besides its output, in order."""
    weight, x, b = torch.randn(n, k, dtype=dtype), torch.randn(m, k, dtype=dtype), torch.randn(n, dtype=dtype)

    def call() -> torch.Tensor:
        return torch.addmm(b, x, weight.t()) if bias else torch.mm(x, weight.t())

    call()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    sizes = [e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.nbytes() > 0]
    return sizes[1:]  # the first is the output


def cpu_fields(text: str) -> dict:
    """The first processor's vendor_id, cpu family, model and model name from /proc/cpuinfo's text."""
    fields: dict = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("vendor_id", "cpu family", "model", "model name") and key not in fields:
            fields[key] = value.strip()
    return fields


def main() -> None:
    flags = open("/proc/cpuinfo").read() if Path("/proc/cpuinfo").exists() else ""
    isa = "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "other"
    here = cpu_fields(flags)
    machine = {"vendor": here.get("vendor_id", ""), "cpu_family": here.get("cpu family", ""),
               "cpu_model": here.get("model", ""), "model_name": here.get("model name", "")}
    rows = []
    print(f"{'m':>5} {'k':>5} {'n':>5}  {'bf16 addmm':>12} {'bf16 mm':>12} {'fp32 addmm':>12}")
    for m, k, n in SHAPES:
        row = {"m": m, "k": k, "n": n, "bf16_addmm": inside(m, k, n, torch.bfloat16, True),
               "bf16_mm": inside(m, k, n, torch.bfloat16, False), "fp32_addmm": inside(m, k, n, torch.float32, True),
               "isa": isa, "capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
               "torch": torch.__version__, "cpu": platform.processor() or "x86_64", **machine}
        rows.append(row)
        print(f"{m:>5} {k:>5} {n:>5}  {sum(row['bf16_addmm']):>12,} {sum(row['bf16_mm']):>12,} "
              f"{sum(row['fp32_addmm']):>12,}")
    path = ROOT / "benchmarks" / "data" / "onednn_matmul_scratch.jsonl"
    old = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    def key(row: dict) -> tuple:  # rows recorded before the vendor was: Intel's (the first file was measured there)
        return row.get("vendor", "GenuineIntel"), row.get("model_name", ""), row["isa"]
    kept = [row for row in old if key(row) != key(rows[0])]
    with open(path, "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in kept + rows)


if __name__ == "__main__":
    main()
