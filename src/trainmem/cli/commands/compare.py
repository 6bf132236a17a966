"""`trainmem compare`: one model in PyTorch and in Keras, or configurations side by side (compare_sweep.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from trainmem.cli.options import Options
from trainmem.cli.outcome import EXIT_OK, Outcome


def add(commands: Any, add_command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    from trainmem.cli.compare_sweep import COMPARE_DESCRIPTION, COMPARE_HELP, add_compare_flags

    compare = add_command("compare", COMPARE_HELP)
    compare.description = COMPARE_DESCRIPTION
    add_compare_flags(compare)


def run(options: Options, setup: Any) -> Outcome:
    """Configurations (a second MODEL or --sweep: compare_sweep.py), else one model in PyTorch and in Keras."""
    from trainmem.compare import compare
    from trainmem.cli.compare_sweep import compares_configurations, refuse_configuration_flags, run_compare

    if compares_configurations(options):
        return run_compare(options)
    refuse_configuration_flags(options)
    result = compare(options.model, setup, options.device, tf_memory=options.tf_memory)
    return Outcome(json.dumps(result.to_dict(), indent=2) if options.format == "json" else str(result), EXIT_OK)
