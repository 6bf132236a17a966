"""`trainmem calibrate`: this machine's CPU process floor, measured once for every later estimate here."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from trainmem.cli.options import MAX_RUNS
from trainmem.cli.outcome import EXIT_OK, Outcome
from trainmem.errors import TrainmemError


def add(commands: Any, add_command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    calibrate = commands.add_parser("calibrate", help="measure this machine's CPU process floor once, for every "
                                    "later estimate here (about a minute)")
    calibrate.add_argument("--runs", type=int, default=3, metavar="N",
                           help="fresh processes for the floor; N-1 for each kernel family, N-2 (at least 1) for each library set "
                                "(default: 3)")
    calibrate.add_argument("--no-libraries", action="store_true",
                           help="skip the increments of transformers and peft and TensorFlow's import floor (default: "
                                "measured when installed)")
    calibrate.add_argument("--format", choices=["text", "json"], default="text", help="(default: text)")


def run(args: argparse.Namespace) -> Outcome:
    from trainmem.calibrate import calibrate

    if not 1 <= args.runs <= MAX_RUNS:
        raise TrainmemError(f"expected --runs between 1 and {MAX_RUNS}, got {args.runs}", where="--runs")
    say = (lambda line: None) if args.format == "json" else (lambda line: print(line, file=sys.stderr, flush=True))
    done = calibrate(args.runs, libraries=not args.no_libraries, say=say)
    if args.format == "json":
        return Outcome(json.dumps({**done.entry, "stored": str(done.path), "seconds": round(done.seconds, 1)},
                                  indent=2), EXIT_OK)
    entry = done.entry
    return Outcome(f"calibrated {entry['cpu']} ({entry['capability']}, {entry['threads']} threads, torch "
                   f"{entry['torch']}) in {done.seconds:.0f} s: process floor {entry['floor_bytes'] / 2**20:.1f} MiB; "
                   f"stored in {done.path}; estimates on this machine now use it", EXIT_OK)
