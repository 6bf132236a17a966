"""argparse → TrainingSetup → the command → render → exit code.

Errors are one line on stderr; a traceback only with --debug. Stdout carries the result alone: whatever the
model's code or a library prints while the model is built and traced goes to stderr (process.py), so
`--format json` stays JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from trainmem.cli.commands import ARGS_COMMANDS, SETUP_COMMANDS
from trainmem.cli.encoding import for_stream
from trainmem.cli.options import (aimed_at_origin, check_run_options, environment_notes, merge_options, option_keys,
                                  setup_from_options, with_environment, with_output_paths)
from trainmem.cli.outcome import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, INTERRUPTED_LINE, Outcome
from trainmem.cli.parser import build_parser
from trainmem.cli.process import ctrl_c_ends_the_process, stdout_wants_colour, user_output_to_stderr
from trainmem.errors import TrainmemError, quote


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser, in_worker: bool = False) -> Outcome:
    """The command of `args`: in this process, or with `in_worker` the command of a model in a supervised worker
    process (supervised.py), its files written here."""
    if args.command in ARGS_COMMANDS:  # no model, no setup: their own few flags
        return ARGS_COMMANDS[args.command](args)
    options = with_environment(merge_options(args, option_keys(parser)).with_values(model=args.model), args.command)
    options = with_output_paths(options)  # against the directory trainmem started in: the model's code may chdir
    warnings = environment_notes(options) + check_run_options(options, args.command)
    setup = setup_from_options(options)
    # colour is read before stdout is pointed at stderr below; debug keeps libraries' start-up lines (cli/quiet.py)
    options = options.with_values(colour=stdout_wants_colour(), debug=bool(getattr(args, "debug", False)))
    if in_worker:
        from trainmem.cli.output_files import write_deferred
        from trainmem.cli.options import timeout_words
        from trainmem.supervised import DEFAULT_TIMEOUT_SECONDS, run_in_worker

        job = {"command": args.command, "values": dict(options.values), "given": dict(options.given),
               "origins": dict(options.origins), "setup": setup, "model": args.model, "debug": args.debug}
        timeout, origin = options.values.get("timeout") or DEFAULT_TIMEOUT_SECONDS, options.origins.get("timeout")
        outcome = run_in_worker(job, "trainmem.cli.worker", timeout, timeout_words(timeout, origin),
                                origin or "--timeout")
        write_deferred(outcome.files)
    else:
        outcome = execute(args.command, options, setup, args.model)
    return dataclasses.replace(outcome, warnings=tuple(warnings) + outcome.warnings, files=())


def execute(command: str, options: Any, setup: Any, model: str) -> Outcome:
    """A command of a model, with the user's output on stderr: here, or in the worker (cli/worker.py)."""
    from trainmem.trace.cache_store import switched

    with user_output_to_stderr(), switched(not options.values.get("no_cache")):
        try:
            return SETUP_COMMANDS[command](options, setup)
        except SystemExit as stop:  # the model's code (a forward, a library it imports) called sys.exit
            raise TrainmemError(f"expected the model's code to return, it called sys.exit({quote(stop.code)})",
                                where=model) from None
        except (ImportError, TrainmemError) as error:  # torch not installed: which extra to install
            from trainmem.install_hints import missing_framework_line

            line = missing_framework_line(error, model, options.framework,
                                          keras_command=command not in ("fit", "compare"))
            if line is not None:
                raise TrainmemError(line) from error
            aimed = aimed_at_origin(error, options.origins) if isinstance(error, TrainmemError) else error
            if aimed is error:
                raise
            raise aimed from error


def error_line(error: BaseException) -> str:
    """The one stderr line of a failed command (without --debug)."""
    if isinstance(error, TrainmemError):
        return f"trainmem: error: {error}"
    return (f"trainmem: error: {type(error).__name__}: {one_line_of(error)} (rerun with --debug for the "
            "traceback)")


_running = False  # main() is running in this process: a model factory that calls it again would recurse


def main(argv: list[str] | None = None) -> int:
    """The command line. Given no `argv` (the `trainmem` command), the command of a model runs in a supervised
    worker process (supervised.py); given `argv` (a Python program, a test), in this process."""
    global _running
    if _running:  # e.g. `trainmem estimate trainmem.cli:main`: trainmem itself given as the model's factory
        raise TrainmemError("expected a model factory, got trainmem's own command line (trainmem.cli.main)",
                            where="MODEL")
    _running = True
    try:
        from trainmem.supervised import supervised

        return _main(argv, in_worker=argv is None and supervised())
    finally:
        _running = False


def _main(argv: list[str] | None, in_worker: bool = False) -> int:
    from trainmem.supervised import WorkerFailed

    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    with ctrl_c_ends_the_process():
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            outcome = run_command(args, parser, in_worker)
            for line in outcome.warnings:
                print(for_stream(line, sys.stderr), file=sys.stderr)
            print(for_stream(outcome.text, sys.stdout))
            sys.stdout.flush()  # a closed pipe shows here, inside the try, not at the interpreter's exit
            return outcome.code
        except WorkerFailed as failed:  # the worker's own line (its traceback already on stderr with --debug)
            print(for_stream(failed.line, sys.stderr), file=sys.stderr)
            return failed.code
        except TrainmemError as error:
            if debug:
                raise
            print(for_stream(error_line(error), sys.stderr), file=sys.stderr)
            return EXIT_BAD_INPUT
        except KeyboardInterrupt:  # Ctrl-C where the handler could not be installed
            print(INTERRUPTED_LINE.decode().strip(), file=sys.stderr)
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            # the reader went away (`trainmem … | head -2`): not a verdict on the model, so never exit 1
            # ("does not fit"); point stdout at /dev/null so the interpreter's final flush stays quiet, and
            # exit as a process that SIGPIPE ended does in a shell (128 + 13)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except Exception as error:  # noqa: BLE001 - anything unexpected is still one line without --debug
            if debug:
                raise
            print(for_stream(error_line(error), sys.stderr), file=sys.stderr)
            return EXIT_BAD_INPUT


def one_line_of(error: BaseException) -> str:
    from trainmem.errors import one_line

    return one_line(error)
