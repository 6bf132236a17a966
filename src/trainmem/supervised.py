"""A supervised worker process for the user's model code: the `trainmem` command's (cli/worker.py runs a command in
it) and the Python API's estimate(..., isolate=True) (estimate/isolated.py). The parent parses and checks
everything first, runs the model's code in the worker and keeps what the user sees in its own hands.

Why a worker: the user's model code (a factory, a forward, the libraries they import) runs inside trainmem. In one
process it can print after the answer from atexit, start a thread that never ends, fork, ignore Ctrl-C, close
stderr or end the process with os._exit. In the worker it can do all of that and the answer stays the answer:
- the worker starts in a session and process group of its own, so the terminal's Ctrl-C reaches only this parent,
  which kills the worker's whole group (anything it forked or started included) and exits 130 (SIGTERM: 143);
- the worker sends its Outcome back as data on a pipe of its own, then ends at once (os._exit: no atexit handler,
  no thread join); the parent then kills the group, so nothing the worker left running can write after the answer;
- only the parent writes to stdout and writes the output files (the worker hands their bytes back, cli/output_files
  .py `deferred_writes`); the user's code's stdout goes to stderr for the worker's whole life;
- a worker that ends without an answer (os._exit, a crash, a signal), runs past --timeout or grows past the memory
  bound is one line naming what happened, exit 2, never 1 ("does not fit").
A Python program calling `trainmem.cli.main(argv)` (tests, notebooks) runs the command in its own process, as
before; so does the command line with TRAINMEM_IN_PROCESS=1 (for debugging the worker itself).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
import time
from typing import Any

from collections.abc import Callable

from trainmem.errors import TrainmemError

EXIT_INTERRUPTED = 128 + 2  # SIGINT's number, as a shell reports a process Ctrl-C ended (cli/outcome.py)
EXIT_TERMINATED = 128 + 15  # SIGTERM's number

RESULT_FD_ENV = "TRAINMEM_RESULT_FD"  # the worker's end of the pipe its answer comes back on
IN_PROCESS_ENV = "TRAINMEM_IN_PROCESS"
DEFAULT_TIMEOUT_SECONDS = 24 * 3600  # a 70B plan or a long measure takes hours at most; a hung factory for ever
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600
# The worker may hold at most this share of the machine's RAM: an estimate allocates no tensor memory, so only the
# user's own code (a real weight at import, a runaway loop) comes near it; it is stopped before the machine swaps
MEMORY_SHARE = 0.9
POLL_SECONDS = 0.1


def supervised() -> bool:
    return os.environ.get(IN_PROCESS_ENV, "") in ("", "0")


def run_in_worker(job: dict[str, Any], entry: str, timeout: float, timeout_said: str = "",
                  timeout_where: str = "--timeout") -> Any:
    """Run `job` in a worker process started as `python -m ENTRY` (a module whose main calls `serve`: cli/worker.py,
    estimate/isolated.py) and return its answer; WorkerFailed with the worker's own line, TrainmemError for a worker
    that ended, hung or grew too large. Ctrl-C and SIGTERM kill the worker's group and end this process.
    `timeout_said`: the time limit in the user's words (cli/options.py timeout_words), `timeout_where` what set it."""
    read_end, write_end = os.pipe()
    environment = {**os.environ, RESULT_FD_ENV: str(write_end)}
    try:
        process = subprocess.Popen([sys.executable, "-m", entry], stdin=subprocess.PIPE, stdout=2,
                                   pass_fds=(write_end,), env=environment, start_new_session=True)
    finally:
        os.close(write_end)
    with _signals_kill(process):
        try:
            _send(process, job)
            limit = (timeout, timeout_said or f"{timeout:g} s", timeout_where)
            data = _answer(process, read_end, limit, str(job.get("model") or "MODEL"))
        finally:
            os.close(read_end)
            _kill_group(process)
    kind, value = pickle.loads(data)
    if kind == "failed":
        raise WorkerFailed(*value)
    return value


class WorkerFailed(TrainmemError):
    """The worker's own stderr line (already "trainmem: error: …") and exit code, printed and returned as they are."""

    def __init__(self, line: str, code: int) -> None:
        super().__init__(line)
        self.line, self.code = line, code


def _send(process: subprocess.Popen, job: dict[str, Any]) -> None:
    try:
        process.stdin.write(pickle.dumps(job))
        process.stdin.close()
    except (BrokenPipeError, OSError):  # it ended before reading: _answer says how
        pass


def _answer(process: subprocess.Popen, read_end: int, timeout: tuple[float, str, str], model: str) -> bytes:
    """The worker's framed answer (8-byte length, then a pickle), read as it comes; the bounds checked meanwhile.
    `timeout`: the seconds, in the user's words, and what set them."""
    data = bytearray()
    deadline = time.monotonic() + timeout[0]
    limit = int(_memory_total() * MEMORY_SHARE)
    while True:
        ready, _, _ = select.select([read_end], [], [], POLL_SECONDS)
        if ready:
            chunk = os.read(read_end, 1 << 20)
            data += chunk
            if _complete(data):
                return bytes(data[8:8 + int.from_bytes(data[:8], "big")])
            if not chunk:  # end of file without a whole answer: the worker has ended
                raise TrainmemError(_ended_words(process), where=model)
        if time.monotonic() > deadline:
            raise TrainmemError(f"expected the model's code to finish within {timeout[1]}, it was "
                                "still running: stopped (raise --timeout for a run this long)", where=timeout[2])
        if limit and tree_resident_bytes(process.pid, exact_above=limit) > limit:
            raise TrainmemError(f"expected the model's code to stay within {limit / 2**30:.1f} GiB of RAM ("
                                f"{MEMORY_SHARE:.0%} of this machine's), the worker running it (with the processes "
                                "it started) grew past that: stopped "
                                "(an estimate allocates no tensor memory; the model's code allocated for real)",
                                where=model)


