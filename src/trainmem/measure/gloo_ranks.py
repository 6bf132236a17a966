"""`trainmem measure --strategy … --world-size N`: the same setup run for real with torch.distributed over
gloo, one process per rank on this machine, each rank's measured figures beside the estimate's.

Each rank is a fresh `python -P measure/dist_child.py` (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT
a free port), which wraps the model with torch's own DDP / fully_shard / ZeroRedundancyOptimizer, written
independently of trainmem.parallel. One run under the profiler gives each rank's tensor peak (gloo's
worker-thread buffers included); `runs` runs without it give peak RSS (median). A run is bounded by
`timeout`; when one rank fails or time runs out, every rank is killed and the failure is one line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainmem.errors import MeasureError, ModelRefError
from trainmem.measure.single_process import rss_run_steps
from trainmem.setup import TrainingSetup
from trainmem.units import format_bytes

CHILD = Path(__file__).resolve().parent / "dist_child.py"
SRC = Path(__file__).resolve().parents[2]
POLL_SECONDS = 0.05
DETAIL_KEYS = ("raw_peak_bytes", "late_frees", "pairing_exact", "c10_total_peak_bytes", "init_peak_bytes", "loop_peak_bytes", "peak_in", "profiler_peak_bytes",
               "other_thread_bytes", "order_gaps")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
           "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    if "GLOO_SOCKET_IFNAME" not in env and Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # the ranks talk over loopback, whatever the hostname resolves to
    return env


def _kill(processes: list[subprocess.Popen]) -> None:
    """SIGKILL each rank still running. The ranks stay in this process's process group (no session of their own):
    when `trainmem measure` is interrupted, its parent kills the worker's whole group (supervised.py), and that
    reaches the ranks too; in a session of their own they ran on, orphaned, until their own timeout."""
    for process in processes:
        if process.poll() is None:
            try:
                process.kill()
            except ProcessLookupError:
                pass
    for process in processes:
        process.wait()


def launch(request: dict[str, Any], world_size: int, timeout: float, where: str) -> list[dict[str, Any]]:
    """Run `world_size` ranks of dist_child.py on `request`; each rank's JSON result, in rank order."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="trainmem-dist-") as folder:
        outputs = [(Path(folder, f"{rank}.out"), Path(folder, f"{rank}.err")) for rank in range(world_size)]
        processes = []
        try:
            for rank, (out, err) in enumerate(outputs):
                with open(out, "w") as stdout, open(err, "w") as stderr:
                    processes.append(subprocess.Popen(
                        [sys.executable, "-P", str(CHILD), json.dumps({**request, "timeout": timeout, "log_dir": folder})],
                        stdout=stdout, stderr=stderr, env=_rank_env(rank, world_size, port)))
            failed = _wait(processes, outputs, time.monotonic() + timeout)
        finally:
            _kill(processes)
        results = [_result(rank, out, err, processes[rank].returncode) for rank, (out, err) in enumerate(outputs)]
    if failed == "timeout":
        raise MeasureError(f"expected the {world_size} ranks to finish within {timeout:g} s, they did not "
                           f"(all killed)", where=where)
    # the rank that failed first, not one of those killed after it
    errors = [f"rank {r['rank']}: {r['error']}" for r in sorted(results, key=lambda r: r.get("error") == "killed")
              if "error" in r]
    if errors:
        raise MeasureError(f"the distributed run failed: {errors[0]}", where=where)
    return results


def _wait(processes, outputs, deadline: float) -> str | None:
    """Until every rank exits, one fails (exits non-zero or prints an error), or the deadline passes."""
    while time.monotonic() < deadline:
        codes = [process.poll() for process in processes]
        if any(code not in (None, 0) for code in codes):
            return "failed"
        for code, (out, _) in zip(codes, outputs):
            if code == 0 and '"error"' in out.read_text():
                return "failed"  # the others would wait for it in a collective until their timeout
        if all(code == 0 for code in codes):
            return None
        time.sleep(POLL_SECONDS)
    return "timeout"


