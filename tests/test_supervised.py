"""The `trainmem` command runs the command of a model in a supervised worker (supervised.py, cli/worker.py):
whatever the user's code does besides returning a model — print from atexit, start a thread that never ends, fork,
ignore Ctrl-C, close stderr, end the process, raise a BaseException — the answer stays the answer, and every
failure is one line with exit 2 (issue 25, item 1). Each case runs the real command line in a process of its own,
as a user's shell does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FACTORIES = textwrap.dedent('''
    import atexit, os, signal, sys, threading, time
    import torch.nn as nn

    def small():
        return nn.Sequential(nn.Linear(10, 4))

    def prints_at_exit():
        atexit.register(lambda: print("goodbye from atexit"))
        return small()

    def raises_generator_exit():
        raise GeneratorExit("stop")

    class Custom(BaseException):
        pass

    def raises_base_exception():
        raise Custom("not an Exception")

    def closes_stderr():
        try:
            os.close(2)
        except OSError:  # trainmem calls a factory more than once: closed by the first call
            pass
        return small()

    def hard_exit():
        os._exit(0)

    def never_ending_thread():
        threading.Thread(target=lambda: time.sleep(3600)).start()  # not a daemon: it would block the exit
        return small()

    def ignores_sigint_and_loops():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(os.environ["MARKER"], "w") as marker:
            marker.write(str(os.getpid()))
        while True:
            time.sleep(0.05)

    def forks():
        os.fork()  # both copies go on building and tracing the model
        return small()

    def chdir_and_prints():
        os.chdir("/")
        print("the factory speaks")
        return small()
''')


def _cli(tmp_path: Path, factory: str, *flags: str, **popen) -> subprocess.Popen:
    (tmp_path / "factories.py").write_text(FACTORIES)
    environment = {**os.environ, "MARKER": str(tmp_path / "marker"), "PYTHONPATH": str(ROOT / "src")}
    environment.pop("TRAINMEM_IN_PROCESS", None)
    return subprocess.Popen([sys.executable, "-m", "trainmem", "estimate", f"factories.py:{factory}",
                             "--input-shape", "10", "--batch-size", "2", *flags], cwd=tmp_path, env=environment,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, **popen)


def _run(tmp_path: Path, factory: str, *flags: str, timeout: float = 120) -> tuple[int, str, str, float]:
    started = time.monotonic()
    process = _cli(tmp_path, factory, *flags)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        _kill(process)
    return process.returncode, out.decode(), err.decode(), time.monotonic() - started


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _one_error_line(err: str, *names: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainmem: error:"), err
    assert "Traceback" not in err and all(name in lines[0] for name in names), err


def test_an_atexit_print_cannot_break_the_json(tmp_path):
    code, out, err, _ = _run(tmp_path, "prints_at_exit", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["model"]["parameters"] == 44 and "goodbye" not in out + err


@pytest.mark.parametrize("factory, named", [("raises_generator_exit", "GeneratorExit"),
                                            ("raises_base_exception", "Custom")])
def test_a_base_exception_is_one_line_and_exit_2(tmp_path, factory, named):
    code, out, err, _ = _run(tmp_path, factory)
    assert code == 2 and out == ""
    _one_error_line(err, named, "factories.py")


def test_closing_stderr_cannot_hide_the_answer(tmp_path):
    code, out, err, _ = _run(tmp_path, "closes_stderr", "--quiet")
    assert code == 0 and out.startswith("peak "), (out, err)


def test_os_exit_in_the_model_code_is_one_line_and_exit_2(tmp_path):
    code, out, err, _ = _run(tmp_path, "hard_exit")
    assert code == 2 and out == ""
    _one_error_line(err, "exited with status 0", "os._exit")


def test_a_thread_that_never_ends_does_not_hold_the_answer(tmp_path):
    code, out, err, seconds = _run(tmp_path, "never_ending_thread", "--quiet", timeout=60)
    assert code == 0 and out.startswith("peak ") and seconds < 60, err


def test_a_fork_in_the_model_code_gives_one_answer(tmp_path):
    code, out, err, _ = _run(tmp_path, "forks", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["model"]["parameters"] == 44  # one document: a second would not parse


def test_the_user_code_prints_to_stderr_and_chdir_moves_no_file(tmp_path):
    code, out, err, _ = _run(tmp_path, "chdir_and_prints", "--quiet", "--html", "report.html")
    assert code == 0 and out.startswith("peak ") and "the factory speaks" in err
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_a_factory_that_ignores_it_within_a_second(tmp_path, signum, code):
    process = _cli(tmp_path, "ignores_sigint_and_loops")
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "marker").exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "marker").exists(), process.stderr.read().decode() if process.poll() is not None else ""
        process.send_signal(signum)  # to trainmem (the parent) only, as a shell's kill does
        sent = time.monotonic()
        out, err = process.communicate(timeout=10)
        assert time.monotonic() - sent < 1.5
    finally:
        _kill(process)
    assert process.returncode == code and out == b""
    assert err.decode().strip().splitlines()[-1] in ("trainmem: interrupted", "trainmem: terminated")
    # nothing of the worker is left running: the process that ran the factory is gone
    worker = int((tmp_path / "marker").read_text())
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie has ended; its parent reaps it
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def test_a_worker_past_its_timeout_is_one_line_and_exit_2(tmp_path):
    code, out, err, seconds = _run(tmp_path, "ignores_sigint_and_loops", "--timeout", "3", timeout=60)
    assert code == 2 and out == "" and seconds < 30
    _one_error_line(err, "--timeout")


def test_the_python_api_and_main_with_argv_stay_in_process(monkeypatch):
    """tests and notebooks call main(argv): no worker, so their monkeypatches and captures still apply."""
    from trainmem.cli import main
    from trainmem import supervised

    def refuse(*args, **kwargs):
        raise AssertionError("main(argv) must not start a worker")

    monkeypatch.setattr(supervised, "run_in_worker", refuse)
    assert main(["estimate", "mlp:10-4", "--batch-size", "2", "--quiet"]) == 0


def test_the_python_api_can_isolate_the_model_code(tmp_path, monkeypatch):
    """estimate(..., isolate=True): the same Estimate as in one process, and what the model's code does to its
    process (here os._exit) is an error in the caller, not the end of the caller's process."""
    import trainmem

    (tmp_path / "factories.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    here = trainmem.estimate("factories.py:small", input_shape="10", batch_size=2)
    isolated = trainmem.estimate("factories.py:forks", input_shape="10", batch_size=2, isolate=True)
    assert isolated.to_dict()["breakdown"] == here.to_dict()["breakdown"] and isolated.parameters == 44
    assert isolated.replay_input is not None  # the drawings work on what came back
    with pytest.raises(trainmem.TrainmemError, match="exited with status 0"):
        trainmem.estimate("factories.py:hard_exit", input_shape="10", isolate=True)
    with pytest.raises(trainmem.TrainmemError, match="a model reference"):
        trainmem.estimate(object(), isolate=True)


RANKS_FACTORY = '''
import os
import time

import torch
import torch.nn as nn


class StallsInRanks(nn.Module):
    """Trains normally where trainmem estimates it; in a gloo rank of `measure --strategy` it says so and stalls."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 4)

    def forward(self, x):
        if "RANK" in os.environ:
            with open(os.environ["MARKER"] + "-" + os.environ["RANK"], "w") as marker:
                marker.write(str(os.getpid()))
            while True:
                time.sleep(0.1)
        return self.fc(x)


def stalls_in_ranks():
    return StallsInRanks(), lambda n: (torch.randn(n, 10),)
'''


@pytest.mark.slow
def test_a_signal_to_measure_ends_its_gloo_ranks_too(tmp_path):
    """SIGTERM to `trainmem measure --strategy … --world-size 2` ends trainmem (143) and both ranks with it: the
    ranks are in the worker's process group, which the parent kills (measure/gloo_ranks.py)."""
    (tmp_path / "ranks.py").write_text(RANKS_FACTORY)
    environment = {**os.environ, "MARKER": str(tmp_path / "marker"), "PYTHONPATH": str(ROOT / "src")}
    environment.pop("TRAINMEM_IN_PROCESS", None)
    process = subprocess.Popen([sys.executable, "-m", "trainmem", "measure", "ranks.py:stalls_in_ranks", "--batch-size",
                                "2", "--strategy", "ddp", "--world-size", "2"], cwd=tmp_path, env=environment,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    markers = [tmp_path / f"marker-{rank}" for rank in range(2)]
    try:
        deadline = time.monotonic() + 180
        while not all(m.exists() and m.read_text() for m in markers) and process.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(m.exists() for m in markers), process.stderr.read().decode() if process.poll() is not None else ""
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        process.communicate(timeout=10)
        assert time.monotonic() - sent < 1.5 and process.returncode == 143
    finally:
        _kill(process)
    ranks = [int(m.read_text()) for m in markers]
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in ranks), "a gloo rank outlived trainmem measure"


def test_the_memory_bound_counts_the_processes_the_worker_started():
    """plan forks workers (plan/workers.py) and a model's code may fork too: the worker's bound is on the sum of its
    process tree's resident sets (supervised.tree_resident_bytes), not on the worker alone."""
    from trainmem.supervised import resident_bytes, tree_resident_bytes

    code = ("import os, time\nif os.fork() == 0:\n    held = b'x' * (200 << 20)\n    time.sleep(60)\n    os._exit(0)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and tree_resident_bytes(parent.pid) < resident_bytes(parent.pid) + (150 << 20):
            time.sleep(0.1)
        assert tree_resident_bytes(parent.pid) >= resident_bytes(parent.pid) + (150 << 20)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    assert tree_resident_bytes(parent.pid) == 0  # gone: nothing to count


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"), reason="needs /proc/PID/smaps_rollup")
def test_pages_a_fork_shares_with_its_parent_count_once():
    """The heap replay forks a child that reads the parent's actions (alloc/side_process.py): the tree's memory
    is not twice the parent's. 300 MiB written before the fork and only read after it are shared."""
    from trainmem.supervised import resident_bytes, tree_resident_bytes

    code = ("import os, time\nheld = bytearray(300 << 20)\nfor i in range(0, len(held), 4096): held[i] = 1\n"
            "if os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not _has_child(parent.pid):
            time.sleep(0.1)
        time.sleep(0.3)
        alone = resident_bytes(parent.pid)
        assert alone >= 300 << 20
        assert 300 << 20 <= tree_resident_bytes(parent.pid) < alone + (100 << 20)  # RSS summed: twice alone
        # below a bound the cheap sum of resident sets answers, and it is never below the proportional one
        assert tree_resident_bytes(parent.pid, exact_above=64 << 30) >= 2 * (300 << 20)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def _has_child(pid: int) -> bool:
    try:
        return any(open(f"/proc/{pid}/task/{task}/children").read().split() for task in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return False
