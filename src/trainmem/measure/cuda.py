"""Ground truth on a GPU: the three numbers people compare with, recorded in the child process.

- allocated / reserved: torch.cuda.max_memory_allocated() / max_memory_reserved() after the steps,
  peaks since the process started (nothing is reset: the first step is part of the run);
- process: the process's used_memory in `nvidia-smi --query-compute-apps`, read after the steps while
  the caching allocator still holds its segments, so it is reserved + CUDA context + library handles;
- the GPU's name, capacity (total_memory), compute capability, driver, CUDA and torch versions, and
  PYTORCH_CUDA_ALLOC_CONF, so that every row says what it was measured with.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any
from collections.abc import Callable

from trainmem.errors import MeasureError


def _nvidia_smi(query: str, what: str) -> list[list[str]]:
    try:
        done = subprocess.run(["nvidia-smi", f"--query-{what}={query}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.strip().splitlines() if line.strip()]


def process_used_bytes(pid: int) -> int | None:
    """This process's GPU memory as nvidia-smi lists it (MiB), or None where it cannot be read
    (inside some containers nvidia-smi does not see the process)."""
    for row in _nvidia_smi("pid,used_memory", "compute-apps"):
        if len(row) == 2 and row[0] == str(pid) and row[1].isdigit():
            return int(row[1]) * 2**20
    return None


def gpu_facts() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    rows = _nvidia_smi("driver_version,memory.total", "gpu")
    return {"gpu": props.name, "total_memory_bytes": props.total_memory,
            "compute_capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
            "torch": torch.__version__, "driver": rows[0][0] if rows else None,
            "nvidia_smi_total_bytes": int(rows[0][1]) * 2**20 if rows and rows[0][1].isdigit() else None,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")}


def measure_cuda_steps(train: Callable[[], Any]) -> dict[str, Any]:
    """Run `train()` with CUDA as the default device; return the peaks and the GPU's facts."""
    import torch

    if not torch.cuda.is_available():
        raise MeasureError("expected a CUDA device for --device cuda, found none "
                           f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})", where="measure")
    with torch.device("cuda"):
        prepared = train()  # kept alive until the figures are read
    torch.cuda.synchronize()
    result = {"max_memory_allocated": torch.cuda.max_memory_allocated(),
              "max_memory_reserved": torch.cuda.max_memory_reserved(),
              "process_bytes": process_used_bytes(os.getpid()),
              "parameters": sum(p.numel() for p in prepared.model.parameters()), **gpu_facts()}
    return result


def measure_on_gpu(model_ref: str, setup, device: str, **options: Any) -> dict[str, Any]:
    """`trainmem measure --device cuda|<gpu>`: the steps for real on this machine's GPU (a fresh process),
    beside the estimate for that GPU, as one JSON-able dict. `device` "cuda" estimates for the GPU found
    (its total memory and compute capability); a catalog name estimates for that entry."""
    import torch

    from trainmem.estimate import estimate
    from trainmem.measure.single_process import run_child

    if not isinstance(model_ref, str):
        raise MeasureError("expected a model reference string (a module object cannot be rebuilt in a fresh "
                           "process)", where="measure")
    if not torch.cuda.is_available():
        raise MeasureError(f"expected a CUDA GPU on this machine for measure --device {device}, found none "
                           f"(torch {torch.__version__})", where="--device")
    measured = run_child(model_ref, setup, "cuda")
    target = device
    if device == "cuda":
        target = f"custom:capacity={measured['total_memory_bytes']}B,cc={measured['compute_capability']}"
    est = estimate(model_ref, setup=setup, device=target, target_options=options)
    figures = {"allocated_bytes": ("max_memory_allocated", est.allocated_bytes),
               "reserved_bytes": ("max_memory_reserved", est.reserved_bytes),
               "process_bytes": ("process_bytes", est.process_bytes)}
    errors = {key: (value / measured[name] - 1 if measured.get(name) else None)
              for key, (name, value) in figures.items()}
    return {"model": model_ref, "setup": setup.to_dict(), "measured": measured,
            "estimated": {key: value for key, (_, value) in figures.items()}, "error": errors}
