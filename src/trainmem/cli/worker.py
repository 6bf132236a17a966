"""The worker process of the command line (trainmem/supervised.py starts it: `python -m trainmem.cli.worker`): it
reads one job (the command, its checked options and setup), runs the command with the user's model code, and
sends the Outcome, or the one line that says why there is none, back to the parent (supervised.serve), which alone
prints the answer and writes the files (rendered here, cli/output_files.py deferred_writes).
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from trainmem.cli.outcome import EXIT_BAD_INPUT, EXIT_INTERRUPTED, Outcome
from trainmem.supervised import serve


def run_job(job: dict[str, Any]) -> tuple[str, Any]:
    from trainmem.cli.main import error_line, execute
    from trainmem.cli.options import Options
    from trainmem.cli.output_files import deferred_writes
    from trainmem.errors import TrainmemError, one_line

    sys.modules["trainmem.cli.main"]._running = True  # a factory calling trainmem's main is refused, as in one process
    try:
        options = Options(job["values"], job["given"], job["origins"])
        with deferred_writes() as files:
            outcome = execute(job["command"], options, job["setup"], job["model"])
        return "outcome", Outcome(outcome.text, outcome.code, outcome.warnings, tuple(files))
    except KeyboardInterrupt:  # raised by the model's code itself (a real Ctrl-C reaches only the parent)
        return "failed", ("trainmem: interrupted", EXIT_INTERRUPTED)
    except Exception as error:  # noqa: BLE001 - every failure is one line for the parent to print
        if job["debug"]:
            traceback.print_exc()
        return "failed", (error_line(error), EXIT_BAD_INPUT)
    except BaseException as error:  # noqa: BLE001 - GeneratorExit, a BaseException subclass of the user's
        if job["debug"]:
            traceback.print_exc()
        line = TrainmemError(f"expected the model's code to return or raise an Exception, it raised "
                             f"{type(error).__name__}: {one_line(error)}", where=job["model"])
        return "failed", (error_line(line), EXIT_BAD_INPUT)


if __name__ == "__main__":
    serve(run_job)
