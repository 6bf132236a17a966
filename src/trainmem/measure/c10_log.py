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
LOOKAHEAD = 32  # profiler events searched ahead when pairing c10's lines with them (threads interleave)
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
    """(kind, bytes, reported total) in the order written: kind "alloc", "free" or "mark:<name>" (a mark's
    bytes and total are 0 and -1). The log's time stamps are not used: their fraction of a second does not
    follow the wall clock (measured 0.64 s off the profiler's)."""
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


def peaks(stream: list[tuple[str, int, int]]) -> dict[str, int | str]:
    """The tensor peak (running sum of 64-byte-rounded blocks, as measure/child.py counts) of `stream` in its
    order, the peak of the reporter's own unrounded total, and the rounded peaks before and within the loop
    (marks loop_start / loop_end). Lines written by different threads may land out of the reporter's order;
    `order_gaps` counts lines whose total does not follow from the line before (0 when in order)."""
    current = peak = total_peak = gaps = frees = allocs = 0
    previous_total = 0
    section = "init"
    section_peaks = {"init": 0, "loop": 0, "after": 0}
    peak_in = "init"
    for kind, nbytes, total in stream:
        if kind.startswith("mark:"):
            section = {"mark:loop_start": "loop", "mark:loop_end": "after"}.get(kind, section)
            continue
        signed = nbytes if kind == "alloc" else -nbytes
        allocs += kind == "alloc"
        frees += kind == "free"
        if total >= 0:
            gaps += total - signed != previous_total
            previous_total = total
            total_peak = max(total_peak, total)
        current += _rounded(nbytes) if kind == "alloc" else -_rounded(nbytes)
        section_peaks[section] = max(section_peaks[section], current)
        if current > peak:
            peak, peak_in = current, section
    return {"tensor_peak_bytes": peak, "c10_total_peak_bytes": total_peak, "init_peak_bytes": section_peaks["init"],
            "loop_peak_bytes": section_peaks["loop"], "peak_in": peak_in, "order_gaps": gaps,
            "c10_allocs": allocs, "c10_frees": frees}


def settled(stream: list[tuple[str, int, int]], profiled: list[tuple[int, int, int]],
            main: int | None) -> tuple[list[tuple[str, int, int]], int]:
    """The stream with each free that a gloo worker made after its work had finished moved back to where
    that work finished, and how many frees the profiler lacked (moved or, where a mark came between, kept).

    Such a free is one the profiler did not record (it happens on a thread without the profiler's state;
    every other line of the stream has a profiler event): c10's lines are paired in order with the
    profiler's (epoch ns, signed bytes, thread) events, looking a few events ahead where threads interleave.
    An unpaired free is moved to just after the last line made on a worker thread (not `main`) before it: a
    reduce-scatter's work on gloo ends there, with ReduceOp.AVG's division, and an idle machine's worker
    drops the finished work then. A moved line's reported total is -1.

    A free is never moved back across a mark: a worker that drops the last reference to a block after the
    loop has ended (DDP's last gradient bucket, held by the work of its all-reduce when the reducer is torn
    down) freed it after the loop, and moving it into the loop would take a block out of the loop's peak
    that was live there (measured: DDP over 4 ranks, one rank's peak 526,336 B low on some runs). Such a
    free stays where it is; it still counts as unpaired, so the count is every free the profiler lacks."""
    threads = _pair(stream, profiled)
    out: list[tuple[str, int, int]] = []
    last_worker = -1  # position in `out` of the last line made on a worker thread since the last mark
    unpaired = 0
    for (kind, nbytes, total), thread in zip(stream, threads):
        if kind == "free" and thread is None:
            unpaired += 1
            if last_worker >= 0:
                out.insert(last_worker + 1, (kind, nbytes, -1))
                last_worker += 1
                continue
        out.append((kind, nbytes, total))
        if kind.startswith("mark:"):
            last_worker = -1
        elif thread is not None and thread != main:
            last_worker = len(out) - 1
    return out, unpaired


def _pair(stream: list[tuple[str, int, int]], profiled: list[tuple[int, int, int]]) -> list[int | None]:
    """The profiler's thread of each line of `stream` (None: a mark, or a line the profiler did not record)."""
    used = [False] * len(profiled)
    start = 0
    threads: list[int | None] = []
    for kind, nbytes, _ in stream:
        signed = nbytes if kind == "alloc" else -nbytes
        found = None
        if not kind.startswith("mark:"):
            for index in range(start, min(start + LOOKAHEAD, len(profiled))):
                if not used[index] and profiled[index][1] == signed:
                    found = index
                    break
        if found is None:
            threads.append(None)
            continue
        used[found] = True
        threads.append(profiled[found][2])
        while start < len(used) and used[start]:
            start += 1
    return threads
