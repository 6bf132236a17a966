"""Every exit path of the `trainmem` command, with its exit status: the hostile-input table of tests/test_hostile.py
(each case's command, the status it must end with, what its one line must name) run through the real command line
as a shell runs it (`python -m trainmem …` in a process of its own, so the model's code runs in the supervised
worker), checked against the same contract, and written as a table.

    python benchmarks/exit_paths.py [--only TEXT] [--jobs 2]      # writes benchmarks/results/exit_paths.md

The test suite runs most of these cases in one process that calls trainmem.cli.main(argv) per case (fast: torch is
imported once); this runs each as its own process, the supervised path, which takes about 3 s a case here.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "exit_paths.md"
sys.path.insert(0, str(ROOT / "tests"))

MEANING = {0: "an answer: fits", 1: "an answer: does not fit (something was evaluated)",
           2: "bad input, or the model's code failed: one line", 130: "interrupted (Ctrl-C)", 141: "stdout closed",
           143: "terminated (SIGTERM)"}


def run(only: str | None, jobs: int) -> list[tuple]:
    import test_hostile as table

    cases = [case for case in table.CASES if not only or only in case.id]
    rows = []
    with tempfile.TemporaryDirectory(prefix="trainmem-exit-paths-") as scratch:
        root = Path(scratch)

        def one(case):
            directory = root / case.id
            directory.mkdir()
            argv = case.argv(directory) if callable(case.argv) else list(case.argv)
            # the runner's resident-set bounds are the test's (one process for all cases); here each case is its own
            own = dataclasses.replace(case, process=case.process or "cli", rss_limit=None, rss_at_least=None)
            started = time.monotonic()
            if any("\0" in arg for arg in argv):  # a NUL byte: no shell can pass it (execve's strings end there)
                return (case.id, argv[0], case.codes, None, "not a command line: an argument holds a NUL byte",
                        [], time.monotonic() - started)
            result = table._run_in_own_process(own, directory, argv, root)  # noqa: SLF001 - the table's own runner
            result.update(argv=argv, directory=directory)
            result.pop("process_rss", None)
            problems = table._problems(dataclasses.replace(own, seconds=table.PROCESS_SECONDS), result)  # noqa: SLF001
            line = next((text for text in result["stderr"].splitlines() if text.startswith(("trainmem:", "warning:"))),
                        "")
            return (case.id, " ".join(argv[:1]), case.codes, result["code"], line.replace(str(directory), "DIR"),
                    problems, time.monotonic() - started)

        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            for row in pool.map(one, cases):
                rows.append(row)
                print(f"{row[0]:55s} expected {'/'.join(map(str, row[2])):7s} got {str(row[3]):4}  "
                      f"{'ok' if not row[5] else '; '.join(row[5])[:80]}", flush=True)
    return rows


def write(rows: list[tuple], only: str | None) -> None:
    rows = [row for row in rows if row[3] is not None] + [row for row in rows if row[3] is None]
    held = sum(1 for row in rows if not row[5] and row[3] is not None)
    skipped = [row[0] for row in rows if row[3] is None]
    codes = Counter(row[3] for row in rows if row[3] is not None)
    lines = ["# Exit paths of the `trainmem` command", "",
             f"Generated {time.strftime('%Y-%m-%d')} by `python benchmarks/exit_paths.py"
             + (f" --only {only}" if only else "") + "`: every case of tests/test_hostile.py run as a shell runs "
             "it (`python -m trainmem …`, a process of its own: the model's code in the supervised worker, "
             "supervised.py), held to the table's contract (one `trainmem: error:` line with exit 2 naming what "
             "the case says, an answer with exit 0/1, no traceback).", "",
             "Exit status: " + "; ".join(f"{code} {words}" for code, words in MEANING.items()) + ".", "",
             f"**{held} of {len(rows) - len(skipped)} cases hold the contract.** "
             + (f"Not run ({len(skipped)}): {', '.join(skipped)}: an argument holds a NUL byte, which no command line "
                "can carry (the test runs them through trainmem.cli.main). " if skipped else "") + "Exit statuses seen: "
             + ", ".join(f"{code}: {count}" for code, count in sorted(codes.items())) + ".", "",
             "| case | command | expected | got | first line on stderr | contract |", "|---|---|---|---:|---|---|"]
    for case_id, command, expected, got, line, problems, _ in rows:
        shown = line.replace("|", "\\|")[:160]
        lines.append(f"| {case_id} | {command} | {'/'.join(map(str, expected))} | {got} | {shown} | "
                     f"{'holds' if not problems else '; '.join(problems).replace('|', '/')} |")
    RESULT.write_text("\n".join(lines) + "\n")
    print(f"{held} of {len(rows) - len(skipped)} hold; wrote {RESULT}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="only the cases whose id contains this text")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    write(run(args.only, args.jobs), args.only)


if __name__ == "__main__":
    main()
