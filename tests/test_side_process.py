"""A replay run in a forked child beside the parent's (alloc/side_process.py): the same answer either way."""

import os
import signal
import sys

import pytest

from trainmem.alloc import side_process
from trainmem.alloc.replay import glibc_heap
from trainmem.alloc.device_events import DeviceEvent
from trainmem.trace.events import Category, Phase

forks = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is used on Linux only")


def _whose(parent: int) -> tuple[str, int]:
    return ("child" if os.getpid() != parent else "parent"), 7 * 6


def _killed_in_a_child(parent: int) -> int:
    if os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
    return 42


@forks
def test_the_function_runs_in_a_child_and_its_result_comes_back(monkeypatch):
    monkeypatch.setattr(side_process, "_cpus", lambda: 2)
    assert side_process.beside(_whose, os.getpid()).result() == ("child", 42)


def test_with_one_cpu_it_runs_here(monkeypatch):
    monkeypatch.setattr(side_process, "_cpus", lambda: 1)
    handle = side_process.beside(_whose, os.getpid())
    assert handle.pid is None and handle.result() == ("parent", 42)


@forks
def test_a_child_killed_before_it_answers_costs_time_not_the_figure(monkeypatch):
    monkeypatch.setattr(side_process, "_cpus", lambda: 2)
    handle = side_process.beside(_killed_in_a_child, os.getpid())
    pid = handle.pid
    assert pid is not None
    assert handle.result() == 42
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # the child was reaped: no zombie left behind


def _stream() -> list[DeviceEvent]:
    """Three steps of a small model's tensors with the threshold raised: heap chunks freed, reused, pinned."""
    events, key = [], 0
    for step in range(3):
        for phase, sizes in ((Phase.FORWARD, (300_000, 2_000_000, 700_000)), (Phase.BACKWARD, (1_500_000, 90_000))):
            born = []
            for nbytes in sizes:
                key += 1
                born.append((key, nbytes))
                events.append(DeviceEvent("alloc", nbytes, key, Category.ACTIVATIONS, phase, "m", "mm", step, 0))
            for old, nbytes in born[:-1]:
                events.append(DeviceEvent("free", nbytes, old, Category.ACTIVATIONS, phase, "m", "mm", step, 0))
    return events


@forks
def test_the_heap_is_the_same_with_the_pinned_replay_forked_or_here(monkeypatch):
    monkeypatch.setattr(side_process, "_cpus", lambda: 2)
    forked = glibc_heap(_stream(), [1, 2])
    monkeypatch.setattr(side_process, "_cpus", lambda: 1)
    here = glibc_heap(_stream(), [1, 2])
    assert forked == here and forked.pinned >= forked.resident > 0


def _forever() -> None:
    signal.pause()


@forks
def test_leaving_without_the_result_kills_the_child(monkeypatch):
    monkeypatch.setattr(side_process, "_cpus", lambda: 2)
    with pytest.raises(KeyboardInterrupt):
        with side_process.beside(_forever) as running:
            pid = running.pid
            raise KeyboardInterrupt
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped


@forks
def test_interrupted_while_waiting_kills_the_child_at_once(monkeypatch):
    monkeypatch.setattr(side_process, "_cpus", lambda: 2)
    running = side_process.beside(_forever)
    pid = running.pid
    monkeypatch.setattr(side_process.os, "read", lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        running.result()  # returns at once: the child, which would wait for ever, is killed
    monkeypatch.undo()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
