"""Estimated vs measured training memory on this CPU, for the zoo × 2 batch sizes × 2 optimizers.

Each row runs trainmem's estimate in this process and the same setup for real in fresh processes
(`trainmem measure`: the profiler's memory events for the tensor peak, VmHWM for peak RSS, median of
--runs). Prints a table and writes benchmarks/results/accuracy_cpu.md.

    python benchmarks/accuracy_cpu.py [--runs 3] [--only NAME]
Targets (issue #3): tensor peak within 1% on every row; peak RSS within 5% on rows above 300 MB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem.measure.cpu import measure  # noqa: E402
from trainmem.setup import TrainingSetup  # noqa: E402

MODELS = ROOT / "tests" / "models.py"
ZOO = [  # (name, reference, extra setup, two batch sizes)
    ("mlp", "mlp:1000-100-100-100-100-10", {"input_shape": "1000"}, (256, 2048)),
    ("cnn_bn", f"{MODELS}:cnn_bn", {}, (16, 64)),
    ("resnet_small", f"{MODELS}:resnet_small", {}, (8, 32)),
    ("tiny_gpt", f"{MODELS}:tiny_gpt", {}, (4, 16)),
    ("tiny_gpt+ckpt", f"{MODELS}:tiny_gpt", {"checkpointing": True}, (4, 16)),
    ("transformer_encoder", f"{MODELS}:transformer_encoder", {}, (8, 32)),
    ("lstm", f"{MODELS}:lstm", {}, (8, 32)),
    ("gru", f"{MODELS}:gru", {}, (8, 32)),
    ("unet", f"{MODELS}:unet", {}, (4, 16)),
    ("frozen_backbone", f"{MODELS}:frozen_backbone", {}, (16, 64)),
    ("conv3d_net", f"{MODELS}:conv3d_net", {}, (4, 16)),
    ("mobilenet_like", f"{MODELS}:mobilenet_like", {}, (8, 32)),
]
OPTIMIZERS = ("adam", "momentum")
TENSOR_TARGET, RSS_TARGET, RSS_FLOOR = 0.01, 0.05, 300 * 10**6


def run_rows(runs: int, only: str | None) -> list[dict]:
    rows = []
    for name, ref, extra, batches in ZOO:
        if only and only != name:
            continue
        for batch in batches:
            for optimizer in OPTIMIZERS:
                setup = TrainingSetup.from_mapping({"batch_size": batch, "optimizer": optimizer, **extra})
                started = time.perf_counter()
                comparison = measure(ref, setup, runs=runs).to_dict()
                row = {"model": name, "batch": batch, "optimizer": optimizer, **_figures(comparison),
                       "seconds": time.perf_counter() - started}
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def _figures(comparison: dict) -> dict:
    est, measured, error = comparison["estimate"], comparison["measured"], comparison["error"]
    return {"est_tensor": est["peak"]["tensor_bytes"], "meas_tensor": measured["tensor_bytes"],
            "err_tensor": error["tensor_bytes"], "est_rss": est["peak"]["process_bytes"],
            "meas_rss": measured["process_bytes"], "err_rss": error["process_bytes"],
            "rss_runs": measured["process_bytes_runs"], "capability": measured["cpu_capability"],
            "threads": measured["threads"], "torch": measured["torch"]}


def _miss(row: dict) -> str:
    misses = []
    if abs(row["err_tensor"]) > TENSOR_TARGET:
        misses.append("tensor")
    if row["meas_rss"] > RSS_FLOOR and abs(row["err_rss"]) > RSS_TARGET:
        misses.append("rss")
    return ", ".join(misses)


def _line(row: dict) -> str:
    mib = 2**20
    spread = f"{min(row['rss_runs']) / mib:.0f}–{max(row['rss_runs']) / mib:.0f}"
    return (f"| {row['model']} | {row['batch']} | {row['optimizer']} | {row['est_tensor'] / mib:.2f} | "
            f"{row['meas_tensor'] / mib:.2f} | {row['err_tensor']:+.3%} | {row['est_rss'] / mib:.1f} | "
            f"{row['meas_rss'] / mib:.1f} | {spread} | {row['err_rss']:+.2%} | {_miss(row) or 'ok'} |")


REASONS = {
    "tensor": "tensor peak: a kernel allocates below the dispatcher in a way the CPU target has no rule for",
    "rss-low": "RSS low: the runtime's own small objects (autograd nodes, TensorImpls, Python buffers) land "
               "between tensor chunks and fragment glibc's heap; the estimate replays tensor allocations only "
               "(benchmarks/results/glibc_fidelity.md measures the effect)",
    "rss-high": "RSS high: the measured per-family runtime increment (tiny model) or the glibc model's chunk "
                "placement overstates this run; compare the run-to-run spread",
}


def _reasons(rows: list[dict]) -> list[str]:
    """Each reason once, with the rows it explains."""
    grouped: dict[str, list[str]] = {}
    for row in rows:
        miss = _miss(row)
        keys = (["tensor"] if "tensor" in miss else []) + (
            ["rss-low" if row["err_rss"] < 0 else "rss-high"] if "rss" in miss else [])
        for key in keys:
            grouped.setdefault(key, []).append(f"{row['model']} b{row['batch']} {row['optimizer']}")
    return [f"- {REASONS[key]}. Rows: {', '.join(names)}." for key, names in grouped.items()]


def write_markdown(rows: list[dict], runs: int) -> str:
    first = rows[0]
    tensor_ok = sum(abs(r["err_tensor"]) <= TENSOR_TARGET for r in rows)
    rss_rows = [r for r in rows if r["meas_rss"] > RSS_FLOOR]
    rss_ok = sum(abs(r["err_rss"]) <= RSS_TARGET for r in rss_rows)
    worst_tensor = max(rows, key=lambda r: abs(r["err_tensor"]))
    worst_rss = max(rows, key=lambda r: abs(r["err_rss"]))
    lines = [
        "# CPU accuracy: estimated vs measured",
        "",
        f"Generated {datetime.date.today()} by `python benchmarks/accuracy_cpu.py --runs {runs}` "
        f"(torch {first['torch']}, {first['capability']}, {first['threads']} threads).",
        "Measured tensor peak: profiler memory events, 64-byte rounded. Measured RSS: VmHWM of a fresh "
        f"process, median of {runs} run(s).",
        "",
        f"- tensor peak within 1%: **{tensor_ok}/{len(rows)}** rows; worst {worst_tensor['err_tensor']:+.3%} "
        f"({worst_tensor['model']}, batch {worst_tensor['batch']}, {worst_tensor['optimizer']})",
        f"- peak RSS within 5% (rows above 300 MB): **{rss_ok}/{len(rss_rows)}**; worst {worst_rss['err_rss']:+.2%} "
        f"({worst_rss['model']}, batch {worst_rss['batch']}, {worst_rss['optimizer']})",
        "",
        "| model | batch | optimizer | est. tensors MiB | meas. tensors MiB | error | est. RSS MiB | meas. RSS MiB "
        "| RSS runs MiB | error | misses |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
        *[_line(r) for r in rows],
        "",
        "## Rows that miss, and why",
        "",
        *(_reasons(rows) or ["none"]),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only")
    args = parser.parse_args()
    rows = run_rows(args.runs, args.only)
    text = write_markdown(rows, args.runs)
    if not args.only:
        (ROOT / "benchmarks/results/accuracy_cpu.md").write_text(text)
        data = ROOT / "benchmarks/data/accuracy_cpu.jsonl"  # the raw rows, one JSON object each
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(text)


if __name__ == "__main__":
    main()
