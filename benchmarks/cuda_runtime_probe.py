"""Measure, on a real GPU, the facts targets/cuda_runtime.py and targets/cudnn.py take from publications:
the CUDA context under each module-loading mode, what the first cuBLAS and cuDNN calls add outside the
caching allocator, and the workspaces cuDNN convolutions allocate through it.

    python benchmarks/cuda_runtime_probe.py > benchmarks/data/cuda_runtime_probe.jsonl

Each mode runs in a fresh process (CUDA_MODULE_LOADING is read when the context is created). "Outside
the allocator" is device memory in use (cudaMemGetInfo: total - free) minus torch.cuda.memory_reserved(),
so run it on an otherwise idle GPU. Workspaces are the allocator's own trace
(torch.cuda.memory._record_memory_history): blocks allocated and freed inside one convolution call.
Prints one JSON line per mode; records nothing when no GPU is present.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import json, torch
def outside():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()
def conv_workspaces(benchmark):
    torch.backends.cudnn.benchmark = benchmark
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
    x = torch.randn(32, 64, 56, 56, device="cuda", requires_grad=True)
    torch.cuda.memory._record_memory_history(max_entries=100000)
    conv(x).sum().backward()
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    sizes = {e["addr"]: e["size"] for e in trace if e["action"] == "alloc"}
    freed = [sizes[e["addr"]] for e in trace if e["action"] == "free_requested" and e["addr"] in sizes]
    im2col = 64 * 9 * 32 * 56 * 56 * 4
    return {"im2col_bytes": im2col, "transient_blocks": sorted(freed, reverse=True)[:6]}
row = {"mode": __import__("os").environ.get("CUDA_MODULE_LOADING"), "torch": torch.__version__,
       "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
       "gpu": torch.cuda.get_device_name(), "cc": ".".join(map(str, torch.cuda.get_device_capability()))}
torch.ones((1, 1), device="cuda")
row["context_after_ones"] = outside()
a = torch.randn(256, 256, device="cuda"); (a @ a).sum().item()
row["after_first_matmul"] = outside()
conv = torch.nn.Conv2d(3, 8, 3).cuda(); conv(torch.randn(1, 3, 8, 8, device="cuda")).sum().backward()
row["after_first_conv"] = outside()
row["conv_heuristic"] = conv_workspaces(False)
row["conv_benchmark"] = conv_workspaces(True)
print(json.dumps(row))
"""


def main() -> None:
    try:
        import torch
    except ImportError:
        sys.exit("torch is not installed")
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: nothing measured")
    for mode in ("LAZY", "EAGER"):
        env = {**os.environ, "CUDA_MODULE_LOADING": mode}
        done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
        print(done.stdout.strip() if done.returncode == 0 else json.dumps({"mode": mode, "error": done.stderr[-2000:]}))


if __name__ == "__main__":
    main()
