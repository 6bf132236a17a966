"""--compile on this CPU: trainmem's estimate of a torch.compile'd training step against real compiled runs.

Ground truth is benchmarks/truth_loops.py with --compile (`model = torch.compile(model)`, Inductor, as PyTorch's
tutorial writes it), which imports nothing of trainmem: the profiler's memory events for the tensor peak (one run),
VmHWM for peak RSS. Each RSS run compiles cold, in an Inductor cache directory of its own, as a first run on a new
machine does (a warm cache skips the C++ builds; gcc runs in child processes either way, so it is not in the RSS).
The eager estimate of the same row is printed beside the compiled one to show what compiling changes.
Writes benchmarks/results/compile_cpu.md and benchmarks/data/compile_cpu.jsonl.

    python benchmarks/compile_cpu.py [--only NAME] [--re-estimate]

Target (issue 23): the compiled tensor peak within 5% of the real compiled run, on three model families or more.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainmem import estimate  # noqa: E402
from trainmem.setup import TrainingSetup  # noqa: E402

MODELS = ROOT / "tests" / "models.py"
TRUTH = ROOT / "benchmarks" / "truth_loops.py"
ROWS = [  # (family, reference, two batch sizes, optimizer)
    ("mlp", "mlp:1024-2048-2048-2048-10", (256, 1024), "momentum"),
    ("cnn_bn", f"{MODELS}:cnn_bn", (16, 64), "adam"),
    ("resnet_small", f"{MODELS}:resnet_small", (8, 32), "adam"),
    ("tiny_gpt", f"{MODELS}:tiny_gpt", (4, 16), "adam"),
    ("transformer_encoder", f"{MODELS}:transformer_encoder", (8, 32), "adam"),
    ("conv_autoencoder", f"{MODELS}:conv_autoencoder", (8, 32), "adam"),
]
TARGET = 0.05


def truth(reference: str, batch: int, optimizer: str, mode: str, compiled: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="inductor-cold-") as cache:
        command = [sys.executable, str(TRUTH), reference, "--batch-size", str(batch), "--optimizer", optimizer,
                   "--mode", mode, *(["--compile"] if compiled else [])]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache})
    if done.returncode != 0:
        raise RuntimeError(f"{reference} b{batch}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def estimated(reference: str, batch: int, optimizer: str, compiled: bool) -> tuple[dict, float]:
    setup = TrainingSetup(batch_size=batch, optimizer=optimizer, compile=compiled)
    started = time.perf_counter()
    result = estimate(reference, setup=setup, device="cpu", cache=False).to_dict()
    return result["peak"], time.perf_counter() - started


def run_row(family: str, reference: str, batch: int, optimizer: str) -> dict:
    tensors = truth(reference, batch, optimizer, "tensors")
    rss = truth(reference, batch, optimizer, "rss")
    eager_rss = truth(reference, batch, optimizer, "rss", compiled=False)
    peak, seconds = estimated(reference, batch, optimizer, compiled=True)
    eager, _ = estimated(reference, batch, optimizer, compiled=False)
    return {"family": family, "batch": batch, "optimizer": optimizer, "torch": tensors["torch"],
            "real_tensor": tensors["tensor_peak_bytes"], "est_tensor": peak["tensor_bytes"],
            "eager_tensor": eager["tensor_bytes"], "real_rss": rss["peak_rss_bytes"],
            "eager_real_rss": eager_rss["peak_rss_bytes"], "eager_est_rss": eager["process_bytes"],
            "est_rss": peak["process_bytes"], "est_rss_high": peak["process_bytes_high"],
            "estimate_seconds": round(seconds, 1), "real_seconds": round(rss["seconds"], 1)}


def re_estimate(row: dict) -> dict:
    """The row with this trainmem's estimates, the real runs' figures as they were measured."""
    reference = next(reference for family, reference, _, _ in ROWS if family == row["family"])
    peak, seconds = estimated(reference, row["batch"], row["optimizer"], compiled=True)
    eager, _ = estimated(reference, row["batch"], row["optimizer"], compiled=False)
    return {**row, "est_tensor": peak["tensor_bytes"], "eager_tensor": eager["tensor_bytes"],
            "est_rss": peak["process_bytes"], "est_rss_high": peak["process_bytes_high"],
            "eager_est_rss": eager["process_bytes"], "estimate_seconds": round(seconds, 1)}


def _pct(estimate_bytes: int, real: int) -> str:
    return f"{(estimate_bytes - real) / real * 100:+.2f}%"


def _mib(value: int) -> str:
    return f"{value / 2**20:,.2f}"


def _line(row: dict) -> str:
    return (f"| {row['family']} | {row['batch']} | {row['optimizer']} | {_mib(row['real_tensor'])} | "
            f"{_mib(row['est_tensor'])} | {_pct(row['est_tensor'], row['real_tensor'])} | "
            f"{_pct(row['eager_tensor'], row['real_tensor'])} | {_mib(row['real_rss'])} | "
            f"{_mib(row['real_rss'] - row['eager_real_rss'])} | {_pct(row['eager_est_rss'], row['eager_real_rss'])} | "
            f"{_pct(row['est_rss'], row['real_rss'])} | {_pct(row['est_rss_high'], row['real_rss'])} | "
            f"{row['estimate_seconds']} | {row['real_seconds']} |")


def write_markdown(rows: list[dict], tag: str = "") -> str:
    errors = [abs(r["est_tensor"] - r["real_tensor"]) / r["real_tensor"] for r in rows]
    within = sum(error <= TARGET for error in errors)
    families = {r["family"] for r, error in zip(rows, errors) if error <= TARGET}
    rss_low = [r for r in rows if r["est_rss_high"] < r["real_rss"]]
    rss_low_point = [r for r in rows if r["est_rss"] < r["real_rss"]]
    rss_within = sum(abs(r["est_rss"] - r["real_rss"]) <= 0.05 * r["real_rss"] for r in rows)
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    lines = [
        "# --compile on the CPU: estimate vs real torch.compile runs", "",
        f"Generated by `python benchmarks/compile_cpu.py{' --tag ' + tag if tag else ''}` on {datetime.date.today()} ({cpu}, torch "
        f"{rows[0]['torch']}). Ground truth: benchmarks/truth_loops.py `--compile` (`model = torch.compile(model)`, "
        "Inductor; imports nothing of trainmem), the tutorial loop, two steps; tensor peak from the profiler's "
        "memory events, peak RSS (VmHWM) of a run that compiles cold (an Inductor cache directory of its own).", "",
        f"**Tensor peak: {within} of {len(rows)} rows within {TARGET:.0%} of the real compiled run, in "
        f"{len(families)} families** (median |error| {sorted(errors)[len(errors) // 2] * 100:.3f}%, worst "
        f"{max(errors) * 100:.3f}%). The eager column is trainmem's estimate without --compile against the same "
        "compiled run: what compiling changes, and what an eager estimate would have said.", "",
        f"Peak RSS: {rss_within} of {len(rows)} rows within 5%, {len(rss_low_point)} below the real run; the high end "
        f"is below the real run on {len(rss_low)}. The estimate adds to the eager process model what torch.compile "
        "keeps resident (74 MiB here) and, where the tensors' heap is smaller, what compiling held beyond it "
        "(26 MiB; the high end always adds it), both measured by `trainmem calibrate` on a tiny model. 'compiling "
        "added' is the real runs' increment over the same loop run eager (one cold run each): 11 to 96 MiB, and "
        "negative where the compiled convolutions skip the eager NCHW path's reorder buffers (resnet_small b32). "
        "The column beside it is the eager process model on the same rows run eager. Where compiling shrinks the "
        "tensors (transformer_encoder, resnet_small, tiny_gpt) the compiled point falls below the real run although "
        "the eager one is not low: the real RSS does not shrink with the compiled step's smaller tensors as the heap "
        "replay says it does. That is not explained yet; the high end, which adds all that compiling held, is what "
        "covers those rows.", "",
        "conv_autoencoder's ConvTranspose2d layers are channels-last transposed convolutions, whose oneDNN sequences "
        "were not measured (targets/onednn/conv_channels_last.py covers plain 2-D convolutions): they keep the NCHW "
        "model's reorder buffers, which the NHWC kernels do not allocate, and the tensor peak comes out high.", "",
        "| family | batch | optimizer | real tensor peak MiB | estimate MiB | error | eager estimate's error | "
        "real peak RSS MiB | compiling added MiB | eager RSS estimate vs eager run | RSS estimate | RSS high end | "
        "estimate s | real run s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[_line(row) for row in rows], ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", help="one family")
    parser.add_argument("--re-estimate", action="store_true", help="estimate the committed rows again (the real "
                        "runs' figures kept) and write both files")
    parser.add_argument("--tag", default="", help="another machine's files: compile_cpu_TAG.md/.jsonl (the untagged "
                        "ones are the Intel Xeon's, AMX)")
    args = parser.parse_args()
    name = "compile_cpu" + (f"_{args.tag}" if args.tag else "")
    data = ROOT / "benchmarks" / "data" / f"{name}.jsonl"
    result = ROOT / "benchmarks" / "results" / f"{name}.md"
    if args.re_estimate:
        rows = [re_estimate(json.loads(line)) for line in data.read_text().splitlines() if line.strip()]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        result.write_text(write_markdown(rows, args.tag))
        return
    rows = []
    for family, reference, batches, optimizer in ROWS:
        if args.only and family != args.only:
            continue
        for batch in batches:
            row = run_row(family, reference, batch, optimizer)
            print(_line(row), flush=True)
            rows.append(row)
    if args.only:
        return
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result.write_text(write_markdown(rows, args.tag))


if __name__ == "__main__":
    main()
