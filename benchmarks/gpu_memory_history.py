"""On a GPU: the caching allocator's own history (torch.cuda.memory._record_memory_history) of plain PyTorch
training loops, written as a user writes them (no trainmem code), dumped as memory_viz pickles for comparison
with `trainmem estimate --memory-snapshot` of the same setup, entry by entry.

    python benchmarks/gpu_memory_history.py OUT_DIR     # one pickle per case + one JSON line per case on stdout

Cases: an fp32 MLP 2048-8192-8192-8192-1000 at batch 8192 under Adam, three steps of PyTorch's tutorial loop (the
single-GPU form of benchmarks/gpu_measure_distributed.py's mlp rows, whose allocated peak the estimate misses by
about 130 MiB), and the same loop on Linear(1024, 1024) → ReLU → Linear(1024, 10) at batch 8.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path

import torch


def mlp(widths: list[int]) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def run(name: str, widths: list[int], batch: int, steps: int, out: Path) -> dict:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    model = mlp(widths).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(steps):  # PyTorch's tutorial loop: every name lives until the next iteration rebinds it
        inputs = torch.randn(batch, widths[0], device="cuda")
        targets = torch.randint(0, widths[-1], (batch,), device="cuda")
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    path = out / f"history_{name}.pickle"
    with open(path, "wb") as handle:
        pickle.dump(torch.cuda.memory._snapshot(), handle)
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()
    row = {"case": name, "widths": widths, "batch": batch, "steps": steps, "optimizer": "adam", "loop": "inline",
           "max_memory_allocated": stats["allocated_bytes.all.peak"], "requested_peak": stats["requested_bytes.all.peak"],
           "max_memory_reserved": stats["reserved_bytes.all.peak"], "pickle": path.name}
    del model, optimizer, inputs, targets, outputs, loss
    return row


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return 1
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
           "compute_capability": f"{props.major}.{props.minor}", "date": time.strftime("%Y-%m-%d")}
    for name, widths, batch in (("mlp8192", [2048, 8192, 8192, 8192, 1000], 8192), ("mlp1024", [1024, 1024, 10], 8)):
        print(json.dumps({**env, **run(name, widths, batch, 3, out)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
