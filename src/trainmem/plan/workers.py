"""Groups of layouts evaluated side by side in forked worker processes (`plan --jobs N`).

A group is one (data-parallel kind, dp, tp, pp, precision) of the planned GPU count (core.run). Within one plan
two groups share no trace but a ZeRO-3 group and the FSDP group of the same degrees (a ZeRO-3 layout making FSDP's
fully_shard calls is traced as its FSDP twin, tracer.py traced_as), which run as one job: a trace is keyed by
the layout's structure (kind, tp, pp, checkpointing, precision, offload) and a data-parallel degree (tracer.py),
and at a fixed GPU count tp and pp fix dp. So jobs are independent, and N processes evaluate N jobs at once; tracing is CPU-bound Python (FakeTensorMode's
dispatch), one core per process, so this is where more cores help.

The workers are forked from the planning process after the model is resolved and built on meta, so they start
with the tracer (tracer.py) and the model as they are, with no import and no pickling of a model or a factory;
each sends back its job's rows and how many traces it ran. Where fork is not how processes start (macOS and
Windows default to spawn, which would have to import and resolve the model again) the groups run here, one after
the other, as with --jobs 1. Each worker holds one job's traces at a time (tracer.forget after each job).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# Each worker's own peak: a 70B model's rank traces at seq 2048 held about 0.5 GiB of RSS (benchmarks/results/speed.md);
# one GiB each keeps the workers out of swap on the machine the plan runs on
WORKER_BYTES = 1 << 30
MOST_JOBS = 16

_GROUP_JOB: Callable[[Any], tuple[list, Any]] | None = None  # set before the fork, read in the workers


def default_jobs() -> int:
    """One worker per CPU this process may run on, as many as the available memory holds at WORKER_BYTES each,
    at most MOST_JOBS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    from trainmem.devices import available_bytes

    available = available_bytes() or MOST_JOBS * WORKER_BYTES  # no /proc/meminfo: the CPUs and MOST_JOBS decide
    return max(1, min(cpus, MOST_JOBS, available // WORKER_BYTES))


def can_fork() -> bool:
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def autograd_survives_fork() -> bool:
    """Whether a forked child of this process can run a backward. Once a CUDA build of torch has run one here (an
    estimate before the plan, in a notebook or a script), its autograd engine has started its device threads, and a
    forked child's backward raises "Unable to handle autograd's threading in combination with fork-based
    multiprocessing" (torch/csrc/autograd/engine.cpp, its pthread_atfork handler): every layout a worker traced
    failed (torch 2.15.0+cu132, benchmarks/results/compat.md). A child that runs one tiny backward says which."""
    with warnings.catch_warnings():
        # Python 3.12+ warns on any fork of a process with threads (torch's); the child runs one backward and exits
        warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            torch.ones(1, requires_grad=True).sum().backward()
            code = 0
        finally:
            os._exit(code)  # never returns: an exception in the backward ends here as exit status 1
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _one_thread() -> None:
    """A worker's torch runs on one thread: the workers are the parallelism, and an OpenMP thread team the planning
    process may have started does not survive a fork (GNU libgomp's pool hangs in a child that uses it)."""
    import torch

    torch.set_num_threads(1)


def _run_group(index: int, group: Any) -> tuple[int, list, Any]:
    rows, counts = _GROUP_JOB(group)
    return index, rows, counts


def each_group(job: Callable[[Any], tuple[list, Any]], groups: Sequence[Any], jobs: int,
               done: Callable[[int, Any, bool], None], first: Sequence[int] | None = None) -> Iterator[list]:
    """`job(group)` -> (rows, counts) for every group, the rows yielded in the groups' order; `done(index, counts,
    in_worker)` as each group finishes (in any order). With jobs > 1 (and fork) in that many workers, handed out in
    the order of the indices `first` (default: the groups' own), else in this process (also where a forked child
    could not run a backward: autograd_survives_fork). A worker that dies (the kernel's OOM killer) is a TraceError,
    never a wait for ever."""
    global _GROUP_JOB
    jobs = min(jobs, len(groups))
    if jobs <= 1 or not can_fork() or not autograd_survives_fork():
        for index, group in enumerate(groups):
            rows, counts = job(group)
            done(index, counts, False)
            yield rows
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    _GROUP_JOB = job  # set before the workers fork: they find it in their copy of this module
    finished: dict[int, list] = {}
    try:
        with ProcessPoolExecutor(jobs, multiprocessing.get_context("fork"), initializer=_one_thread) as pool:
            handed = range(len(groups)) if first is None else first
            for future in as_completed([pool.submit(_run_group, i, groups[i]) for i in handed]):
                index, rows, counts = future.result()
                finished[index] = rows
                done(index, counts, True)
    except BrokenProcessPool:
        from trainmem.errors import TraceError

        raise TraceError(f"expected plan's {jobs} worker processes to answer, one ended without an answer (killed: "
                         "out of memory?); --jobs 1 plans in one process") from None
    finally:
        _GROUP_JOB = None
    for index in range(len(groups)):
        yield finished[index]
