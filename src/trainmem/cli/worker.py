"""The worker process of the command line (cli/supervisor.py starts it: `python -m trainmem.cli.worker`): it reads
one job (the command, its checked options and setup) from stdin, runs the command with the user's model code, and
sends the Outcome, or the one line that says why there is none, back on the pipe named by TRAINMEM_RESULT_FD.

Then it ends at once with os._exit: atexit handlers the model's code registered, threads it started and processes
it forked cannot add anything to the answer (the parent kills the worker's process group anyway). A copy of this
process that the model's code forked never answers: only the process that read the job does. stdout belongs to the
user's code here and goes to stderr; the parent alone prints the answer and writes the files.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from typing import Any

from trainmem.cli.outcome import EXIT_BAD_INPUT, EXIT_INTERRUPTED, Outcome
from trainmem.cli.supervisor import RESULT_FD_ENV


def serve() -> None:
    answer_fd = int(os.environ.pop(RESULT_FD_ENV))
    me = os.getpid()
    os.dup2(2, 1)  # the user's code's stdout (Python and C alike) goes to stderr
    sys.stdout = sys.stderr
    job = pickle.load(sys.stdin.buffer)
    answer = _run(job)
    if os.getpid() == me:  # a fork of the model's code reaches here too: only the worker itself answers
        _send(answer_fd, answer)
    os._exit(0)


def _run(job: dict[str, Any]) -> tuple[str, Any]:
    from trainmem.cli.main import error_line, execute
    from trainmem.cli.options import Options
    from trainmem.cli.output_files import deferred_writes
    from trainmem.errors import TrainmemError, one_line

    sys.modules["trainmem.cli.main"]._running = True  # a factory calling trainmem's main is refused, as in one process
    try:
        if "call" in job:  # the Python API's estimate(..., isolate=True): the Estimate itself comes back
            from trainmem.estimate.orchestrate import estimate

            return "outcome", estimate(job["model"], **job["keywords"])
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


def _send(fd: int, answer: tuple[str, Any]) -> None:
    try:
        data = pickle.dumps(answer)
    except Exception as error:  # noqa: BLE001 - an answer that cannot travel is still one line
        data = pickle.dumps(("failed", (f"trainmem: error: the worker's answer could not be sent back "
                                        f"({type(error).__name__}: {error})", EXIT_BAD_INPUT)))
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        view = view[os.write(fd, view):]


if __name__ == "__main__":
    serve()
