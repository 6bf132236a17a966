"""The command line, which the library never imports: main.py (argparse → the command → render → exit code),
parser.py (the flags), options.py (flags over a --setup file over the defaults, checked), outcome.py (what a
command returns, the exit codes), process.py (stdout, Ctrl-C), commands/ (one module a command),
parallel_flags.py (the many-GPU flags) and compare_sweep.py (compare's configurations and --sweep)."""

from trainmem.cli.main import main, run_command
from trainmem.cli.options import Options, check_run_options, gpu_options, merge_options, option_keys, setup_from_options
from trainmem.cli.outcome import EXIT_BAD_INPUT, EXIT_DOES_NOT_FIT, EXIT_OK, Outcome
from trainmem.cli.parser import build_parser

__all__ = ["EXIT_BAD_INPUT", "EXIT_DOES_NOT_FIT", "EXIT_OK", "Options", "Outcome", "build_parser", "check_run_options",
           "gpu_options", "main", "merge_options", "option_keys", "run_command", "setup_from_options"]
