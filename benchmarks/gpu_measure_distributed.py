"""Per-rank CUDA memory of real distributed training on one GPU, one JSON line per rank per case.

    python benchmarks/gpu_measure_distributed.py --out FILE [--budget 330] [--only SUBSTRING]
    python benchmarks/gpu_measure_distributed.py --device cpu --dry-run --out /tmp/dry.jsonl   # checks the code

Written as a user writes it, independently of trainmem (nothing of it is imported: the models are built here from
the references trainmem estimates, `mlp:` exactly as its frontend builds one). Each case starts N processes the
way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and each rank runs:
  ddp    DistributedDataParallel(model, device_ids=[0]), torch.optim.Adam
  zero1  the same DDP + torch.distributed.optim.ZeroRedundancyOptimizer(optimizer_class=Adam)
  fsdp   FSDP2 as torchtitan writes it: built on meta, fully_shard on each repeated block then the root
         (bf16-mixed: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), no autocast),
         to_empty(device) and reset_parameters(), Adam over the DTensor shards
and the inline loop for 3 steps: batch, zero_grad(set_to_none=True), forward and loss (DDP bf16-mixed: inside
torch.autocast), backward, step. fp32 and bf16-mixed; Adam's default implementation (foreach on CUDA).

One GPU holds every rank: NCCL refuses two ranks on one device ("Duplicate GPU"), so world size 1 runs NCCL
(its communicator's buffers show in the process figure) and world sizes 2 and 4 run gloo on CUDA tensors.
ProcessGroupGloo (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, ProcessGroupGlooCuda.cpp) stages CUDA
tensors through pinned host copies over TCP (the device-side ring is used only with a GPUDirect transport):
all-reduce and broadcast copy into pinned host buffers and back; all-gather copies input and outputs to
pinned host buffers; reduce-scatter (reduce_scatter_tensor_coalesced) first clones the whole CUDA input on the
GPU (`inputTensors[i].clone()`), all-reduces the clone and copies this rank's chunk out. So gloo ranks hold
no NCCL buffers, and FSDP2's reduce-scatter holds one extra unsharded-gradient-sized CUDA buffer per group.

Per rank, after the steps: torch.cuda.max_memory_allocated / max_memory_reserved (peaks since the process
started); memory_allocated_end / memory_reserved_end once the training function has returned (model, optimizer
and batch released; the caching allocator keeps its segments, so reserved stays at its peak); the process's
used GPU memory from NVML (nvidia-smi's figure: the kept segments + CUDA context + libraries + NCCL), read while
every rank is alive; the device's used memory (cudaMemGetInfo) after this rank's CUDA context was made and at
the end (all ranks' processes together); and the GPU, driver, CUDA, NCCL, cuDNN and torch versions. Each case has its own timeout; cases that would not finish inside --budget are skipped
and named. Without a CUDA device (and without --device cpu) it says so and writes nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
SOURCE = "measured: python benchmarks/gpu_measure_distributed.py"
THIS = "benchmarks/gpu_measure_distributed.py"
# model name -> (reference trainmem resolves, per-rank batch size). mlp: 159M parameters (2.5 GiB of fp32 Adam
# model states); gpt2_small: GPT-2 small's shape (124M, vocab 50257, seq 1024, tied head), logits 1.6 GiB fp32.
MODELS = {"mlp": ("mlp:2048-8192-8192-8192-1000", 8192), "gpt2_small": (f"{THIS}:gpt2_small", 8)}
DRY_MODELS = {"mlp": ("mlp:64-128-128-10", 16), "gpt2_small": (f"{THIS}:gpt2_dry", 2)}
# (model, strategy, precision, world size), most wanted first: the budget cuts from the end
CASES = [("gpt2_small", "ddp", "fp32", 1), ("gpt2_small", "ddp", "fp32", 2), ("gpt2_small", "fsdp", "fp32", 2),
         ("mlp", "ddp", "fp32", 2), ("mlp", "fsdp", "fp32", 2), ("gpt2_small", "ddp", "bf16-mixed", 2),
         ("gpt2_small", "fsdp", "bf16-mixed", 2), ("mlp", "zero1", "fp32", 2), ("gpt2_small", "fsdp", "fp32", 1),
         ("mlp", "ddp", "fp32", 1), ("mlp", "fsdp", "fp32", 1), ("gpt2_small", "fsdp", "fp32", 4),
         ("mlp", "ddp", "fp32", 4), ("mlp", "fsdp", "fp32", 4), ("gpt2_small", "zero1", "fp32", 2),
         ("mlp", "fsdp", "bf16-mixed", 2), ("mlp", "ddp", "bf16-mixed", 2), ("gpt2_small", "ddp", "fp32", 4),
         ("gpt2_small", "zero1", "bf16-mixed", 2), ("mlp", "zero1", "fp32", 4)]


def gpt2_small():
    """GPT-2 small's shape on tests/models.py's TinyGPT: 12 layers, d_model 768, 12 heads, seq 1024,
    vocab 50257, tied LM head (124M parameters); batches of token ids."""
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from models import TinyGPT

    return TinyGPT(vocab=50257, d_model=768, heads=12, layers=12, seq=1024), \
        lambda batch: (torch.randint(0, 50257, (batch, 1024)),)


def gpt2_dry():
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from models import TinyGPT

    return TinyGPT(vocab=100, d_model=32, heads=2, layers=2, seq=16), \
        lambda batch: (torch.randint(0, 100, (batch, 16)),)


# ---------------------------------------------------------------- one rank (child process)

def build(ref: str, batch: int):
    """The model (built where the caller's torch.device context says) and a function making one batch.
    `mlp:` references are built here as trainmem's mlp frontend builds them (a Linear per pair of widths, ReLU
    between, none after the last) and `file.py:factory` ones by calling the factory in this file: the child
    imports nothing of trainmem, so the run cannot break on the package's state."""
    import torch

    if ref.startswith("mlp:"):
        widths = [int(part) for part in ref.split(":", 1)[1].split("-")]
        layers: list = []
        for index, (width_in, width_out) in enumerate(zip(widths, widths[1:])):
            layers += [torch.nn.Linear(width_in, width_out)] + ([torch.nn.ReLU()] if index < len(widths) - 2 else [])
        return torch.nn.Sequential(*layers), lambda size: (torch.randn(size, widths[0]),)
    return globals()[ref.rsplit(":", 1)[1]]()


