"""How long an estimate takes, and how much memory the estimating process needs.

Runs each command N times as a fresh process (wall clock; peak RSS from wait4's rusage, as
`/usr/bin/time -v` reports it) and writes the medians to benchmarks/results/speed.md.

    python benchmarks/speed.py [--runs 5]
Targets: the 1.3B GPT-style estimate in < 20 s with < 1 GiB peak RSS; the seed MLP CLI call < 3 s (issue #3);
a 70B model from its configuration in < 1 min (issue #5).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINMEM = [sys.executable, "-m", "trainmem"]
CASES = [
    ("seed MLP (whole CLI call)", TRAINMEM + ["estimate", "mlp:1000-100-100-100-100-10", "--input-shape", "1000",
                                              "--batch-size", "256", "--optimizer", "adam"], 3.0, None),
    ("GPT-style 1.3B, seq 1024, batch 8, AdamW, bf16-mixed",
     TRAINMEM + ["estimate", f"{ROOT}/tests/models.py:gpt_1b3", "--batch-size", "8", "--optimizer", "adamw",
                 "--precision", "bf16-mixed"], 20.0, 2**30),
    ("Llama-3.1-70B from the bundled config, seq 2048, batch 1, AdamW, bf16-mixed, on h100-80gb",
     TRAINMEM + ["estimate", "hf:meta-llama/Llama-3.1-70B", "--seq-len", "2048", "--optimizer", "adamw",
                 "--precision", "bf16-mixed", "--device", "h100-80gb"], 60.0, None),
    ("BERT-base masked LM on a100-40gb (the GPU calibration point)",
     TRAINMEM + ["estimate", "hf:bert-base-uncased", "--batch-size", "2", "--seq-len", "16", "--optimizer", "adamw",
                 "--device", "a100-40gb"], None, None),
    ("import torch alone (for scale)", [sys.executable, "-c", "import torch"], None, None),
]


def run_once(command: list[str]) -> tuple[float, int]:
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.environ["PYTHONPATH"] = str(ROOT / "src")
        os.execv(command[0], command)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # 1: does not fit, still a finished estimate
        raise SystemExit(f"command failed: {' '.join(command)}")
    return time.perf_counter() - started, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    lines = ["# Speed of an estimate", "",
             f"Generated {datetime.date.today()} by `python benchmarks/speed.py --runs {args.runs}` on "
             f"{os.cpu_count()} cores; medians (min–max) of {args.runs} fresh processes.", "",
             "| what | wall s | peak RSS MiB | target | met |", "|---|---:|---:|---|---|"]
    for name, command, wall_target, rss_target in CASES:
        results = [run_once(command) for _ in range(args.runs)]
        walls, rss = [r[0] for r in results], [r[1] for r in results]
        wall, peak = statistics.median(walls), statistics.median(rss)
        target = " ".join(filter(None, [f"< {wall_target:.0f} s" if wall_target else "",
                                        f"< {rss_target / 2**30:.0f} GiB" if rss_target else ""])) or "—"
        met = "—" if not (wall_target or rss_target) else (
            "yes" if (not wall_target or wall < wall_target) and (not rss_target or peak < rss_target) else "no")
        lines.append(f"| {name} | {wall:.2f} ({min(walls):.2f}–{max(walls):.2f}) | {peak / 2**20:.0f} | {target} | {met} |")
        print(lines[-1], flush=True)
    (ROOT / "benchmarks/results/speed.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
