"""`estimate(..., isolate=True)`: the Python API's estimate with the model's code in a supervised worker process,
the one the `trainmem` command uses (cli/supervisor.py, cli/worker.py). For a notebook whose user wants what the
model's code does to its process (atexit handlers, threads, forks, os._exit, a hang: see --timeout) kept out of
the kernel. The model goes by its reference: a model object lives in this process and is refused."""

from __future__ import annotations

from typing import Any

from trainmem.errors import SetupError

PREFIX = "trainmem: error: "


def estimate_isolated(model: Any, keywords: dict[str, Any], timeout: float | None = None) -> Any:
    from trainmem.cli.supervisor import DEFAULT_TIMEOUT_SECONDS, WorkerFailed, run_in_worker

    if not isinstance(model, str):
        raise SetupError(f"expected a model reference (a string such as 'file.py:factory') with isolate=True, got "
                         f"{type(model).__name__} (an object lives in this process; estimate it without isolate)",
                         where="estimate()")
    try:
        return run_in_worker({"call": "estimate", "model": model, "keywords": keywords, "debug": False},
                             timeout or DEFAULT_TIMEOUT_SECONDS)
    except WorkerFailed as failed:  # the worker's one line, as the Python API raises it
        raise SetupError(failed.line.removeprefix(PREFIX)) from None
