"""Estimated vs measured training memory on this CPU: the zoo and six held-out families × 2 batch sizes
× 2 optimizers, each in the default training loop (`inline`, PyTorch's tutorial loop).

Ground truth comes from benchmarks/truth_loops.py, which writes the loop as plain PyTorch and imports
nothing of trainmem: the profiler's memory events for the tensor peak (one run), VmHWM of --runs fresh
processes for peak RSS (median, with the spread). The estimate runs in this process. Prints a table
and writes benchmarks/results/accuracy_cpu.md and benchmarks/data/accuracy_cpu.jsonl.

    python benchmarks/accuracy_cpu.py [--runs 3] [--only NAME]
Targets (issue #9): tensor peak within 1% on every row; peak RSS within 5% on every row and never more
than 3% low; process_bytes_high at or above the measured median on every row.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem import estimate  # noqa: E402
from trainmem.setup import TrainingSetup  # noqa: E402

MODELS = ROOT / "tests" / "models.py"
TRUTH = ROOT / "benchmarks" / "truth_loops.py"
CLASS = {"target_shape": "scalar"}  # one class id per sample, made with the batch
ZOO = [  # (name, reference, extra setup, two batch sizes, truth-script flags)
    ("mlp", "mlp:1000-100-100-100-100-10", {"input_shape": "1000", **CLASS}, (256, 2048), []),
    ("cnn_bn", f"{MODELS}:cnn_bn", CLASS, (16, 64), []),
    ("resnet_small", f"{MODELS}:resnet_small", CLASS, (8, 32), []),
    ("tiny_gpt", f"{MODELS}:tiny_gpt", {"target_shape": "128"}, (4, 16), []),
    ("tiny_gpt+ckpt", f"{MODELS}:tiny_gpt", {"target_shape": "128", "checkpointing": True}, (4, 16),
     ["--checkpoint-blocks", "blocks"]),
    ("transformer_encoder", f"{MODELS}:transformer_encoder", CLASS, (8, 32), []),
    ("lstm", f"{MODELS}:lstm", CLASS, (8, 32), []),
    ("gru", f"{MODELS}:gru", CLASS, (8, 32), []),
    ("unet", f"{MODELS}:unet", {"target_shape": "96,96"}, (4, 16), []),
    ("frozen_backbone", f"{MODELS}:frozen_backbone", CLASS, (16, 64), []),
    ("conv3d_net", f"{MODELS}:conv3d_net", CLASS, (4, 16), []),
    ("mobilenet_like", f"{MODELS}:mobilenet_like", CLASS, (8, 32), []),
    # held out: families the zoo above does not have (issue #9)
    ("depthwise_gn", f"{MODELS}:depthwise_gn", CLASS, (8, 32), []),
    ("conv_autoencoder", f"{MODELS}:conv_autoencoder", {}, (8, 32), []),
    ("bigru", f"{MODELS}:bigru", CLASS, (8, 32), []),
    ("embbag_recsys", f"{MODELS}:embbag_recsys", {}, (256, 2048), []),
    ("einsum_attention", f"{MODELS}:einsum_attention", CLASS, (4, 16), []),
    ("tied_lm", f"{MODELS}:tied_lm", {}, (4, 16), []),
]
OPTIMIZERS = ("adam", "momentum")
TENSOR_TARGET, RSS_TARGET, RSS_LOW_TARGET = 0.01, 0.05, 0.03


def truth(reference: str, batch: int, optimizer: str, mode: str, flags: list[str], steps: int = 2) -> dict:
    command = [sys.executable, str(TRUTH), reference, "--batch-size", str(batch), "--optimizer", optimizer,
               "--loop", "inline", "--mode", mode, "--steps", str(steps), *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{reference} batch {batch}: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(lines[-1])


def run_rows(runs: int, only: str | None, optimizers=OPTIMIZERS) -> list[dict]:
    rows = []
    for name, ref, extra, batches, flags in ZOO:
        if only and only != name:
            continue
        for batch in batches:
            for optimizer in optimizers:
                started = time.perf_counter()
                est = estimate(ref, setup=TrainingSetup.from_mapping(
                    {"batch_size": batch, "optimizer": optimizer, "loop": "inline", **extra}))
                # the estimate stands for a long run (--steps default: alloc/steady_state.py); the RSS runs run
                # as many steps as its heap replay did, the profiled tensor run the two traced ones
                steps = int(est.coverage.get("heap_steps", 2))
                tensors = truth(ref, batch, optimizer, "tensors", flags)
                rss_runs = [truth(ref, batch, optimizer, "rss", flags, steps)["peak_rss_bytes"] for _ in range(runs)]
                row = {"model": name, "batch": batch, "optimizer": optimizer, "est_tensor": est.tensor_bytes,
                       "meas_tensor": tensors["tensor_peak_bytes"], "est_rss": est.process_bytes,
                       "est_rss_high": est.process_bytes_high, "meas_rss": int(statistics.median(rss_runs)),
                       "rss_runs": rss_runs, "capability": tensors["cpu_capability"],
                       "threads": tensors["threads"], "torch": tensors["torch"], "steps": steps,
                       "cpu": _cpu_name()}
                row["err_tensor"] = (row["est_tensor"] - row["meas_tensor"]) / row["meas_tensor"]
                row["err_rss"] = (row["est_rss"] - row["meas_rss"]) / row["meas_rss"]
                row["seconds"] = time.perf_counter() - started
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def re_estimate(row: dict, remeasure: bool = False) -> dict:
    """The row's estimate again with this checkout; the measurements stay. A run length that moved is refused
    (the measured runs ran the old one), or with `remeasure` its RSS runs are measured again at the new length,
    on this machine. A row measured before run lengths existed ran two steps."""
    name, ref, extra, _, _ = next(entry for entry in ZOO if entry[0] == row["model"])
    est = estimate(ref, setup=TrainingSetup.from_mapping(
        {"batch_size": row["batch"], "optimizer": row["optimizer"], "loop": "inline", **extra,
         **({} if "steps" in row else {"run_steps": 2})}))
    steps = int(est.coverage.get("heap_steps", 2))
    if steps != row.get("steps", 2) and remeasure:
        if row.get("cpu") != _cpu_name():
            raise SystemExit(f"{name} batch {row['batch']}: measured on {row.get('cpu')}, not on this CPU "
                             f"({_cpu_name()}): its runs cannot be measured again here")
        flags = next(entry for entry in ZOO if entry[0] == row["model"])[4]
        runs = [truth(ref, row["batch"], row["optimizer"], "rss", flags, steps)["peak_rss_bytes"]
                for _ in row["rss_runs"]]
        row = {**row, "rss_runs": runs, "meas_rss": int(statistics.median(runs)), "steps": steps}
    elif steps != row.get("steps", 2):
        raise SystemExit(f"{name} batch {row['batch']}: the estimate now stands for {steps} steps, the runs ran "
                         f"{row.get('steps', 2)}: measure again")
    row = {**row, "est_tensor": est.tensor_bytes, "est_rss": est.process_bytes, "est_rss_high": est.process_bytes_high}
    row["err_tensor"] = (row["est_tensor"] - row["meas_tensor"]) / row["meas_tensor"]
    row["err_rss"] = (row["est_rss"] - row["meas_rss"]) / row["meas_rss"]
    print(_line(row), flush=True)
    return row


def _cpu_name() -> str:
    from trainmem.calibrate import _cpu_name as name

    return name()


def _miss(row: dict) -> str:
    misses = []
    if abs(row["err_tensor"]) > TENSOR_TARGET:
        misses.append("tensor")
    if abs(row["err_rss"]) > RSS_TARGET or row["err_rss"] < -RSS_LOW_TARGET:
        misses.append("rss")
    if row["est_rss_high"] < row["meas_rss"]:
        misses.append("high")
    return ", ".join(misses)


def _line(row: dict) -> str:
    mib = 2**20
    spread = f"{min(row['rss_runs']) / mib:.0f}–{max(row['rss_runs']) / mib:.0f}"
    return (f"| {row['model']} | {row['batch']} | {row['optimizer']} | {row['est_tensor'] / mib:.2f} | "
            f"{row['meas_tensor'] / mib:.2f} | {row['err_tensor']:+.3%} | {row['est_rss'] / mib:.1f} | "
            f"{row['est_rss_high'] / mib:.1f} | {row['meas_rss'] / mib:.1f} | {spread} | {row['err_rss']:+.2%} | "
            f"{_miss(row) or 'ok'} |")


REASONS = {
    "tensor": "tensor peak: a kernel allocates below the dispatcher in a way the CPU target has no rule for",
    "rss-low": "RSS low: the runtime's small objects (TensorImpls, autograd nodes, oneDNN descriptors) are "
               "interleaved per op kind as the calibration runs' malloc logs show on average, but where they land "
               "changes from run to run and pins more of the heap in some runs (resnet_small batch 32 ran "
               "859–948 MiB); benchmarks/results/glibc_fidelity.md measures the mechanism",
    "rss-high": "RSS high: the small-object table's shape-keyed cache entries (oneDNN primitives of the LSTM, "
                "the depthwise convolutions) or the measured per-family runtime increment overstate this run; "
                "compare the run-to-run spread",
    "high": "process_bytes_high below the measured median: the modelled spread does not cover this run",
}


def _reasons(rows: list[dict]) -> list[str]:
    """Each reason once, with the rows it explains."""
    grouped: dict[str, list[str]] = {}
    for row in rows:
        miss = _miss(row)
        keys = (["tensor"] if "tensor" in miss else []) + (
            ["rss-low" if row["err_rss"] < 0 else "rss-high"] if "rss" in miss else []) + (
            ["high"] if "high" in miss else [])
        for key in keys:
            grouped.setdefault(key, []).append(f"{row['model']} b{row['batch']} {row['optimizer']}")
    return [f"- {REASONS[key]}. Rows: {', '.join(names)}." for key, names in grouped.items()]


def write_markdown(rows: list[dict], runs: int) -> str:
    first = rows[0]
    tensor_ok = sum(abs(r["err_tensor"]) <= TENSOR_TARGET for r in rows)
    rss_ok = sum(abs(r["err_rss"]) <= RSS_TARGET and r["err_rss"] >= -RSS_LOW_TARGET for r in rows)
    low = [r for r in rows if r["err_rss"] < 0]
    high_ok = sum(r["est_rss_high"] >= r["meas_rss"] for r in rows)
    high_all = sum(r["est_rss_high"] >= max(r["rss_runs"]) for r in rows)
    within = sum(abs(r["err_rss"]) <= RSS_TARGET for r in rows)
    worst_tensor = max(rows, key=lambda r: abs(r["err_tensor"]))
    worst_rss = max(rows, key=lambda r: abs(r["err_rss"]))
    spread = max((max(r["rss_runs"]) - min(r["rss_runs"])) / r["meas_rss"] for r in rows)
    lines = [
        "# CPU accuracy: estimated vs measured",
        "",
        f"Generated {datetime.date.today()} by `python benchmarks/accuracy_cpu.py --runs {runs}` "
        f"(torch {first['torch']}, {first.get('cpu', 'AMD EPYC')}, {first['capability']}, {first['threads']} threads). "
        f"RSS runs run {first.get('steps', 2)} steps, the run length the estimate's heap replay stands for "
        "(--steps, default a long run).",
        "Ground truth: benchmarks/truth_loops.py, the tutorial loop (`inline`) written as plain PyTorch with no "
        "trainmem code. Measured tensor peak: profiler memory events, 64-byte rounded. Measured RSS: VmHWM of a "
        f"fresh process, median of {runs} run(s); the runs column shows their spread. The last six models are "
        "held out: families the zoo did not have when the estimate was built.",
        "",
        f"- tensor peak within 1%: **{tensor_ok}/{len(rows)}** rows; worst {worst_tensor['err_tensor']:+.3%} "
        f"({worst_tensor['model']}, batch {worst_tensor['batch']}, {worst_tensor['optimizer']})",
        f"- peak RSS within 5% and at most 3% low: **{rss_ok}/{len(rows)}**; worst {worst_rss['err_rss']:+.2%} "
        f"({worst_rss['model']}, batch {worst_rss['batch']}, {worst_rss['optimizer']}); rows low: {len(low)}",
        f"- peak RSS within 5% either way (issue 21's target): **{within}/{len(rows)}**",
        f"- process_bytes_high at or above the measured median: **{high_ok}/{len(rows)}**; at or above every measured "
        f"run: **{high_all}/{len(rows)}**",
        f"- largest run-to-run RSS spread (max − min over the median): {spread:.1%}",
        "",
        "| model | batch | optimizer | est. tensors MiB | meas. tensors MiB | error | est. RSS MiB | high MiB "
        "| meas. RSS MiB | RSS runs MiB | error | misses |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *[_line(r) for r in rows],
        "",
        "## Rows that miss, and why",
        "",
        *(_reasons(rows) or ["none"]),
        "",
    ]
    return "\n".join(lines)


def cpu_from_facts(facts: str):
    """The CpuInfo of the machine that --as-cpu names: VENDOR,CAPABILITY,THREADS[,bf16][,vnni][,amx][,model=F/M]."""
    from trainmem.targets.cpu_info import CpuInfo

    vendor, capability, threads, *rest = facts.split(",")
    model_id = next((fact.removeprefix("model=") for fact in rest if fact.startswith("model=")), "")
    return CpuInfo(capability, int(threads), avx512_bf16="bf16" in rest, amx="amx" in rest,
                   avx512_vnni="vnni" in rest, vendor=vendor, model_id=model_id)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="comma-separated (default: both)")
    parser.add_argument("--re-estimate", action="store_true", help="estimate the rows of the data file again with "
                        "this checkout and keep their measurements (the run length must not change)")
    parser.add_argument("--remeasure", action="store_true", help="with --re-estimate: rows whose run length "
                        "moved are measured again at the new length (RSS runs only; on this machine)")
    parser.add_argument("--as-cpu", metavar="VENDOR,CAPABILITY,THREADS[,bf16][,vnni][,amx][,model=F/M]",
                        help="with --re-estimate: estimate as for the CPU the rows were measured on (another "
                        "machine's recorded rows), e.g. AuthenticAMD,AVX2,2 or GenuineIntel,AVX512,2,bf16,vnni,amx; "
                        "writes accuracy_cpu_TAG_estimated_here.md")
    parser.add_argument("--tag", default="", help="results and data under accuracy_cpu_TAG.md/.jsonl (another "
                        "machine's table is kept)")
    parser.add_argument("--load", action="store_true", help="re-render from benchmarks/data/accuracy_cpu.jsonl")
    args = parser.parse_args()
    name = "accuracy_cpu" + (f"_{args.tag}" if args.tag else "")
    data = ROOT / f"benchmarks/data/{name}.jsonl"
    result = ROOT / f"benchmarks/results/{name}.md"
    if args.load or args.re_estimate:
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        if args.re_estimate and args.as_cpu:  # another machine's rows: estimated as for that CPU, results apart
            from trainmem.targets.cpu_info import CpuInfo

            other = cpu_from_facts(args.as_cpu)
            CpuInfo.this_machine = classmethod(lambda cls: other)
            rows = [re_estimate(row) for row in rows]
            (ROOT / f"benchmarks/results/{name}_estimated_here.md").write_text(
                write_markdown(rows, len(rows[0]["rss_runs"])).replace(
                    "# CPU accuracy: estimated vs measured",
                    f"# CPU accuracy: {name}'s recorded rows (measured on {other.vendor} {other.capability}), estimated on "
                    f"{_cpu_name()} as for that CPU by `python benchmarks/accuracy_cpu.py --re-estimate --as-cpu "
                    f"{args.as_cpu}{' --tag ' + args.tag if args.tag else ''}`"))
            return
        if args.re_estimate:
            rows = [re_estimate(row, args.remeasure) for row in rows]
            data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        result.write_text(write_markdown(rows, len(rows[0]["rss_runs"])))
        return
    rows = run_rows(args.runs, args.only, tuple(args.optimizers.split(",")))
    text = write_markdown(rows, args.runs)
    if not args.only:
        result.write_text(text)
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(text)


if __name__ == "__main__":
    main()
