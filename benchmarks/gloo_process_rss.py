"""What a process's RSS gains from torch.distributed itself on the CPU: `init_process_group("gloo")` and the first
DistributedDataParallel / fully_shard (whose construction imports torch._dynamo, sympy and the rest), measured as
VmRSS deltas in fresh processes of world size 1 around a Linear(4, 4).

    .venv/bin/python benchmarks/gloo_process_rss.py [--runs 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys


def _rss() -> int:
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS"))


def _child(kind: str) -> None:
    import torch
    import torch.distributed as dist

    before = _rss()
    dist.init_process_group("gloo", rank=0, world_size=1)
    after_init = _rss()
    model = torch.nn.Linear(4, 4)
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
    print(f"{kind} {after_init - before} {_rss() - after_init} {len(sys.modules)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    print("| wrapper | run | init_process_group gloo (MiB) | first wrap (MiB) | modules after |")
    print("|---|---:|---:|---:|---:|")
    for kind in ("ddp", "fsdp"):
        for run in range(args.runs):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            out = subprocess.run([sys.executable, __file__, "--child", kind], env=env, capture_output=True, text=True,
                                 timeout=300).stdout.split()
            print(f"| {kind} | {run + 1} | {int(out[1]) / 2**20:.2f} | {int(out[2]) / 2**20:.2f} | {out[3]} |")


if __name__ == "__main__":
    main()
