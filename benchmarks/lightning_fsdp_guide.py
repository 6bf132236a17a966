"""Lightning's FSDP guides (Trainer and Fabric) beside trainmem's per-rank estimate.

    .venv/bin/python benchmarks/lightning_fsdp_guide.py            # every row, each in a fresh process (~3 min)

Both guides train the same 1B Transformer (benchmarks/data/lightning_guide_transformer.py) on 2 A100 40GB GPUs with
Lightning 2.1 and PyTorch 2.1, batch 1 of 35 tokens, Adam(lr=0.1), fp32, the encoder and decoder layers as FSDP's
auto-wrap policy, and print `torch.cuda.memory_summary()` after training; each publishes "Memory (MB)" for DDP and
for FSDP's sharding strategies. The figure is read here as that summary's peak allocated memory, which it prints in
MiB: compared with the estimate's `allocated_bytes` (max_memory_allocated) in MiB. The Trainer rows run trainmem's
`--loop lightning` (automatic optimization), the Fabric rows its `--loop inline` (the guide's loop: backward, step,
zero_grad). `--torch-version 2.1` gives the run's torch defaults. FSDP rows are `--strategy fsdp1` (Lightning 2.1 wraps
with FullyShardedDataParallel); the CPU offload rows (`cpu_offload=True`) are `--strategy fsdp1 --offload params`, FSDP1's
CPUOffload(offload_params=True) run by FSDP1's own code on fake tensors.

Writes benchmarks/results/lightning_fsdp_guide.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPORT = ROOT / "results" / "lightning_fsdp_guide.md"
MODEL = "benchmarks/data/lightning_guide_transformer.py:guide_transformer"
SOURCES = {
    "trainer": "https://lightning.ai/docs/pytorch/stable/advanced/model_parallel/fsdp.html (Lightning's repository: "
               "docs/source-pytorch/advanced/model_parallel/fsdp.rst)",
    "fabric": "https://lightning.ai/docs/fabric/stable/advanced/model_parallel/fsdp.html (Lightning's repository: "
              "docs/source-fabric/advanced/model_parallel/fsdp.rst)",
}
# (guide, column, published "Memory (MB)", layout): the tables "Optimize the sharding strategy" and "Offload parameters
# to CPU" of each guide, quoted
ROWS = [
    ("trainer", "DDP", 23125, {"strategy": "ddp"}),
    ("trainer", "NO_SHARD", 19296, {"strategy": "fsdp1", "fsdp1_sharding": "no-shard"}),
    ("trainer", "SHARD_GRAD_OP", 11772, {"strategy": "fsdp1", "fsdp1_sharding": "shard-grad-op"}),
    ("trainer", "FULL_SHARD", 9627, {"strategy": "fsdp1"}),
    ("trainer", "FSDP + CPU offload", 2790, {"strategy": "fsdp1", "offload": "params"}),
    ("fabric", "DDP", 26953, {"strategy": "ddp"}),
    ("fabric", "NO_SHARD", 23181, {"strategy": "fsdp1", "fsdp1_sharding": "no-shard"}),
    ("fabric", "SHARD_GRAD_OP", 11815, {"strategy": "fsdp1", "fsdp1_sharding": "shard-grad-op"}),
    ("fabric", "FULL_SHARD", 11578, {"strategy": "fsdp1"}),
    ("fabric", "FSDP + CPU offload", 2825, {"strategy": "fsdp1", "offload": "params"}),
]
LOOPS = {"trainer": "lightning", "fabric": "inline"}

CHILD = """
import json, sys
import trainmem
model, kwargs = json.loads(sys.argv[1])
try:
    est = trainmem.estimate(model, **kwargs)
except trainmem.TrainmemError as error:
    print("RESULT " + json.dumps({"error": str(error)}))
else:
    out = est.to_dict()
    print("RESULT " + json.dumps({"peak": out["peak"], "breakdown": out["breakdown"]}))
