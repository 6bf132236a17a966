"""A checkpoint loaded before training (--load, --resume, --checkpoint-dtype): estimated vs measured on this CPU.

Ground truth is benchmarks/truth_loops.py, which imports nothing of trainmem: one process writes the checkpoint
(`--write-checkpoint`, the state an earlier run saved), then fresh processes build the model and optimizer,
`torch.load(path, map_location="cpu")`, `load_state_dict` (and the optimizer's), `del checkpoint`, and train two
steps in the tutorial loop: the profiler's memory events for the tensor peak (one run of two steps), VmHWM of --runs
fresh processes of 32 steps for peak RSS (the run length the estimate's heap replay stands for by default). The same rows without the load are measured beside them, so the table shows what the load
adds. Prints a table and writes benchmarks/results/load_phase.md and benchmarks/data/load_phase.jsonl.

    python benchmarks/load_phase.py [--runs 3]

Targets: the tensor peak within 1% of the measured one (as accuracy_cpu.py's), peak RSS within 5% and
process_bytes_high at or above every measured run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem import estimate  # noqa: E402

TRUTH = ROOT / "benchmarks" / "truth_loops.py"
MODELS = str(ROOT / "tests" / "models.py")
MLP = "mlp:1000-2000-2000-10"
WIDE = "mlp:1000-4000-4000-10"
# (label, model, batch, optimizer, freeze patterns, load settings)
ROWS = [
    ("MLP, SGD, state dict", MLP, 8, "sgd", (), {}),
    ("MLP, momentum, resumed", MLP, 8, "momentum", (), {"resume": True}),
    ("MLP, Adam, resumed", MLP, 8, "adam", (), {"resume": True}),
    ("wide MLP, first layers frozen, SGD, state dict", WIDE, 8, "sgd", ("0.*", "2.*"), {}),
    ("wide MLP, first layers frozen, SGD, fp16 checkpoint", WIDE, 8, "sgd", ("0.*", "2.*"),
     {"checkpoint_dtype": "fp16"}),
    ("tiny GPT, AdamW, resumed", f"{MODELS}:tiny_gpt", 4, "adamw", (), {"resume": True}),
    ("tiny GPT, AdamW, bf16 checkpoint", f"{MODELS}:tiny_gpt", 4, "adamw", (), {"checkpoint_dtype": "bf16"}),
    ("small ResNet, momentum, resumed", f"{MODELS}:resnet_small", 8, "momentum", (), {"resume": True}),
    ("frozen backbone, SGD, state dict", f"{MODELS}:frozen_backbone", 8, "sgd", (), {}),
]
TENSOR_TARGET, RSS_TARGET = 0.01, 0.05
RSS_STEPS = 32


def _truth(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, str(TRUTH), *args], capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or (not lines and "--write-checkpoint" not in args):
        raise RuntimeError(f"{args}: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(lines[-1]) if lines else {}


def measured(model: str, batch: int, optimizer: str, freeze: tuple, load: dict, runs: int, folder: str) -> dict:
    common = [model, "--batch-size", str(batch), "--optimizer", optimizer, *[f"--freeze={p}" for p in freeze]]
    extra: list[str] = []
    if load is not None:
        path = str(Path(folder) / "checkpoint.pt")
        _truth([*common, "--write-checkpoint", path, *(["--resume"] if load.get("resume") else []),
                *(["--checkpoint-dtype", load["checkpoint_dtype"]] if load.get("checkpoint_dtype") else [])])
        extra = ["--load", path]
    tensors = _truth([*common, *extra, "--mode", "tensors"])["tensor_peak_bytes"]
    # RSS over the run length the estimate's heap replay stands for (a long run: 32 steps, as accuracy_cpu.py runs)
    rss = [_truth([*common, *extra, "--mode", "rss", "--steps", str(RSS_STEPS)])["peak_rss_bytes"] for _ in range(runs)]
    return {"tensor": tensors, "rss": statistics.median(rss), "rss_runs": rss}


def estimated(model: str, batch: int, optimizer: str, freeze: tuple, load: dict | None) -> dict:
    keywords = {"input_shape": "1000"} if model.startswith("mlp:") else {}
    if load is not None:
        keywords.update(load=load.get("load", "state-dict"), resume=load.get("resume", False),
                        checkpoint_dtype=load.get("checkpoint_dtype"))
    est = estimate(model, batch_size=batch, optimizer=optimizer, freeze=list(freeze), cache=False, **keywords)
    return {"tensor": est.tensor_bytes, "rss": est.process_bytes, "rss_high": est.process_bytes_high,
            "phase": est.peak_phase}


def run_rows(runs: int) -> list[dict]:
    rows = []
    for label, model, batch, optimizer, freeze, load in ROWS:
        with tempfile.TemporaryDirectory() as folder:
            row = {"label": label, "model": model, "batch": batch, "optimizer": optimizer, "freeze": list(freeze),
                   "load": {"load": "state-dict", **load}}
            for key, settings in (("without", None), ("with", load)):
                row[key] = {"measured": measured(model, batch, optimizer, freeze, settings, runs, folder),
                            "estimated": estimated(model, batch, optimizer, freeze, settings)}
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _errors(part: dict) -> tuple[float, float, bool]:
    est, meas = part["estimated"], part["measured"]
    return ((est["tensor"] - meas["tensor"]) / meas["tensor"], (est["rss"] - meas["rss"]) / meas["rss"],
            est["rss_high"] >= max(meas["rss_runs"]))


def _line(row: dict) -> str:
    mib = 1 << 20
    with_, without = row["with"], row["without"]
    tensor_err, rss_err, high_ok = _errors(with_)
    added = (with_["measured"]["tensor"] - without["measured"]["tensor"]) / mib
    return (f"| {row['label']} | {with_['estimated']['phase']} | {without['measured']['tensor'] / mib:.2f} | "
            f"{with_['measured']['tensor'] / mib:.2f} (+{added:.2f}) | {with_['estimated']['tensor'] / mib:.2f} | "
            f"{tensor_err:+.2%} | {with_['measured']['rss'] / mib:.1f} | {with_['estimated']['rss'] / mib:.1f} | "
            f"{rss_err:+.1%} | {with_['estimated']['rss_high'] / mib:.1f} | {'yes' if high_ok else 'NO'} |")


def write_markdown(rows: list[dict], runs: int) -> str:
    errors = [_errors(row["with"]) for row in rows]
    tensor_ok = sum(abs(t) <= TENSOR_TARGET for t, _, _ in errors)
    rss_ok = sum(abs(r) <= RSS_TARGET for _, r, _ in errors)
    high_ok = sum(h for _, _, h in errors)
    import torch

    lines = [
        "# A checkpoint loaded before training: estimated vs measured", "",
        f"Generated {datetime.date.today()} by `python benchmarks/load_phase.py --runs {runs}` on "
        f"{_cpu_name()}, torch {torch.__version__}. Ground truth: benchmarks/truth_loops.py (no trainmem code) writes "
        "the checkpoint in a process of its own, then trains after `torch.load(path, map_location=\"cpu\")`, "
        "`load_state_dict` (and the optimizer's with --resume) and `del checkpoint`; tensor peak from the "
        f"profiler's memory events (two steps), peak RSS the median VmHWM of {runs} fresh processes of {RSS_STEPS} steps. "
        "The estimate: "
        "`trainmem estimate MODEL --load state-dict [--resume] [--checkpoint-dtype D]`.", "",
        f"- tensor peak within 1%: **{tensor_ok}/{len(rows)}**; peak RSS within 5%: **{rss_ok}/{len(rows)}**; "
        f"high end at or above every run: **{high_ok}/{len(rows)}**", "",
        "| setup | estimated peak phase | measured tensors without the load, MiB | measured with it (added) | "
        "estimated | error | measured RSS MiB | estimated | error | high end | high ≥ every run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        *[_line(row) for row in rows], "",
    ]
    return "\n".join(lines)


def _cpu_name() -> str:
    from trainmem.targets.cpu_info import CpuInfo

    info = CpuInfo.this_machine()
    return f"{info.vendor} {info.capability}, family/model {info.model_id}, {info.threads} threads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = run_rows(args.runs)
    (ROOT / "benchmarks" / "data" / "load_phase.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = write_markdown(rows, args.runs)
    (ROOT / "benchmarks" / "results" / "load_phase.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
