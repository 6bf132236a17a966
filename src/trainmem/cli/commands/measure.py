"""`trainmem measure MODEL`: the steps run for real in fresh processes (one a rank with --strategy, Keras's
`model.fit` for a Keras model, the GPU's three numbers on a GPU), beside the estimate."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from trainmem.cli.options import Options, gpu_options
from trainmem.cli.parser import run_default
from trainmem.cli.outcome import EXIT_OK, Outcome
from trainmem.errors import TrainmemError, quote


def add(commands: Any, add_command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    measure = add_command("measure", "run the steps for real and compare with the estimate")
    measure.add_argument("--force", action="store_true", default=None,
                         help="run even if the estimate says it will not fit (default: off)")
    measure.add_argument("--runs", type=int, metavar="N", help="fresh processes for RSS (median reported)" + run_default("runs"))


def run(options: Options, setup: Any) -> Outcome:
    from trainmem.measure.single_process import measure
    from trainmem.frontends.framework import is_keras_reference

    if setup.parallel.distributed:
        from trainmem.cli.parallel_flags import measure_distributed_outcome

        text = measure_distributed_outcome(options, setup)
        return Outcome(text, EXIT_OK)
    if options.keras_backend != "torch" and (is_keras_reference(options.model, options.framework)
                                             or keras_factory_file(options)):
        from trainmem.estimate.keras_measured import measure_keras_beside_estimate

        if options.device != "cpu":
            raise TrainmemError("expected --device cpu with a Keras model (the measured fit runs on this machine; "
                                f"a GPU it finds is reported beside), got {quote(options.device)}",
                                where=options.origins.get("device", "--device"))
        result = measure_keras_beside_estimate(options.model, setup, runs=options.runs, force=bool(options.force))
        return Outcome(json.dumps(result.to_dict(), indent=2) if options.format == "json" else str(result), EXIT_OK)

    if options.device != "cpu":  # one JSON line: measured on this machine's GPU, estimated for it
        from trainmem.measure.cuda import measure_on_gpu

        return Outcome(json.dumps(measure_on_gpu(options.model, setup, options.device, **gpu_options(options))),
                       EXIT_OK)
    comparison = measure(options.model, setup, force=bool(options.force), runs=options.runs, depth=options.depth,
                         framework=options.framework, keras_backend=options.keras_backend)
    return Outcome(json.dumps(comparison.to_dict(), indent=2) if options.format == "json" else str(comparison), EXIT_OK)


def keras_factory_file(options: Options) -> bool:
    """Under --framework auto, whether a file.py:factory to measure is Keras's, read from its text (its import
    lines: keras or tensorflow and not torch), not run: the measured child runs it, and a torch file would
    otherwise run here twice (frontends/keras/reference.py decides the same way from a loaded module's names)."""
    import re

    from trainmem.frontends import Kind, reference_kind

    if options.framework != "auto" or reference_kind(options.model) != Kind.PYTHON:
        return False
    path = options.model.strip().rpartition(":")[0]
    if not path.endswith(".py"):
        return False
    try:
        with open(path, "rb") as handle:
            text = handle.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return False  # the torch path's resolver says what is wrong with the file
    imported = set(re.findall(r"^\s*(?:import|from)\s+(keras|tensorflow|tf_keras|torch)\b", text, re.MULTILINE))
    return bool(imported - {"torch"}) and "torch" not in imported
