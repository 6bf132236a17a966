"""`estimate(..., isolate=True)`: the Python API's estimate with the model's code in a supervised worker process
(trainmem/supervised.py, the `trainmem` command's supervision; this module is also the worker's entry). For a
notebook whose user wants what the model's code does to its process (atexit handlers, threads, forks, os._exit, a
hang) kept out of the kernel. The model goes by its reference: a model object lives in this process and is refused.
"""

from __future__ import annotations

from typing import Any

from trainmem.errors import SetupError

PREFIX = "trainmem: error: "


def estimate_isolated(model: Any, keywords: dict[str, Any], timeout: float | None = None) -> Any:
    from trainmem.supervised import DEFAULT_TIMEOUT_SECONDS, WorkerFailed, run_in_worker

    if not isinstance(model, str):
        raise SetupError(f"expected a model reference (a string such as 'file.py:factory') with isolate=True, got "
                         f"{type(model).__name__} (an object lives in this process; estimate it without isolate)",
                         where="estimate()")
    try:
        return run_in_worker({"model": model, "keywords": keywords}, "trainmem.estimate.isolated",
                             timeout or DEFAULT_TIMEOUT_SECONDS, timeout_where="estimate(isolate=True)")
    except WorkerFailed as failed:  # the worker's one line, as the Python API raises it
        raise SetupError(failed.line.removeprefix(PREFIX)) from None


def _run(job: dict[str, Any]) -> tuple[str, Any]:
    """The worker's side: the estimate, or the one line of what went wrong."""
    from trainmem.errors import TrainmemError, one_line
    from trainmem.estimate.orchestrate import estimate

    try:
        return "outcome", estimate(job["model"], **job["keywords"])
    except TrainmemError as error:
        return "failed", (f"{PREFIX}{error}", 2)
    except BaseException as error:  # noqa: BLE001 - the model's code: one line for the caller
        return "failed", (f"{PREFIX}{job['model']}: {type(error).__name__}: {one_line(error)}", 2)


if __name__ == "__main__":
    from trainmem.supervised import serve

    serve(_run)
