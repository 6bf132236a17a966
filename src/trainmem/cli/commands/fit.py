"""`trainmem fit MODEL --device D`: the largest batch size (or sequence length) that fits."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from trainmem.cli.options import Options, target_options
from trainmem.cli.outcome import EXIT_DOES_NOT_FIT, EXIT_OK, Outcome
from trainmem.errors import TrainmemError, quote


def add(commands: Any, add_command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    fit = add_command("fit", "the largest batch size (or --max-seq: sequence length) that fits --device")
    fit.add_argument("--max-seq", action="store_true", default=None,
                     help="search the first input's first dimension (hf: --seq-len), batch fixed (default: off)")
    fit.add_argument("--margin", help="fraction of the capacity to keep free, 0 ≤ m < 1 (default: the measured "
                     "worst low error, each target's fit_margin in trainmem/targets/)")
    fit.add_argument("--verbose", action="store_true", default=None,
                     help="list every candidate evaluated, not only those that decided the answer (default: off; "
                     "--format json always lists every one)")


def run(options: Options, setup: Any) -> Outcome:
    from trainmem.fit import fit
    from trainmem.frontends.framework import is_keras_reference

    if is_keras_reference(options.model, options.framework):
        raise TrainmemError("expected a PyTorch model for fit (it searches PyTorch models; estimate a Keras model at "
                            f"the batch sizes you consider), got a Keras model {quote(options.model)}", where="MODEL")

    result = fit(options.model, setup, options.device, sequence=bool(options.max_seq), margin=options.margin,
                 target_options=target_options(options))
    verbose = bool(options.values.get("verbose"))
    text = json.dumps(result.to_dict(), indent=2) if options.format == "json" else result.render(verbose)
    return Outcome(text, EXIT_OK if result.best is not None else EXIT_DOES_NOT_FIT)
