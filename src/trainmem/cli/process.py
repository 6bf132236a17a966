"""The process around a command: stdout kept for the result while user code runs, Ctrl-C that ends the
process at once, colour only on a terminal."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from trainmem.cli.outcome import EXIT_INTERRUPTED, INTERRUPTED_LINE


def stdout_wants_colour() -> bool:
    """Colour on a terminal only, never with NO_COLOR set (report/style.py)."""
    from trainmem.report.style import use_colour

    return use_colour(sys.stdout)


@contextlib.contextmanager
def user_output_to_stderr() -> Iterator[None]:
    """While the model is built and traced, stdout belongs to the user's code and the libraries it
    imports (a factory's print, transformers' notices): send it to stderr, so that stdout carries the
    result alone and `--format json | jq` works. Python-level writes follow sys.stdout; writes to file
    descriptor 1 from C extensions follow the descriptor, so fd 1 is pointed at fd 2 for the duration
    and restored before the result is printed. Where stdout has no descriptor (an in-process capture),
    only the Python level is redirected."""
    try:
        sys.stdout.flush()
        stdout_fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        stdout_fd = None
    saved = None
    if stdout_fd is not None:
        sys.stderr.flush()
        saved = os.dup(stdout_fd)
        os.dup2(sys.stderr.fileno(), stdout_fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, stdout_fd)
            os.close(saved)


def _interrupted(signum: int, frame: Any) -> None:
    """Ctrl-C: end now, from wherever the main thread is. A KeyboardInterrupt could be caught (or
    delayed) by the model's code or a library between here and main(); the handler runs between two
    bytecodes of the main thread, which a fake-tensor trace (Python through and through) reaches
    constantly, and os._exit skips every cleanup that could block (atexit, thread joins)."""
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a flush interrupted mid-write must not stop the exit
        pass
    os.write(2, INTERRUPTED_LINE)
    os._exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def sigint_handled_by(handler: Any) -> Iterator[None]:
    """`handler` for SIGINT during the block, the previous one after it; outside the main thread (main() called from
    a thread) the handler cannot be changed and Python's stays."""
    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def ctrl_c_ends_the_process() -> contextlib.AbstractContextManager[None]:
    return sigint_handled_by(_interrupted)
