"""What torch.distributed's runtime adds to a CPU training process's peak RSS, per rank and per strategy.

Each case starts fresh processes the way torchrun does (RANK, WORLD_SIZE, MASTER_ADDR/PORT, GLOO_SOCKET_IFNAME=lo);
every rank trains the CPU floor's model (mlp:8-8-2: Linear(8, 8), ReLU, Linear(8, 2); batch 1, Adam, two steps,
benchmarks/calibrate_cpu.py) wrapped as a user wraps it, and prints its peak RSS (/proc/self/status VmHWM). The
"plain" case is the same loop in one process without torch.distributed. The runtime's part of a strategy is the
median VmHWM of its ranks less the plain case's median: the tensors of this model are a few hundred bytes, so the
difference is gloo's process group (worker threads, socket pairs per peer, the TCP store) and whatever the wrapper
imports that the plain loop does not (the plain loop's optimizer step already imports torch._dynamo and sympy,
so that import is in the single-process floor and not counted again here). Threads per rank: cores // world size
(at least 1), as the measuring harness (measure/gloo_ranks.py) sets them; the plain case runs with the same count.

    .venv/bin/python benchmarks/distributed_runtime_rss.py [--runs 3]
        [--out src/trainmem/targets/data/distributed_runtime_rss.json]

Strategies: ddp (DistributedDataParallel), zero1 (DDP + ZeroRedundancyOptimizer(Adam)), fsdp (fully_shard on each
Linear, then the root), tp (DTensor: parallelize_module with ColwiseParallel / RowwiseParallel on a 1-D cpu mesh).
Imports nothing of trainmem (ground truth written independently of the estimate).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = (("ddp", 2), ("ddp", 4), ("fsdp", 2), ("fsdp", 4), ("zero1", 2), ("tp", 2))


def _hwm() -> int:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM"))


def _wrap(kind: str, model, world: int):
    import torch

    if kind == "ddp" or kind == "zero1":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        if kind == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    elif kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    elif kind == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _child(kind: str, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if kind != "plain":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model, optimizer = _wrap(kind, model, world) if kind != "plain" else (model, torch.optim.Adam(model.parameters()))
    for _ in range(2):
        loss = model(torch.randn(1, 8)).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(json.dumps({"kind": kind, "rank": int(os.environ.get("RANK", "0")), "hwm": _hwm(),
                      "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "dynamo_imported": "torch._dynamo" in sys.modules, "modules": len(sys.modules)}))
    if kind != "plain":
        torch.distributed.destroy_process_group()


def _launch(kind: str, world: int, threads: int) -> list[dict]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}
        procs.append(subprocess.Popen([sys.executable, "-P", __file__, "--child", kind, "--threads", str(threads)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    rows = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            raise SystemExit(f"{kind} ws{world}: rank failed (exit {proc.returncode}): {err.strip()[-400:]}")
        rows.append(json.loads(lines[-1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "src/trainmem/targets/data/distributed_runtime_rss.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.threads)
        return
    cores = os.cpu_count() or 1
    started = time.time()
    plain: dict[int, list[int]] = {}
    cases = []
    for kind, world in CASES:
        threads = max(1, cores // world)
        if threads not in plain:
            plain[threads] = [_launch("plain", 1, threads)[0]["hwm"] for _ in range(args.runs)]
            print(f"plain, {threads} thread(s): {plain[threads]}", flush=True)
        hwms = [row["hwm"] for _ in range(args.runs) for row in _launch(kind, world, threads)]
        base = int(statistics.median(plain[threads]))
        increment = int(statistics.median(hwms)) - base
        cases.append({"strategy": kind, "world_size": world, "threads": threads, "rank_hwm_bytes": hwms,
                      "plain_hwm_bytes": plain[threads], "increment_bytes": increment})
        print(f"{kind} ws{world}: ranks {hwms} → median {statistics.median(hwms) / 2**20:.1f} MiB, "
              f"plain {base / 2**20:.1f} MiB, increment {increment / 2**20:+.2f} MiB", flush=True)
    import torch

    data = {"command": f"python benchmarks/distributed_runtime_rss.py --runs {args.runs}", "runs": args.runs,
            "torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(), "cores": cores,
            "machine": f"{platform.machine()}, {platform.python_version()}", "date": time.strftime("%Y-%m-%d"),
            "seconds": round(time.time() - started, 1), "cases": cases}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
