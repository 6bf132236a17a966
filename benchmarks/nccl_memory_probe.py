"""GPU memory NCCL communicators take on this machine's GPU, outside PyTorch's allocator: the device's used memory
(torch.cuda.mem_get_info) before and after each communicator's first collectives. Written independently of
trainmem (it imports nothing of it): the measurement targets/nccl.py is checked against.

    python benchmarks/nccl_memory_probe.py OUT.json      # runs the variants below, one fresh process each

One GPU holds one rank of a communicator (NCCL refuses two ranks on one device), so each communicator here has a
single rank: its ring connects the rank to itself on every channel, one connection a channel, which isolates the
per-channel buffer bytes. Variants: NCCL's defaults; NCCL_MAX_NCHANNELS=1; NCCL_BUFFSIZE=1 MiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, torch, torch.distributed as dist
torch.cuda.set_device(0)
x = torch.ones(1 << 20, device="cuda")
out = torch.empty(1 << 20, device="cuda")
torch.cuda.synchronize()
def used():
    free, total = torch.cuda.mem_get_info()
    return total - free
r = {"nccl": ".".join(map(str, torch.cuda.nccl.version())), "torch": torch.__version__,
     "gpu": torch.cuda.get_device_name(0), "reserved_by_torch": torch.cuda.memory_reserved(), "context": used()}
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
r["after_init"] = used()
dist.all_reduce(x); torch.cuda.synchronize(); r["world_all_reduce"] = used()
dist.all_gather_into_tensor(out, x); dist.reduce_scatter_tensor(x, out); torch.cuda.synchronize()
r["world_all_gather_reduce_scatter"] = used()
for i in range(2):
    g = dist.new_group([0])
    dist.all_reduce(x, group=g); torch.cuda.synchronize(); r[f"group{i + 2}_all_reduce"] = used()
r["reserved_by_torch_end"] = torch.cuda.memory_reserved()
print("RESULT " + json.dumps(r), flush=True)
dist.destroy_process_group()
"""

VARIANTS = {"defaults": {}, "max_nchannels_1": {"NCCL_MAX_NCHANNELS": "1"}, "buffsize_1mib": {"NCCL_BUFFSIZE": "1048576"}}


def run(extra: dict[str, str], port: int) -> dict:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NCCL_DEBUG": "INFO",
           "NCCL_DEBUG_SUBSYS": "INIT,ALLOC", **extra}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=240)
    result = {"env": extra, "returncode": done.returncode}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result.update(json.loads(line[7:]))
    log = done.stdout + done.stderr
    result["nccl_lines"] = [line.split("NCCL INFO", 1)[1].strip() for line in log.splitlines()
                            if "NCCL INFO" in line and ("channels" in line or "Channel 00" in line
                                                        or "NVLS" in line or "cuMem" in line)][:20]
    allocs = [line for line in log.splitlines() if "NCCL INFO" in line and ("Alloc" in line or "alloc" in line)]
    result["alloc_lines"] = len(allocs)
    result["alloc_sample"] = allocs[:6]
    if done.returncode:
        result["stderr_tail"] = done.stderr.splitlines()[-5:]
    return result


def main() -> None:
    results = {name: run(extra, 29500 + i) for i, (name, extra) in enumerate(VARIANTS.items())}
    text = json.dumps(results, indent=1)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
