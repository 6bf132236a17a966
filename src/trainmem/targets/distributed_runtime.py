"""What torch.distributed's runtime adds to a CPU rank's peak RSS beyond the single-process floor
(targets/cpu_runtime.py): gloo's process group (its worker threads, a socket pair per peer, the TCP store's
client) and whatever the strategy's wrapper imports that a plain training loop does not. No torch here.

Measured, not derived (benchmarks/distributed_runtime_rss.py → data/distributed_runtime_rss.json): fresh
processes launched as torchrun does, each rank training the floor's own tiny model (mlp:8-8-2, batch 1, Adam,
two steps) wrapped as a user wraps it, peak RSS from /proc VmHWM, medians of several runs, less the median of
the same loop in a plain process with the same thread count. The single-process floor already holds
torch._dynamo and sympy (the optimizer's step imports them), so the 78-80 MiB that the first
DistributedDataParallel / fully_shard import in a fresh process (benchmarks/gloo_process_rss.py) are not
counted again: only what the distributed run holds beyond the plain one is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "distributed_runtime_rss.json"
PART = "torch.distributed runtime (gloo)"
# the wrapper each strategy's real run uses (measure/dist_child.py, parallel/*): the measured case it takes
MEASURED_AS = {"ddp": "ddp", "zero1": "zero1", "fsdp": "fsdp", "fsdp1": "fsdp", "hsdp": "fsdp", "zero2": "fsdp", "zero3": "fsdp",
               "tp": "tp"}


def _cases() -> dict[str, int]:
    """The largest measured increment per strategy over the measured world sizes."""
    data = json.loads(DATA.read_text())
    found: dict[str, int] = {}
    for case in data["cases"]:
        found[case["strategy"]] = max(found.get(case["strategy"], 0), max(0, int(case["increment_bytes"])))
    return found


def _kinds(layout: Any) -> list[str]:
    """The torch.distributed mechanisms a rank of this layout runs: its data-parallel wrapper, DTensor TP,
    pipelining."""
    kinds = []
    data_parallel = getattr(layout, "data_parallel", None)
    if data_parallel is not None:
        kinds.append(str(data_parallel.value))
    if layout.tp > 1:
        kinds.append("tp")
    if layout.pp > 1:
        kinds.append("pp")
    return kinds or [str(layout.strategy.value)]


def distributed_runtime_bytes(layout: Any) -> tuple[int, str]:
    """(bytes, assumption) the torch.distributed runtime adds to each CPU rank's peak RSS. A layout that combines
    mechanisms adds each one's increment (each includes gloo's own process group, so that part counts more than
    once: high, never low); pipelining was not measured and takes the largest measured increment."""
    measured = _cases()
    data = json.loads(DATA.read_text())
    largest = max(measured.values())
    total, said = 0, []
    for kind in _kinds(layout):
        case = MEASURED_AS.get(kind)
        nbytes = measured[case] if case in measured else largest
        total += nbytes
        said.append(f"{kind} {nbytes / 2**20:.1f} MiB" + ("" if case in measured else " (not measured: the largest)"))
    text = (f"{PART}: {', '.join(said)} per rank beyond the single-process floor — gloo's process group and the "
            f"wrapper's imports, measured with torch {data['torch']} ({data['command']}: peak RSS of each rank less a "
            "plain process's, medians of fresh runs)")
    return total, text
