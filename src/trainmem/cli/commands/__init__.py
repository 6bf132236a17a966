"""One module a command. Each has `add(commands, add_command)`, which adds its subparser (`add_command(name,
text)` makes one with the setup and many-GPU flags and the MODEL references as its epilog), and `run`:
`run(options, setup) -> Outcome` for the commands of a model and a setup, `run(args) -> Outcome` for those
without (devices, calibrate)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from trainmem.cli.commands import cache, calibrate, compare, devices, estimate, fit, measure, plan

COMMAND_MODULES = (estimate, measure, fit, compare, plan, devices, calibrate, cache)  # the order --help lists them


def _libraries_quiet(run: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """`run` with TensorFlow's start-up lines and the Hugging Face libraries' warnings kept off stderr unless
    --debug (cli/quiet.py): wherever the command runs, in this process or in the supervised worker."""

    @functools.wraps(run)
    def quiet_run(options: Any, setup: Any) -> Any:
        from trainmem.cli.quiet import libraries_quiet

        with libraries_quiet(bool(options.values.get("debug"))):
            return run(options, setup)

    return quiet_run


SETUP_COMMANDS = {name: _libraries_quiet(run) for name, run in (
    ("estimate", estimate.run), ("measure", measure.run), ("fit", fit.run), ("compare", compare.run),
    ("plan", plan.run))}
ARGS_COMMANDS = {"devices": devices.run, "calibrate": calibrate.run, "cache": cache.run}