def _result(rank: int, out: Path, err: Path, code: int | None) -> dict[str, Any]:
    lines = [line for line in out.read_text().splitlines() if line.startswith("{")]
    if lines:
        result = json.loads(lines[-1])
        result.setdefault("rank", rank)
        return result
    tail = (err.read_text().strip().splitlines() or ["no output"])[-1]
    return {"rank": rank, "error": f"died (exit {code}): {tail}" if code not in (None, -9) else "killed"}


def _relative(estimated: int | None, measured: int | None) -> float | None:
    if estimated is None or not measured:
        return None
    return (estimated - measured) / measured


@dataclasses.dataclass
class RankFigures:
    rank: int
    tensor_bytes: int  # measured tensor peak (profiler, all threads)
    process_bytes: int | None  # median peak RSS over the rss runs (None: none run)
    estimated_tensor_bytes: int | None = None
    estimated_process_bytes: int | None = None
    estimated_process_high: int | None = None  # the estimate's high end (process_bytes_high)
    process_runs: tuple[int, ...] = ()  # every rss run's peak RSS of this rank
    role: str = ""  # the estimate's role label for this rank

    @property
    def tensor_error(self) -> float | None:
        return _relative(self.estimated_tensor_bytes, self.tensor_bytes)

    @property
    def process_error(self) -> float | None:
        return _relative(self.estimated_process_bytes, self.process_bytes)


@dataclasses.dataclass
class DistributedComparison:
    model_ref: str
    setup: TrainingSetup
    layout: dict[str, Any]
    ranks: list[RankFigures]
    tensors: list[dict[str, Any]]  # each rank's profiled run, as the child reported it
    rss_runs: list[list[dict[str, Any]]]  # per run, each rank's rss result
    estimate: Any = None

    def to_dict(self) -> dict[str, Any]:
        first = self.tensors[0]
        return {
            "model": self.model_ref, "setup": self.setup.to_dict(), "layout": self.layout,
            "measured_on": {"torch": first["torch"], "cpu_capability": first["cpu_capability"],
                            "threads_per_rank": first["threads"], "backend": "gloo"},
            "ranks": [{"rank": r.rank, "role": r.role,
                       "measured": {"tensor_bytes": r.tensor_bytes, "process_bytes": r.process_bytes},
                       "estimated": {"tensor_bytes": r.estimated_tensor_bytes, "process_bytes": r.estimated_process_bytes,
                                     "process_bytes_high": r.estimated_process_high},
                       "process_runs": list(r.process_runs),
                       "error": {"tensor_bytes": r.tensor_error, "process_bytes": r.process_error},
                       "detail": {k: t[k] for k in DETAIL_KEYS if k in t}}
                      for r, t in zip(self.ranks, self.tensors)],
            "estimate": self.estimate.to_dict() if self.estimate is not None else None,
        }

    def __str__(self) -> str:
        first = self.tensors[0]
        lines = [f"trainmem measure — {self.model_ref}, {self.layout['strategy']} × {len(self.ranks)} ranks over gloo, "
                 f"batch {self.setup.batch_size} per rank, {self.setup.optimizer}, loop {self.setup.loop} "
                 f"(torch {first['torch']}, {first['cpu_capability']}, {first['threads']} threads per rank)", ""]
        header = ("rank", "tensors measured", "estimated", "error", "peak RSS measured", "estimated", "error",
                  "high end")
        rows = [header] + [(str(r.rank), format_bytes(r.tensor_bytes), _bytes(r.estimated_tensor_bytes),
                            _percent(r.tensor_error), _bytes(r.process_bytes), _bytes(r.estimated_process_bytes),
                            _percent(r.process_error), _bytes(r.estimated_process_high)) for r in self.ranks]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for row in rows:
            lines.append("  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths)))
        if self.rss_runs:
            steps = self.rss_runs[0][0].get("steps")
            lines.append(f"  peak RSS: median of {len(self.rss_runs)} run(s) per rank"
                         + (f", each {steps} steps (the run the estimate stands for)" if steps else ""))
        return "\n".join(lines)


def _bytes(value: int | None) -> str:
    return "—" if value is None else format_bytes(value)


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2%}"


