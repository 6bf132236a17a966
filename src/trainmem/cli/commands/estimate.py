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
                   trace_warnings(result.warnings, options.format) + cache_note(result, options.format) + written)


def cache_note(result: Any, fmt: str) -> tuple[str, ...]:
    """A stderr line when the figures come from a trace made earlier (trace/cache_store.py): the user may have
    changed what the cache's key cannot see. Not in the report, which is the same bytes however it was reached."""
    use = getattr(result, "trace_cache", None)
    if fmt == "json" or use is None or use.used != "reused":
        return ()
    return (f"trainmem: trace reused from the cache ({use.detail}; --no-cache traces again)",)


def write_outputs(result: Any, options: Options) -> tuple[str, ...]:
    """--plot, --html and --memory-snapshot: each file written (cli/output_files.py: to the path resolved when the
    flags were read, never through a symbolic link), one stderr line each (what was cut, if anything)."""
    from trainmem.cli.options import output_paths
    from trainmem.cli.output_files import write_safely
    from trainmem.flag_rules import flag_of

    paths = options.values.get("output_paths")
    paths = output_paths(options) if paths is None else paths
    lines = []

    def write(key: str, writer: Callable[[str], Any]) -> Any:
        return write_safely(paths[key], options.values[key], options.origins.get(key, flag_of(key)), writer)

    if options.plot:
        from trainmem.report.plot import write_timeline_plot

        write("plot", lambda path: write_timeline_plot(result, path))
        lines.append(f"trainmem: wrote the timeline plot to {options.plot}")
    if options.html:
        from trainmem.report.html import write_html

        write("html", lambda path: write_html(result, path))
        lines.append(f"trainmem: wrote the HTML report to {options.html}")
    if options.memory_snapshot:
        from trainmem.report.memviz import write_snapshot
        from trainmem.report.memviz_limits import DEFAULT_MAX_ENTRIES

        limit = options.snapshot_max_entries or DEFAULT_MAX_ENTRIES
        note = write("memory_snapshot", lambda path: write_snapshot(result, path, limit))
        lines.append(f"trainmem: wrote the memory snapshot to {options.memory_snapshot}" + (f" ({note})" if note else ""))
    return tuple(lines)


def trace_warnings(warnings: list[str], fmt: str) -> tuple[str, ...]:
    """Assumptions the trace made about the model's ops (data-dependent values) also go to stderr;
    the rest are in the report. JSON output keeps stderr quiet for scripts: all are in the JSON."""
    if fmt == "json":
        return ()
    return tuple(f"warning: {warning}" for warning in warnings if warning.startswith("aten."))
