"""What composing repeated blocks saves (trace/block_reuse.py), and that it changes no figure.

    python benchmarks/block_reuse.py [--runs 3]

Each case is estimated in fresh processes (the trace cache off), alternately with the blocks composed (the
default) and with the model traced whole (trace.block_reuse.whole_models()); the table gives the medians of the
estimate call's own wall time (the import of trainmem and torch excluded, the same for both) and whether the two
estimates are identical (every key of Estimate.to_dict() but the note that says the blocks were composed). The
children lower block_reuse.MIN_BLOCKS to 8, so that the 12-block rows measure the break-even that sets it.
Writes benchmarks/results/block_reuse.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "block_reuse.md"
GPT_1B3 = f"{ROOT}/tests/models.py:gpt_1b3"
LLAMA_70B = "hf:meta-llama/Llama-3.1-70B"
LLAMA_70B_SETUP = {"seq_len": 2048, "batch_size": 1, "optimizer": "adamw", "precision": "bf16-mixed",
                   "device": "h100-80gb"}
LLAMA_70B_LABEL = "Llama-3.1-70B (bundled config), seq 2048, batch 1, AdamW, bf16-mixed"


def _rank_of_70b(layout: str, **values) -> tuple[str, str, dict]:
    """A rank role of the 70B under a multi-GPU layout (parallel/rank_trace.py composes its blocks)."""
    return (f"{LLAMA_70B_LABEL}, {layout} on 8 x h100-80gb: a rank's 80 blocks", LLAMA_70B,
            {**LLAMA_70B_SETUP, **values})


# (label, model, estimate() keywords)
CASES = [
    (f"{LLAMA_70B_LABEL}, h100-80gb: 80 blocks", LLAMA_70B, LLAMA_70B_SETUP),
    _rank_of_70b("FSDP with tp 2", strategy="fsdp", world_size=8, tp=2),
    _rank_of_70b("FSDP with tp 4 and offloaded parameters", strategy="fsdp", world_size=8, tp=4, offload="params"),
    _rank_of_70b("ZeRO-3", strategy="zero3", world_size=8),
    _rank_of_70b("HSDP (shard 4)", strategy="hsdp", world_size=8, dp_shard=4),
    _rank_of_70b("FSDP1", strategy="fsdp1", world_size=8),
    _rank_of_70b("tp 8", strategy="tp", tp=8),
    ("GPT-style 1.3B, seq 1024, batch 8, AdamW, bf16-mixed, a100-80gb: 24 blocks", GPT_1B3,
     {"batch_size": 8, "optimizer": "adamw", "precision": "bf16-mixed", "device": "a100-80gb"}),
    ("GPT-style 1.3B, seq 1024, batch 8, AdamW, bf16-mixed, this CPU: 24 blocks", GPT_1B3,
     {"batch_size": 8, "optimizer": "adamw", "precision": "bf16-mixed"}),
    ("Mistral-7B (bundled config), seq 2048, batch 1, LoRA r=16, rtx4090: 32 blocks, a sliding-window tensor per "
     "layer made outside them", "hf:mistralai/Mistral-7B-v0.1",
     {"seq_len": 2048, "batch_size": 1, "lora": "r=16", "device": "rtx4090"}),
    ("Gemma-2-9b (bundled config), seq 1024, batch 1, AdamW, bf16-mixed, h100-80gb: 42 blocks, sliding and global "
     "alternating", "hf:google/gemma-2-9b",
     {"seq_len": 1024, "batch_size": 1, "optimizer": "adamw", "precision": "bf16-mixed", "device": "h100-80gb"}),
    ("GPT-2 (124M), seq 128, batch 8, AdamW, a100-80gb: 12 blocks", "hf:gpt2",
     {"seq_len": 128, "batch_size": 8, "optimizer": "adamw", "device": "a100-80gb"}),
    ("BERT-base, seq 128, batch 8, AdamW, this CPU: 12 blocks", "hf:bert-base-uncased",
     {"seq_len": 128, "batch_size": 8, "optimizer": "adamw"}),
]
CHILD = """
import contextlib, json, sys, time
import trainmem
from trainmem.trace import block_reuse
from trainmem.trace.block_reuse import whole_models
block_reuse.MIN_BLOCKS = 8  # the 12-block rows show the break-even that sets the default
model, values, whole = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "whole"
device = values.pop("device", "cpu")
started = time.perf_counter()
with whole_models() if whole else contextlib.nullcontext():
    result = trainmem.estimate(model, device=device, cache=False, compare_loop=True, **values)
seconds = time.perf_counter() - started
data = result.to_dict()
notes = [w for w in data.get("warnings", []) if "the model traced with" in w or "traced whole" in w]
data["warnings"] = [w for w in data.get("warnings", []) if w not in notes]
print(json.dumps({"seconds": seconds, "notes": notes, "estimate": data}, default=str))
"""


def one(model: str, values: dict, mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, model, json.dumps(values), mode], capture_output=True,
                          text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per case and mode")
    args = parser.parse_args()
    rows = ["| case | whole s | composed s | composed / whole | identical | how |", "|---|---:|---:|---:|---|---|"]
    for label, model, values in CASES:
        times: dict[str, list[float]] = {"whole": [], "composed": []}
        results: dict[str, dict] = {}
        for _ in range(args.runs):
            for mode in ("whole", "composed"):
                out = one(model, dict(values), mode)
                times[mode].append(out["seconds"])
                results[mode] = out
        whole, composed = (statistics.median(times[m]) for m in ("whole", "composed"))
        same = results["whole"]["estimate"] == results["composed"]["estimate"]
        how = "; ".join(results["composed"]["notes"]) or "no note"
        rows.append(f"| {label} | {whole:.2f} | {composed:.2f} | {composed / whole:.2f} | {'yes' if same else 'NO'} "
                    f"| {how} |")
        print(rows[-1], flush=True)
    lines = ["# Repeated blocks composed from a few traced ones", "",
             f"Generated {datetime.date.today()} by `python benchmarks/block_reuse.py --runs {args.runs}` on "
             f"{os.cpu_count()} cores; medians of fresh processes, the estimate call's own wall time (imports "
             "excluded), the trace cache off, block_reuse.MIN_BLOCKS lowered to 8 (the 12-block rows show why the default is 16). \"identical\": every key of the two estimates' JSON but the note on "
             "the blocks. How it works: trainmem/trace/block_compose.py.", "", *rows, ""]
    RESULT.write_text("\n".join(lines))
    print(f"wrote {RESULT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
