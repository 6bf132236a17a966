"""Runs hostile CLI cases inside one Python process, one after another, as `trainmem ARGV` would.

Importing torch costs seconds, so the table does not start a process per case: this runner imports
trainmem once and calls `trainmem.cli.main(argv)` for each case, the way the console script does
(`sys.exit(main())`). Per case it records what a shell would see: the exit status, everything written
to file descriptors 1 and 2 (redirected with dup2, so prints from C code and from the user's factory
are caught too), the wall time, and how far the resident set grew (VmHWM after the case minus VmRSS
before it; writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS on Linux).

    python runner.py CASES.json RESULTS.jsonl

CASES.json is a list of {"id", "argv", "cwd", "out"}; for each case RESULTS.jsonl gets a line
{"start": id, "rss": bytes} before it runs and {"id", "code", "seconds", "rss_growth", "rss_before"} after. The
case's output goes straight to the files out + ".stdout" / ".stderr", so that when a case ends the
whole process (os._exit in a user's factory, a segfault) the supervisor in tests/test_hostile.py still
has its output, and the process's exit status is the case's. Nothing here judges a result.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
import warnings


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def _run_main(main, argv: list[str]) -> int:
    """`sys.exit(main(argv))` as the console script runs it; whatever escapes main is handled as the
    interpreter would at top level: SystemExit's code becomes the status, anything else prints its
    traceback on stderr and exits 1."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    except BaseException:  # noqa: BLE001 - an escaped exception is part of what the case shows
        traceback.print_exc()
        return 1
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("text") prints the text and exits 1
    return 1


def run_case(main, case: dict, results) -> None:
    results.write(json.dumps({"start": case["id"], "rss": _status_kib("VmRSS") * 1024}) + "\n")
    results.flush()
    saved_environ, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_streams = sys.stdout, sys.stderr
    saved_sigint = signal.getsignal(signal.SIGINT)
    saved_fds = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(case["out"] + ".stdout", "wb") as out, open(case["out"] + ".stderr", "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
    os.chdir(case["cwd"])
    sys.argv = ["trainmem", *case["argv"]]
    # no gc.collect() here: with torch and transformers loaded one pass takes ~0.3 s, most of what a case
    # costs, and garbage left by the previous case can only lower this case's growth, never raise it
    _reset_peak_rss()
    rss_before = _status_kib("VmRSS")
    started = time.perf_counter()
    with warnings.catch_warnings():  # a case's warning filters do not leak into the next case
        code = _run_main(main, list(case["argv"]))
        for stream in (sys.stdout, sys.stderr, *saved_streams):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a stream the case closed
                pass
    seconds = time.perf_counter() - started
    peak = _status_kib("VmHWM")
    os.dup2(saved_fds[0], 1)
    os.dup2(saved_fds[1], 2)
    for fd in saved_fds:
        os.close(fd)
    sys.stdout, sys.stderr = saved_streams
    signal.signal(signal.SIGINT, saved_sigint)
    sys.argv = saved_argv
    os.chdir(saved_cwd)
    os.environ.clear()
    os.environ.update(saved_environ)
    results.write(json.dumps({"id": case["id"], "code": code, "seconds": round(seconds, 3),
                              "rss_before": rss_before * 1024, "rss_growth": (peak - rss_before) * 1024}) + "\n")
    results.flush()


def main() -> None:
    cases_path, results_path = sys.argv[1], sys.argv[2]
    with open(cases_path) as cases_file:
        cases = json.load(cases_file)
    import torch  # noqa: F401 - imported once for every case, the point of this runner

    from trainmem.cli import main as trainmem_main

    # One small estimate first: torch and trainmem import the rest lazily on first use, and that
    # one-time cost belongs to no case.
    with open(os.devnull, "w") as devnull:
        saved = os.dup(1)
        os.dup2(devnull.fileno(), 1)
        trainmem_main(["estimate", "mlp:4-2", "--input-shape", "4", "--format", "json"])
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    with open(results_path, "a") as results:
        for case in cases:
            run_case(trainmem_main, case, results)


if __name__ == "__main__":
    main()
