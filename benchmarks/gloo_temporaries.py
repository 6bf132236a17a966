"""What gloo's collectives allocate below the dispatcher on the CPU, measured in a real 2-process run.

Each rank runs each collective on a tensor of a known size with c10's allocation log on
(trainmem/measure/c10_log.py: every CPU allocation and free, on every thread) and the profiler beside it
(which thread allocated). For each op: the bytes live beyond its inputs and outputs at its peak, what is
still held when it returns, and how much of it was allocated on gloo's worker threads. The table goes to
stdout as markdown (benchmarks/results/gloo_temporaries.md).

    .venv/bin/python benchmarks/gloo_temporaries.py [--world-size 2] [--numel 1048576]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
OPS = ("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "all_reduce", "all_reduce_avg", "broadcast")
C10D_NAMES = {"all_gather_into_tensor": "_allgather_base_", "all_gather": "allgather_",
              "reduce_scatter_tensor": "_reduce_scatter_base_", "all_reduce": "allreduce_",
              "all_reduce_avg": "allreduce_", "broadcast": "broadcast_"}


def _run_op(op: str, numel: int, world: int):
    """Inputs and outputs are made before the op and freed after it: what lies between is the op's own."""
    import torch
    import torch.distributed as dist

    inp = torch.ones(numel)
    if op == "all_gather_into_tensor":
        out = [torch.empty(numel * world)]
        run = lambda: dist.all_gather_into_tensor(out[0], inp)  # noqa: E731
    elif op == "all_gather":
        out = [torch.empty(numel) for _ in range(world)]
        run = lambda: dist.all_gather(out, inp)  # noqa: E731
    elif op == "reduce_scatter_tensor":
        out = [torch.empty(numel // world)]
        run = lambda: dist.reduce_scatter_tensor(out[0], inp)  # noqa: E731
    elif op == "all_reduce_avg":
        out = []
        run = lambda: dist.all_reduce(inp, op=dist.ReduceOp.AVG)  # noqa: E731
    else:
        out = []
        run = (lambda: dist.all_reduce(inp)) if op == "all_reduce" else (lambda: dist.broadcast(inp, 0))
    return inp, out, run


def _rank_main(numel: int, folder: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from trainmem.measure import c10_log
    from trainmem.trace.torch_private import profiler_memory_events_threads

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for op in OPS:
        path = Path(folder, f"{op}.{rank}.log")
        dist.barrier()
        with c10_log.logging(path) as log:
            inp, out, run = _run_op(op, numel, world)
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                first = torch.empty(1)  # the first event in the profile is the main thread's
                log.mark("op")
                run()
                log.mark("done")
            del inp, out, run, first
        rows.append({"op": op, **_op_figures(path), "worker_bytes": _worker_bytes(profiler_memory_events_threads(prof))})
    if rank == 0:
        print(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def _op_figures(path: Path) -> dict:
    """Peak beyond what was live at the op's start, and what the op left allocated when it returned."""
    from trainmem.measure import c10_log

    live = at_start = peak = 0
    inside = False
    for kind, nbytes, _ in c10_log.events(path):
        if kind == "mark:op":
            inside, at_start, peak = True, live, live
        elif kind == "mark:done":
            return {"transient_peak": peak - at_start, "held_after": live - at_start}
        elif kind in ("alloc", "free"):
            live += nbytes if kind == "alloc" else -nbytes
            if inside:
                peak = max(peak, live)
    raise RuntimeError(f"no op marks in {path}")


def _worker_bytes(events) -> int:
    """Bytes allocated on threads other than the first one to allocate (the main thread's marker tensor)."""
    events = sorted(events)
    main = events[0][2] if events else None
    return sum(size for _, size, thread in events if size > 0 and thread != main)


def _launch(world: int, numel: int) -> list[dict]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PYTHONPATH": str(SRC)}
        ranks = [subprocess.Popen([sys.executable, __file__, "--rank-main", str(numel), folder],
                                  env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, text=True)
                 for r in range(world)]
        outputs = [rank.communicate(timeout=300)[0] for rank in ranks]
    return json.loads([line for line in outputs[0].splitlines() if line.startswith("[")][-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--numel", type=int, default=1 << 20, help="elements of the float32 input (default 1 Mi: 4 MiB)")
    parser.add_argument("--rank-main", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        _rank_main(int(args.rank_main[0]), args.rank_main[1])
        return
    import torch

    rows = _launch(args.world_size, args.numel)
    size = args.numel * 4
    print(f"# gloo collectives' own CPU allocations (torch {torch.__version__}, world size {args.world_size}, "
          f"float32 input of {args.numel:,} elements = {size:,} B)\n")
    print("`python benchmarks/gloo_temporaries.py` — rank 0; bytes beyond the op's inputs and outputs, from c10's "
          "allocation log (all threads); worker = allocated on gloo's worker threads (profiler).\n")
    print("| op (c10d name) | transient peak (B) | × input | held after return (B) | on worker threads (B) |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['op']} (`{C10D_NAMES[row['op']]}`) | {row['transient_peak']:,} | "
              f"{row['transient_peak'] / size:.2f} | {row['held_after']:,} | {row['worker_bytes']:,} |")


if __name__ == "__main__":
    main()
