"""The tensor peak from c10's own record of CPU allocations, on every thread.

PyTorch's default CPU allocator reports each allocation and free to `ProfiledCPUMemoryReporter`
(c10/core/CPUAllocator.cpp). With the c10 flag `caffe2_report_cpu_memory_usage` set, the reporter keeps
the size of every live block and its running total under one mutex, and logs each event at INFO level:
"C10 alloc N bytes, total alloc T bytes." / "C10 deleted N bytes, total alloc T bytes.". Unlike the
profiler's memory events, this does not depend on the profiler's thread-local state: a block allocated
under the profiler and freed on a thread that does not carry it (a gloo worker dropping its finished work,
which holds the reduce-scatter's input copy) is reported as freed, where the profiler never records the
free and keeps counting the block (measured: FSDP2 over gloo, 1 MiB counted live too long on some runs).

The flags are plain globals of libc10 (`FLAGS_caffe2_report_cpu_memory_usage`, `FLAGS_caffe2_log_level`,
exported symbols of libc10.so), set with ctypes. INFO lines go to stderr, which is pointed at a file while
the run is logged. Markers written between them (`mark`) place the loop in the stream.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

_EVENT = re.compile(r"C10 (alloc|deleted) (\d+) bytes, total alloc (\d+) bytes")
_MARK = "TRAINMEM_MARK "
ROUND = 64  # PyTorch's CPU allocator rounds each request to 64 bytes (c10/core/impl/alloc_cpu.cpp), as measure/child.py


def _flags():
    import torch

    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    return (ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage"),
            ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level"))


class _Log:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def mark(self, name: str) -> None:
        """A marker line in the stream, in order with this thread's allocation lines."""
        os.write(self.fd, f"{_MARK}{name}\n".encode())


@contextlib.contextmanager
def logging(path: str | Path) -> Iterator[_Log]:
    """Log every c10 CPU allocation and free to `path` while the block runs (stderr points there)."""
    report, level = _flags()
    saved_report, saved_level = report.value, level.value
    sys.stderr.flush()
    saved_stderr = os.dup(2)
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    report.value, level.value = True, 0
    try:
        yield _Log(2)
    finally:
        report.value, level.value = saved_report, saved_level
        sys.stderr.flush()
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        os.close(fd)


def _rounded(nbytes: int) -> int:
    return (nbytes + ROUND - 1) // ROUND * ROUND


def events(path: str | Path) -> list[tuple[str, int, int]]:
    """("alloc"|"free"|"mark", bytes, reported total) in the order written; a mark has its name's hash 0."""
    out: list[tuple[str, int, int]] = []
    with open(path, errors="replace") as handle:
        for line in handle:
            if line.startswith(_MARK):
                out.append(("mark:" + line[len(_MARK):].strip(), 0, -1))
                continue
            found = _EVENT.search(line)
            if found:
                kind = "alloc" if found.group(1) == "alloc" else "free"
                out.append((kind, int(found.group(2)), int(found.group(3))))
    return out


def peaks(path: str | Path) -> dict[str, int | str]:
    """The tensor peak (running sum of 64-byte-rounded blocks, as measure/child.py counts), the peak of the
    reporter's own unrounded total, and the rounded peaks before and within the loop (marks loop_start /
    loop_end). Lines written by different threads may land out of the reporter's order; the unrounded
    peak is the reporter's total and does not depend on it, and `order_gaps` counts lines whose total does
    not follow from the line before."""
    current = peak = total_peak = gaps = frees = allocs = 0
    previous_total = 0
    section = "init"
    section_peaks = {"init": 0, "loop": 0, "after": 0}
    peak_in = "init"
    for kind, nbytes, total in events(path):
        if kind.startswith("mark:"):
            section = {"mark:loop_start": "loop", "mark:loop_end": "after"}.get(kind, section)
            continue
        signed = nbytes if kind == "alloc" else -nbytes
        allocs += kind == "alloc"
        frees += kind == "free"
        gaps += total - signed != previous_total
        previous_total = total
        current += _rounded(nbytes) if kind == "alloc" else -_rounded(nbytes)
        total_peak = max(total_peak, total)
        section_peaks[section] = max(section_peaks[section], current)
        if current > peak:
            peak, peak_in = current, section
    return {"tensor_peak_bytes": peak, "c10_total_peak_bytes": total_peak, "init_peak_bytes": section_peaks["init"],
            "loop_peak_bytes": section_peaks["loop"], "peak_in": peak_in, "order_gaps": gaps,
            "c10_allocs": allocs, "c10_frees": frees}
