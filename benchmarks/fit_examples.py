"""`trainmem fit` on the seed MLP and on a 1.3B-parameter GPT-style model, for a 24 GB and an 80 GB card,
with the default margin and with `--margin 0.05`; and the batch search (two traces, the other candidates
predicted, the answer confirmed by a real trace) beside the exhaustive search (a whole estimate per
candidate, `fit(..., exhaustive=True)`) and one estimate at the answer's batch.
Writes benchmarks/results/fit_examples.md with each command, its whole answer and the comparison.

    python benchmarks/fit_examples.py            # every case, each way in a fresh process
    python benchmarks/fit_examples.py --only gpt  # the cases whose command contains 'gpt' (prints, writes nothing)

Each way of each case runs in a process of its own (`--run CASE WAY`), timed from the call to its answer
(the interpreter and torch's import are outside the clock, alike for every way): FakeTensorMode caches
its dispatch process-wide, so a second search in one process would trace faster than a user's run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPT = ["tests/models.py:gpt_1b3", "--input-shape", "1024", "--input-dtype", "int64", "--input-max", "50257",
       "--optimizer", "adamw", "--precision", "bf16-mixed"]
CASES = [
    ["mlp:1000-100-100-100-100-10", "--input-shape", "1000", "--optimizer", "adam", "--device", "rtx4090"],
    ["mlp:1000-100-100-100-100-10", "--input-shape", "1000", "--optimizer", "adam", "--device", "a100-80gb"],
    [*GPT, "--device", "rtx4090"],
    [*GPT, "--device", "a100-80gb"],
    [*GPT, "--device", "a100-80gb", "--checkpointing"],
    [*GPT, "--device", "a100-80gb", "--checkpointing", "--margin", "0.05"],
]
WAYS = ("search", "exhaustive", "estimate")


def _digest(est) -> str | None:
    return None if est is None else hashlib.sha256(json.dumps(est.to_dict(), sort_keys=True).encode()).hexdigest()


def run_one(case: list[str], way: str, batch: int | None) -> dict:
    """One way of one case in this process: the answer, its estimates' digests and the seconds it took."""
    import dataclasses

    from trainmem.cli import build_parser, merge_options, option_keys, setup_from_options
    from trainmem.estimate import estimate
    from trainmem.fit import fit

    parser = build_parser()
    args = parser.parse_args(["fit", *case])
    options = merge_options(args, option_keys(parser))  # flags over the run defaults, as the CLI merges them
    args.device, args.margin = options.device, options.margin
    setup = setup_from_options(options)
    spent = _clock_the_steps()
    started, cpu_started = time.perf_counter(), time.process_time()
    if way.startswith("estimate"):  # estimate_cli: as `trainmem estimate` runs it, the lean loop traced too
        est = estimate(args.model, setup=dataclasses.replace(setup, batch_size=batch), device=args.device,
                       compare_loop=way == "estimate_cli", cache=False)  # each way traces: the trace cache is off
        return {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
                "process_bytes_high": est.process_bytes_high, **spent}
    result = fit(args.model, setup, args.device, margin=args.margin, exhaustive=way == "exhaustive", cache=False)
    return {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
            "best": result.best, "first_miss": result.first_miss,
            "tried": result.tried, "best_estimate": _digest(result.best_estimate),
            "miss_estimate": _digest(result.miss_estimate), "search": result.search, "text": str(result), **spent}


def _clock_the_steps() -> dict[str, float]:
    """Seconds spent tracing and replaying (assemble_traced: the target stream, the allocator, the report),
    summed over the calls: estimate() and fit() look both up in trainmem.estimate.orchestrate at call time."""
    import importlib

    spent = {"tracing_s": 0.0, "replaying_s": 0.0}
    for module_name in ("trainmem.estimate.orchestrate", "trainmem.fit"):
        module = importlib.import_module(module_name)
        for name, key in (("trace", "tracing_s"), ("assemble_traced", "replaying_s")):
            real = getattr(module, name)

            def clocked(*args, _real=real, _key=key, **kwargs):
                started = time.perf_counter()
                try:
                    return _real(*args, **kwargs)
                finally:
                    spent[_key] += time.perf_counter() - started

            setattr(module, name, clocked)
    return spent


def measure(case: list[str], way: str, batch: int | None = None) -> dict:
    command = [sys.executable, __file__, "--run", str(CASES.index(case)), way] + ([str(batch)] if batch else [])
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def same_answer(new: dict, old: dict) -> bool:
    keys = ("best", "first_miss", "tried", "best_estimate", "miss_estimate")
    return all(new[k] == old[k] for k in keys)