def loss_fn(output):
    """Cross-entropy against random class ids, made in the loss as a loader-less script does."""
    import torch
    import torch.nn.functional as F

    logits = output.reshape(-1, output.shape[-1]) if output.dim() == 3 else output
    target = torch.randint(0, logits.shape[-1], (logits.shape[0],), device=logits.device)
    return F.cross_entropy(logits, target)


def repeated_blocks(model) -> list:
    """Each repeated block (children of the first ModuleList/Sequential holding two or more children of one
    class with parameters), else each top-level child with parameters: the modules fully_shard goes on."""
    import torch

    def has_params(module) -> bool:
        return any(True for _ in module.parameters())

    for module in model.modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            kinds = [type(child) for child in module.children() if has_params(child)]
            repeated = {kind for kind in kinds if kinds.count(kind) >= 2}
            if repeated:
                return [child for child in module.children() if type(child) in repeated]
    return [child for child in model.children() if has_params(child)]


def wrap_fsdp(ref: str, batch: int, precision: str, device: str, world: int):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.device("meta"):
        model, make_batch = build(ref, batch)
    mesh = init_device_mesh(device, (world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16-mixed" else MixedPrecisionPolicy()
    for block in repeated_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=device)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    return model, make_batch, torch.optim.Adam(model.parameters(), lr=1e-3)


def wrap_replicated(ref: str, batch: int, strategy: str, device: str):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    with torch.device(device):
        model, make_batch = build(ref, batch)
    model = DistributedDataParallel(model, device_ids=[0] if device == "cuda" else None)
    if strategy == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, make_batch, optimizer


def train(request: dict) -> tuple[float, int]:
    """Build, wrap and run the inline loop; returns the last loss (a check that the steps computed) and the
    number of parameter elements this rank holds (FSDP2: its shards)."""
    import contextlib

    import torch

    device, world = request["device"], int(os.environ["WORLD_SIZE"])
    if request["strategy"] == "fsdp":
        model, make_batch, optimizer = wrap_fsdp(request["ref"], request["batch"], request["precision"], device, world)
    else:
        model, make_batch, optimizer = wrap_replicated(request["ref"], request["batch"], request["strategy"], device)
    autocast = request["precision"] == "bf16-mixed" and request["strategy"] != "fsdp"
    for _ in range(STEPS):
        with torch.device(device):
            inputs = make_batch(request["batch"])
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            output = model(*inputs)
            loss = loss_fn(output)
        loss.backward()
        optimizer.step()
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    return float(loss.detach().float().cpu()), local


def gpu_processes() -> list[dict]:
    """Every compute process on GPU 0 with its used memory, as NVML (what nvidia-smi prints) lists it."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return [{"pid": p.pid, "used_bytes": p.usedGpuMemory}
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except Exception as error:  # noqa: BLE001 - recorded, not hidden: the row says why it has no figure
        return [{"error": f"{type(error).__name__}: {error}"}]


def versions() -> dict:
    import platform

    import torch

    facts = {"torch": torch.__version__, "python": platform.python_version(), "cuda": torch.version.cuda}
    if not torch.cuda.is_available():
        return facts
    props = torch.cuda.get_device_properties(0)
    facts.update(gpu=props.name, total_memory_bytes=props.total_memory,
                 compute_capability=f"{props.major}.{props.minor}",
                 nccl=".".join(map(str, torch.cuda.nccl.version())), cudnn=torch.backends.cudnn.version(),
                 target_options={"alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
                                 or os.environ.get("PYTORCH_ALLOC_CONF")})
    try:
        import pynvml

        pynvml.nvmlInit()
        facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as error:  # noqa: BLE001
        facts["driver"] = f"unread ({type(error).__name__})"
    return facts


def cuda_figures() -> dict:
    import torch

    stats = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    return {"max_memory_allocated": torch.cuda.max_memory_allocated(),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "memory_allocated_end": torch.cuda.memory_allocated(), "memory_reserved_end": torch.cuda.memory_reserved(),
            "num_alloc_retries": stats.get("num_alloc_retries", 0), "device_used_bytes_end": total - free}


def child(request: dict) -> None:
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
    rank, world, cuda = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), request["device"] == "cuda"
    row: dict = {"rank": rank, "world_size": world, "backend": request["backend"]}
    if cuda:
        torch.cuda.set_device(0)  # every rank on the one GPU
        free, total = torch.cuda.mem_get_info()  # makes the CUDA context, allocates nothing through torch
        row["device_used_bytes_start"] = total - free
    options = {"device_id": torch.device("cuda", 0)} if request["backend"] == "nccl" else {}
    dist.init_process_group(request["backend"], rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=request["timeout"]), **options)
    row["loss"], row["local_parameters"] = train(request)
    if cuda:
        torch.cuda.synchronize()
        row.update(cuda_figures())  # read before any barrier: an NCCL barrier allocates
    if world > 1:
        dist.barrier()  # every rank still holds its memory while the processes are listed
    if cuda:
        row["gpu_processes"] = gpu_processes()
        own = [p for p in row["gpu_processes"] if p.get("pid") == os.getpid()]
        row["process_bytes"] = own[0]["used_bytes"] if own else None
    if world > 1:
        dist.barrier()
    row["pid"], row["rank_seconds"] = os.getpid(), round(time.perf_counter() - started, 2)
    row.update(versions())
    print("RESULT " + json.dumps(row), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------- the cases (parent process)

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(request: dict, world: int, logs: Path) -> list:
    port = free_port()
    processes = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo",
               "PYTHONUNBUFFERED": "1"}
        out = open(logs / f"rank{rank}.out", "w")  # files, not pipes: a full pipe would stall a rank at a barrier
        processes.append((subprocess.Popen([sys.executable, __file__, "--child", json.dumps(request)], env=env,
                                           stdout=out, stderr=subprocess.STDOUT, cwd=ROOT), out))
    return processes


def run_case(case: tuple, args, models: dict) -> list[dict]:
    """One case's ranks; one row per rank (a failed or timed-out rank's row says so and holds no figure)."""
    model, strategy, precision, world = case
    ref, batch = models[model]
    backend = "nccl" if args.device == "cuda" and world == 1 else "gloo"
    request = {"ref": ref, "batch": batch, "strategy": strategy, "precision": precision, "device": args.device,
               "backend": backend, "timeout": args.case_timeout}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        processes = launch(request, world, Path(folder))
        deadline = started + args.case_timeout
        timed_out = False
        for process, _ in processes:
            try:
                process.wait(timeout=max(1.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                timed_out = True
        for process, out in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            out.close()
        logs = [(Path(folder) / f"rank{rank}.out").read_text(errors="replace") for rank in range(world)]
    seconds = round(time.perf_counter() - started, 2)
    common = {"source": SOURCE, "date": datetime.date.today().isoformat(), "kind": "distributed",
              "case": f"{model} {strategy} {precision} ws{world}", "model": model, "model_ref": ref,
              "strategy": strategy, "precision": precision, "batch_size_per_rank": batch, "steps": STEPS,
              "loop": "inline", "optimizer": "adam", "device": args.device, "backend": backend,
              "setup": {"batch_size": batch, "optimizer": "adam", "precision": precision, "strategy": strategy,
                        "world_size": world, "loop": "inline", "steps": STEPS}, "case_seconds": seconds}
    return [case_row(common, rank, world, processes[rank][0].returncode, logs[rank], timed_out)
            for rank in range(world)]


def case_row(common: dict, rank: int, world: int, returncode, log: str, timed_out: bool) -> dict:
    for line in log.splitlines():
        if line.startswith("RESULT "):
            return {**common, **json.loads(line[len("RESULT "):])}
    why = "timed out" if timed_out else f"exit status {returncode}"
    return {**common, "rank": rank, "world_size": world, "error": why, "log_tail": log.splitlines()[-15:]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", help="JSON lines, appended")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="tiny models: checks the code, measures nothing")
    parser.add_argument("--budget", type=float, default=330.0, help="seconds for all cases")
    parser.add_argument("--case-timeout", type=float, default=60.0)
    parser.add_argument("--only", default="", help="run cases whose name contains this")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if args.device == "cuda" and not cuda_present():
        print("no CUDA device; nothing measured, nothing written (a GPU number is only ever a measured one)")
        return
    run_all(args, DRY_MODELS if args.dry_run else MODELS)


def cuda_present() -> bool:
    """Asked through nvidia-smi, so that this process makes no CUDA context of its own on the GPU."""
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def run_all(args, models: dict) -> None:
    """The cases in order until the budget would be passed; after a case times out, the later cases of the
    same strategy and backend are skipped (a hang there would eat the budget again)."""
    started = time.perf_counter()
    cases = [case for case in CASES if args.only in " ".join(map(str, case))]
    hung: set[tuple] = set()
    with open(args.out, "a") as out:
        for index, case in enumerate(cases):
            if time.perf_counter() - started + args.case_timeout > args.budget:
                print(f"skipped (budget {args.budget:.0f} s): {', '.join(map(str, cases[index:]))}", flush=True)
                break
            if (case[1], case[3] > 1) in hung:
                print(f"skipped after a hang of the same strategy and backend: {case}", flush=True)
                continue
            rows = run_case(case, args, models)
            if any(row.get("error") == "timed out" for row in rows):
                hung.add((case[1], case[3] > 1))
            for row in rows:
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"{row['case']} rank {row['rank']}: allocated {row.get('max_memory_allocated')} reserved "
                      f"{row.get('max_memory_reserved')} process {row.get('process_bytes')} "
                      f"{row.get('error', '')} ({row['case_seconds']} s)", flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s -> {args.out}")

if __name__ == "__main__":
    main()