def _complete(data: bytearray) -> bool:
    return len(data) >= 8 and len(data) >= 8 + int.from_bytes(data[:8], "big")


def _ended_words(process: subprocess.Popen) -> str:
    try:
        status = process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        status = None
    if status is None:
        how = "closed its answer pipe and went on running"
    elif status < 0:
        how = f"was killed by signal {signal.Signals(-status).name}"
    else:
        how = f"exited with status {status}"
    return (f"expected the model's code to return to trainmem, the worker running it {how} before answering (the "
            "model's code or a library it uses ended the process: os._exit, a crash, the kernel's OOM killer)")


def _proc_bytes(path: str, field: str) -> int | None:
    """The first `field` line of a /proc file whose values are in kB, in bytes; None where it cannot be read."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def resident_bytes(pid: int) -> int:
    """A process's resident set (VmRSS, /proc/PID/status); 0 where there is no /proc."""
    return _proc_bytes(f"/proc/{pid}/status", "VmRSS:") or 0


def proportional_bytes(pid: int) -> int:
    """A process's proportional set (Pss, /proc/PID/smaps_rollup): each page it shares with n processes counts 1/n.
    Falls back to its resident set where the kernel has no smaps_rollup (before Linux 4.14)."""
    found = _proc_bytes(f"/proc/{pid}/smaps_rollup", "Pss:")
    return resident_bytes(pid) if found is None else found


def tree_resident_bytes(pid: int, most: int = 4096, exact_above: int = 0) -> int:
    """The memory of a process and every process it started (plan's forked workers, the heap replay's forked child,
    whatever the model's code forked). A fork shares its parent's pages until either writes them, so the resident
    sets of a tree count those pages once per process: where there is more than one and their sum is above
    `exact_above`, each process's proportional set is summed instead, which counts every page once (reading it walks
    the page tables: 19 ms for a 1.5 GiB process, against 0.02 ms for the resident set, so a bound polled ten times
    a second reads it only when the cheap sum, never below it, crosses the bound). Children are read from
    /proc/PID/task/TID/children; where the kernel has no such file only the process itself is counted."""
    seen, waiting = set(), [pid]
    while waiting and len(seen) < most:
        current = waiting.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as children:
                    waiting += [int(child) for child in children.read().split()]
            except (OSError, ValueError):
                pass
    resident = sum(resident_bytes(current) for current in seen)
    if len(seen) == 1 or resident <= exact_above:
        return resident
    return sum(proportional_bytes(current) for current in seen)


def _memory_total() -> int:
    """This machine's RAM, as the CPU device's capacity reads it (devices.py: MemTotal, else sysconf). Where there
    is no /proc (macOS) the worker's RSS reads 0 (resident_bytes), so the bound never applies there."""
    from trainmem.devices import cpu_device

    return cpu_device().capacity_bytes


def _kill_group(process: subprocess.Popen) -> None:
    """The worker and everything in its session (threads, forks, the processes it started)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def serve(run: Callable[[dict[str, Any]], tuple[str, Any]]) -> None:
    """The worker's side: read the job from stdin, `run(job)` -> ("outcome", answer) or ("failed", (line, code)),
    send it on the answer pipe, end at once (os._exit: no atexit handler, no thread join). The user's code's stdout
    goes to stderr. A copy of the worker that the model's code forked never answers: only the process that read
    the job does."""
    answer_fd = int(os.environ.pop(RESULT_FD_ENV))
    me = os.getpid()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    answer = run(pickle.load(sys.stdin.buffer))
    if os.getpid() == me:
        _send_answer(answer_fd, answer)
    os._exit(0)


def _send_answer(fd: int, answer: tuple[str, Any]) -> None:
    try:
        data = pickle.dumps(answer)
    except Exception as error:  # noqa: BLE001 - an answer that cannot travel is still one line
        data = pickle.dumps(("failed", (f"trainmem: error: the worker's answer could not be sent back "
                                        f"({type(error).__name__}: {error})", 2)))
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        view = view[os.write(fd, view):]


class _signals_kill:
    """While the worker runs: Ctrl-C (SIGINT) or SIGTERM to this process kills the worker's group, says so in one
    line and exits 130 or 143, within a poll of the answer pipe."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        _kill_group(self.process)
        os.write(2, b"trainmem: interrupted\n" if signum == signal.SIGINT else b"trainmem: terminated\n")
        os._exit(EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_TERMINATED)

    def __enter__(self) -> _signals_kill:
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self.previous[signum] = signal.signal(signum, self._handler)
            except ValueError:  # not the main thread: the default handlers stay
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