def compare(case: list[str]) -> dict:
    new = measure(case, "search")
    old = measure(case, "exhaustive")
    one = measure(case, "estimate", new["best"] or 1)
    cli = measure(case, "estimate_cli", new["best"] or 1)
    row = {"case": case, "search": new, "exhaustive": old, "estimate": one, "estimate_cli": cli,
           "identical": same_answer(new, old)}
    print(f"trainmem fit {' '.join(case)}: best {new['best']} / {old['best']}, first miss {new['first_miss']} / "
          f"{old['first_miss']}, identical {row['identical']}; search {new['seconds']:.1f} s (tracing "
          f"{new['tracing_s']:.1f}, replaying {new['replaying_s']:.1f}), exhaustive {old['seconds']:.1f} s, one "
          f"estimate {one['seconds']:.1f} s (tracing {one['tracing_s']:.1f}, replaying {one['replaying_s']:.1f}), "
          f"with the lean loop {cli['seconds']:.1f} s; CPU s {new['cpu_seconds']:.1f} / {one['cpu_seconds']:.1f}; "
          f"{new['search']['how']}", flush=True)
    return row


def _answer(result: dict) -> str:
    if result["best"] is None:
        return "none fits"
    return f"{result['best']:,} / " + ("—" if result["first_miss"] is None else f"{result['first_miss']:,}")


def report(rows: list[dict]) -> str:
    parts = ["# `trainmem fit` examples", "", "Generated by `python benchmarks/fit_examples.py`. The GPT-style model is "
             "tests/models.py:gpt_1b3 (24 layers, d_model 2048, 16 heads, vocabulary 50257, sequence 1024: "
             "1.3B parameters), AdamW with bf16 autocast. A batch fits when its high estimate (process_bytes_high) stays "
             "under capacity × (1 − margin); the default margin is the worst low error recorded in "
             "benchmarks/results/accuracy_gpu.md (CudaTarget.fit_margin, trainmem/targets/cuda_target.py), `--margin` overrides it. "
             "Exit code 0: a batch fits; 1: not even batch 1.", "",
             "## The batch search against the exhaustive search", "",
             "The batch search traces two batch sizes, predicts every other candidate's trace from them and replays "
             "only the allocator on it; the answer's batch is traced for real and must equal its prediction "
             "(trainmem/fit.py ScaledBatches). The exhaustive search is a whole estimate per candidate "
             "(`fit(..., exhaustive=True)`, the search before). *Identical*: the same answer and first miss, the "
             "same candidates with the same figures, and the answer's and the first miss's estimates equal to the "
             "byte (their JSON hashed). Seconds: each way in a fresh process, from the call to the answer, with "
             "the part spent tracing and replaying (the allocator with the target's stream and the report, "
             "`assemble_traced`); the rest is resolving the model (the first trace in a process also warms "
             "FakeTensorMode's dispatch cache). One estimate is `estimate()` at the answer's batch (batch 1 when "
             "none fits); `trainmem estimate` traces the lean loop as well (`compare_loop`), the last seconds "
             "column. When batch 1 does not fit, both searches trace the remedies (two more traces). The "
             "machine may be shared: *CPU s* (the process's own CPU time, `time.process_time()`) moves less with "
             "the load than wall seconds, and its ratio is the one to read.", "",
             "| case | exhaustive: best / first miss | batch search: best / first miss | identical | exhaustive s "
             "| batch search s (tracing + replaying) | one estimate s (tracing + replaying) | search ÷ estimate "
             "| CPU s: search / estimate (÷) | traced batch sizes (candidates) | `trainmem estimate` s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        new, old, one, cli = row["search"], row["exhaustive"], row["estimate"], row["estimate_cli"]
        parts.append(f"| `{' '.join(row['case'])}` | {_answer(old)} | {_answer(new)} | "
                     f"{'yes' if row['identical'] else 'NO'} | {old['seconds']:.1f} | {new['seconds']:.1f} "
                     f"({new['tracing_s']:.1f} + {new['replaying_s']:.1f}) | {one['seconds']:.1f} "
                     f"({one['tracing_s']:.1f} + {one['replaying_s']:.1f}) | {new['seconds'] / one['seconds']:.2f}× | "
                     f"{new['cpu_seconds']:.1f} / {one['cpu_seconds']:.1f} ({new['cpu_seconds'] / one['cpu_seconds']:.2f}×) | "
                     f"{', '.join(map(str, new['search']['traced']))} ({len(new['tried'])}) | {cli['seconds']:.1f} |")
    parts.append("")
    for row in rows:
        new = row["search"]
        parts += [f"## trainmem fit {' '.join(row['case'])}", "",
                  f"exit {0 if new['best'] is not None else 1}, {new['seconds']:.0f} s", "", "```", new["text"], "```", ""]
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="the cases whose command contains this (printed, the results file untouched)")
    parser.add_argument("--run", nargs="+", metavar=("CASE", "WAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        case, way = CASES[int(args.run[0])], args.run[1]
        print(json.dumps(run_one(case, way, int(args.run[2]) if len(args.run) > 2 else None)))
        return
    rows = [compare(case) for case in CASES if args.only is None or args.only in " ".join(case)]
    if args.only is None:
        (ROOT / "benchmarks/results/fit_examples.md").write_text(report(rows))
    if not all(row["identical"] for row in rows):
        raise SystemExit("the batch search's answer differs from the exhaustive search's")


if __name__ == "__main__":
    sys.exit(main())
