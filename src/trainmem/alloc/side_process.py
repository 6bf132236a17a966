"""One replay run beside another: a forked child computes a pure-Python function while this process goes on.

Why. A CPU estimate replays its glibc heap twice over the same interleaved actions (alloc/replay.py glibc_heap):
as expected, and with every freed chunk pinned. Each is a long, single-threaded Python loop (millions of mallocs
and frees for a large model's long run: 2.5 and 3.2 s of a 1.3B model's 12.8 s on a 2-core AMD EPYC), and they
share nothing but their input. A forked child inherits the input without copying or pickling it, so the two run
at once where the machine has a second core, and the answer is the same number either way.

How. `beside(fn, *args)` forks (Linux only: forking is how the planner's workers start too, plan/workers.py),
and the child runs `fn(*args)`, writes its pickled result to a pipe and leaves with os._exit, running no
atexit handler or finalizer of the parent's. `Beside.result()` reads it; leaving the `with` block without reading
it kills and reaps the child. The function must touch no torch or TensorFlow state: an OpenMP thread pool does not
survive a fork. Where there is no fork or only one CPU, or
the child ends without an answer (killed for memory, a signal), `result()` runs `fn` here instead, so a
failure costs time, never the figure.

What it costs. Memory: the child reads every action, and reading a Python object writes its reference count, so
the pages holding the actions are copied into the child. On the 1.3B model the process tree's proportional set
peaked at 942 MiB during the replays, where the single process peaked at 700 MiB RSS (2026-12-07, AMD EPYC Zen 4).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import warnings
from collections.abc import Callable
from typing import Any


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Beside:
    """`fn(*args)` running in a forked child (or, without one, run here when asked for)."""

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self.fn, self.args = fn, args
        self.pid: int | None = None
        self.read_end: int | None = None
        if sys.platform.startswith("linux") and _cpus() > 1:
            self._fork()

    def _fork(self) -> None:
        read_end, write_end = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns on any fork of a process with threads (torch's); the child runs Python only
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: compute, answer, leave without the parent's exit handlers
            code = 1
            try:
                os.close(read_end)
                data = pickle.dumps(self.fn(*self.args))
                view = memoryview(data)
                while view:
                    view = view[os.write(write_end, view):]
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        self.pid, self.read_end = pid, read_end

    def result(self) -> Any:
        if self.pid is None:
            return self.fn(*self.args)
        chunks = []
        try:
            while chunk := os.read(self.read_end, 1 << 20):
                chunks.append(chunk)
        except BaseException:  # interrupted while waiting (Ctrl-C): not a wait for the child's whole replay
            self._stop()
            raise
        status = self._reap()
        if os.waitstatus_to_exitcode(status) != 0:
            return self.fn(*self.args)  # the child ended without an answer: the same figure, computed here
        return pickle.loads(b"".join(chunks))

    def __enter__(self) -> Beside:
        return self

    def __exit__(self, *exc: object) -> None:
        """Left before its result was read (the parent's own work raised, Ctrl-C): the child is killed and reaped."""
        if self.pid is not None:
            self._stop()

    def _stop(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> int:
        """Close the pipe and wait for the child; its wait status."""
        os.close(self.read_end)
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        return status


def beside(fn: Callable[..., Any], *args: Any) -> Beside:
    """`with beside(fn, *args) as running: ...; running.result()`"""
    return Beside(fn, args)
