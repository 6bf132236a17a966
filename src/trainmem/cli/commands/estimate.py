"""`trainmem estimate MODEL`: the estimate, its report on stdout and the files it writes (--plot, --html,
--memory-snapshot)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from trainmem.cli.options import Options, framework_options, target_options
from trainmem.cli.outcome import EXIT_DOES_NOT_FIT, EXIT_OK, Outcome
from trainmem.cli.parser import add_output_flags


def add(commands: Any, add_command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    parser = add_command("estimate", "estimate training memory")
    add_output_flags(parser)


def run(options: Options, setup: Any) -> Outcome:
    from trainmem.estimate import estimate

    result = estimate(options.model, setup=setup, device=options.device, depth=options.depth,
                      target_options=target_options(options), compare_loop=True, **framework_options(options))
    written = write_outputs(result, options)
    if options.quiet:
        from trainmem.report.text import render_quiet

        text = render_quiet(result)
    elif options.format == "json":
        text = json.dumps(result.to_dict(), indent=2)
    elif options.values.get("colour"):
        from trainmem.report.text import render_text

        text = render_text(result, colour=True)
    else:
        text = str(result)
    return Outcome(text, EXIT_OK if result.fits else EXIT_DOES_NOT_FIT,
                   trace_warnings(result.warnings, options.format) + written)


def write_outputs(result: Any, options: Options) -> tuple[str, ...]:
    """--plot, --html and --memory-snapshot: each file written, one stderr line each (what was cut, if anything)."""
    lines = []
    if options.plot:
        from trainmem.report.plot import write_timeline_plot

        write_timeline_plot(result, options.plot)
        lines.append(f"trainmem: wrote the timeline plot to {options.plot}")
    if options.html:
        from trainmem.report.html import write_html

        write_html(result, options.html)
        lines.append(f"trainmem: wrote the HTML report to {options.html}")
    if options.memory_snapshot:
        from trainmem.report.memviz import write_snapshot
        from trainmem.report.memviz_limits import DEFAULT_MAX_ENTRIES

        limit = options.snapshot_max_entries or DEFAULT_MAX_ENTRIES
        note = write_snapshot(result, options.memory_snapshot, limit)
        lines.append(f"trainmem: wrote the memory snapshot to {options.memory_snapshot}" + (f" ({note})" if note else ""))
    return tuple(lines)


def trace_warnings(warnings: list[str], fmt: str) -> tuple[str, ...]:
    """Assumptions the trace made about the model's ops (data-dependent values) also go to stderr;
    the rest are in the report. JSON output keeps stderr quiet for scripts: all are in the JSON."""
    if fmt == "json":
        return ()
    return tuple(f"warning: {warning}" for warning in warnings if warning.startswith("aten."))