"""


def estimate_row(guide: str, layout: dict) -> dict:
    kwargs = {"batch_size": 1, "optimizer": "adam", "loop": LOOPS[guide], "torch_version": "2.1", "world_size": 2,
              "device": "a100-40gb", "cache": False, **layout}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([MODEL, kwargs])], capture_output=True, text=True,
                          timeout=1800, cwd=ROOT.parent)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no result"])[-1]}
    return {**json.loads(lines[-1][len("RESULT "):]), "seconds": round(time.perf_counter() - started, 1)}


PARAMETERS = 1_008_763_390  # the guide's model, as trainmem counts it (the estimate's model.parameters)
# the fp32 copy of the parameters one rank holds under each layout of 2 ranks: a replica, or a half
RANK_COPY = {"DDP": 1.0, "NO_SHARD": 1.0, "SHARD_GRAD_OP": 0.5, "FULL_SHARD": 0.5}


def fabric_gap(estimated: dict) -> list[str]:
    """The same model, optimizer and layouts in both guides, yet Fabric's published figures stand above the
    Trainer's: the difference beside one fp32 copy of a rank's parameters, and beside what the two loops change."""
    published = {(guide, column): mb for guide, column, mb, _ in ROWS}
    lines = ["## Fabric's rows against the Trainer's", "",
             "| column | published Fabric - Trainer MiB | a rank's fp32 parameters MiB | estimated Fabric - Trainer MiB |",
             "|---|---:|---:|---:|"]
    for column, share in RANK_COPY.items():
        gap = published["fabric", column] - published["trainer", column]
        ours = estimated.get(("fabric", column), 0) - estimated.get(("trainer", column), 0)
        lines.append(f"| {column} | {gap:,} | {PARAMETERS * 4 * share / 2**20:,.0f} | {ours:,.0f} |")
    lines += ["", "Where the peak is at the optimizer step (DDP, NO_SHARD, FULL_SHARD), Fabric's run holds one more "
              "fp32 copy of the rank's parameters than the Trainer's. Under SHARD_GRAD_OP the two guides agree, and "
              "agree with trainmem's Trainer loop, whose closure zeroes the last step's gradients only after the next "
              "forward, so they live through it (the peak is in forward); trainmem's inline loop, the Fabric guide's "
              "code as written (zero_grad right after the step), frees them first and is low there by as much: the "
              "Fabric run held something of that size through its forward too. Fabric's own code does not explain the copy on today's torch: Fabric 2.1.4 "
              "with torch 2.13 on the CPU, the guide's model at 2 layers, held exactly what the same loop without "
              "Fabric holds (one device: 405.27 MiB both; DDP over gloo on 2 ranks: 484.46 MiB both, every storage "
              "counted at dispatch), so the copy is in what the published run had beside it (torch 2.1's CUDA "
              "optimizer, or the script as run), which is not modelled: those Fabric rows are low by that copy.", ""]
    return lines


def main() -> None:
    lines = ["# Lightning's FSDP guides: published vs estimated", "",
             f"Generated {time.strftime('%Y-%m-%d')} by `python benchmarks/lightning_fsdp_guide.py`. "
             + __doc__.split("\n\n")[2].replace("\n", " "), "",
             "| guide | column | published MiB | estimated allocated MiB | error | reserved MiB | peak phase |",
             "|---|---|---:|---:|---:|---:|---|"]
    estimated = {}
    for guide, column, published, layout in ROWS:
        result = estimate_row(guide, layout)
        if "error" in result:
            lines.append(f"| {guide} | {column} | {published:,} | not estimated: {result['error']} | — | — | — |")
        else:
            peak = result["peak"]
            allocated = peak["allocated_bytes"] / 2**20
            error = allocated / published - 1
            estimated[guide, column] = allocated
            lines.append(f"| {guide} | {column} | {published:,} | {allocated:,.0f} | {error:+.1%} | "
                         f"{(peak.get('reserved_bytes') or 0) / 2**20:,.0f} | {peak['phase']} ({peak['op']}) |")
        print(lines[-1], flush=True)
    lines += ["", f"Sources: Trainer {SOURCES['trainer']}; Fabric {SOURCES['fabric']}.", ""] + fabric_gap(estimated)
    REPORT.write_text("\n".join(lines))
    print(f"wrote {REPORT}")


if __name__ == "__main__":
    main()
