"""How far the modelled glibc heap moves when only where the runtime's small objects fall changes.

    python benchmarks/heap_sensitivity.py [--model tied_lm --batch 16 --optimizer momentum --steps 32 --seeds 8]

For one row of the CPU zoo (tests/models.py), three things side by side, peak heap in MiB above the start:
1. the real run's allocations: its malloc log over `--steps` steps (LD_PRELOAD shim, benchmarks/glibc/malloc_log.c,
   as glibc_fidelity.py runs it), replayed through this machine's real glibc and through trainmem's GlibcModel (is
   the allocator model right when it is given the real allocations?);
2. the estimate: the traced stream composed to `--steps` steps (alloc/steady_state.py) with the small-object table's
   objects interleaved (alloc/small_objects.py), replayed as `process_bytes` replays it, expected and pinned;
3. the same replay after a few long-lived small chunks already in the heap, `--seeds` random layouts of them (the
   heap a real process starts its steps with holds the imports' and the model build's leftovers, which no estimate
   knows): how much the modelled heap moves when nothing but the starting layout changes.
The peak RSS of fresh real runs (benchmarks/truth_loops.py, no trainmem code) is printed beside them for scale.
Needs gcc. Prints a table; glibc_fidelity.md's sensitivity section quotes it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from calibrate_small_objects import logged_run  # noqa: E402
from glibc_fidelity import build, model_peak, real_peak  # noqa: E402

MIB = 2**20
LEFTOVERS = (200, 2000)  # how many small chunks a random starting heap holds
LEFTOVER_SIZES = (32, 65536)  # their request sizes, bytes (log-uniform)


def leftovers(seed: int) -> list[tuple]:
    """Malloc actions of a random starting heap: small chunks, every other one freed again (holes between them)."""
    rng = random.Random(seed)
    count = rng.randint(*LEFTOVERS)
    low, high = (math.log2(v) for v in LEFTOVER_SIZES)
    actions = [("alloc", ("leftover", n), int(2 ** rng.uniform(low, high)), False, False) for n in range(count)]
    return actions + [("free", ("leftover", n), 0, True, False) for n in range(0, count, 2)]


def estimated(ref: str, values: dict, steps: int, seeds: int) -> dict:
    from trainmem.alloc import small_objects
    from trainmem.alloc.cpu_heap import replay_actions
    from trainmem.alloc.steady_state import compose
    from trainmem.frontends import resolve
    from trainmem.setup import TrainingSetup
    from trainmem.targets import cpu_kernels
    from trainmem.targets.cpu_info import CpuInfo
    from trainmem.trace.run import trace_training

    setup = TrainingSetup.from_mapping(values)
    traced = trace_training(resolve(ref, setup), setup, cpu_kernels.kernel_ops())
    stream = cpu_kernels.device_stream(traced.trace, CpuInfo.this_machine())[0]
    actions = small_objects.interleave(compose(stream, steps)).actions
    starts = [replay_actions(leftovers(seed) + actions) for seed in range(seeds)]
    return {"expected": replay_actions(actions), "pinned": replay_actions(actions, pinned=True), "starts": starts}


def real_rss(ref: str, values: dict, steps: int, runs: int) -> list[int]:
    command = [sys.executable, str(ROOT / "benchmarks" / "truth_loops.py"), ref, "--batch-size", str(values["batch_size"]),
               "--optimizer", values["optimizer"], "--loop", "inline", "--mode", "rss", "--steps", str(steps)]
    out = []
    for _ in range(runs):
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        out.append(json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_bytes"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tied_lm")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--optimizer", default="momentum")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="fresh real runs for the peak RSS")
    args = parser.parse_args()
    ref = f"{ROOT}/tests/models.py:{args.model}"
    values = {"batch_size": args.batch, "optimizer": args.optimizer}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        shim, replayer = build(tmp)
        recs = logged_run(shim, tmp, ref, {**values, "steps": args.steps})
        real_glibc, real_model = real_peak(replayer, recs, tmp), model_peak(recs)
    est = estimated(ref, values, args.steps, args.seeds)
    rss = real_rss(ref, values, args.steps, args.runs)
    starts = est["starts"]
    print(f"{args.model} batch {args.batch} {args.optimizer}, {args.steps} steps (peak heap MiB above the start)")
    print(f"  real run's malloc log: real glibc {real_glibc / MIB:.1f}, trainmem's GlibcModel {real_model / MIB:.1f}")
    print(f"  estimate: expected {est['expected'] / MIB:.1f}, pinned {est['pinned'] / MIB:.1f}")
    print(f"  estimate after {args.seeds} random starting heaps: {min(starts) / MIB:.1f} .. {max(starts) / MIB:.1f} "
          f"(median {statistics.median(starts) / MIB:.1f})")
    print(f"  real peak RSS, {args.runs} fresh runs: " + ", ".join(f"{r / MIB:.1f}" for r in rss) + " MiB")


if __name__ == "__main__":
    main()