def _layout_of(setup: TrainingSetup) -> dict[str, Any]:
    layout = getattr(setup, "parallel", None)
    if layout is None or not layout.distributed:
        raise MeasureError("expected a distributed setup (--strategy ddp|fsdp|hsdp|zero1|zero2 --world-size N), got one "
                           "process", where="--strategy")
    values = layout.to_dict()
    values["hsdp_shard"] = layout.hsdp_shard  # the shard degree the layout resolves (--dp-shard or a node's ranks)
    return values


def _check_supported(layout: dict[str, Any]) -> None:
    from trainmem.measure.dist_child import SUPPORTED

    if layout["strategy"] not in SUPPORTED:
        raise MeasureError(f"expected a strategy the real gloo run supports ({', '.join(SUPPORTED)}), got "
                           f"{layout['strategy']}", where="--strategy")
    if layout["tp"] != 1 or layout["pp"] != 1 or layout["dp"] != layout["world_size"]:
        raise MeasureError(f"expected data parallelism only (dp = world size), got dp {layout['dp']} × tp "
                           f"{layout['tp']} × pp {layout['pp']}", where="--world-size")
    if layout["offload"] != "none":
        raise MeasureError(f"expected no offload in the real gloo run, got --offload {layout['offload']}",
                           where="--offload")


def _threads_per_rank(world_size: int) -> int:
    """Intra-op threads per rank: the machine's cores shared out, at least one, so that N ranks do not
    oversubscribe the CPU (the estimate must be made for the same count where kernels depend on it)."""
    return max(1, (os.cpu_count() or 1) // world_size)


def measure_distributed(model_ref: str, setup: TrainingSetup, *, runs: int | None = 1, timeout: float = 600,
                        estimate: bool = True, threads: int | None = None) -> DistributedComparison:
    """Run `setup` for real over gloo, one process per rank of setup.parallel, and compare each rank with
    the estimate (trainmem.estimate with the same setup) when `estimate`. `runs` RSS runs besides the
    profiled one (0: tensors only); `timeout` bounds each launch of all ranks."""
    if not isinstance(model_ref, str):
        raise ModelRefError("expected a model reference string (each rank rebuilds the model in a fresh "
                            "process)", where="measure")
    runs = 1 if runs is None else runs
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 0:
        raise MeasureError(f"expected --runs of at least 0, got {runs!r}", where="--runs")
    layout = _layout_of(setup)
    _check_supported(layout)
    world_size = layout["world_size"]
    single = {k: v for k, v in setup.to_dict().items() if k != "parallel"}
    request = {"model": model_ref, "setup": single, "layout": layout, "seed": 0,
               "threads": threads or _threads_per_rank(world_size)}
    where = f"{model_ref} ({layout['strategy']} × {world_size})"
    est = None
    if estimate:
        from trainmem.estimate import estimate as estimate_setup

        est = estimate_setup(model_ref, setup=setup)
    tensors = launch({**request, "mode": "tensors"}, world_size, timeout, where)
    rss_request = {**request, "mode": "rss", "setup": {**single, "steps": rss_run_steps(setup, est)}}
    rss_runs = [launch(rss_request, world_size, timeout, where) for _ in range(runs)]
    ranks = [_rank_figures(rank, tensors, rss_runs, est) for rank in range(world_size)]
    return DistributedComparison(model_ref, setup, layout, ranks, tensors, rss_runs, est)


def _rank_figures(rank: int, tensors, rss_runs, est) -> RankFigures:
    runs = tuple(int(run[rank]["peak_rss_bytes"]) for run in rss_runs)
    process = int(statistics.median(runs)) if runs else None
    figures = RankFigures(rank, int(tensors[rank]["tensor_peak_bytes"]), process, process_runs=runs)
    for role in getattr(est, "ranks", None) or ():
        if rank in role.ranks:
            figures.role = role.label
            figures.estimated_tensor_bytes = int(role.peak["tensor_bytes"])
            figures.estimated_process_bytes = role.peak.get("process_bytes")
            figures.estimated_process_high = role.peak.get("process_bytes_high")
    return figures
