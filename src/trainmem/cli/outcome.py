"""What a command returns (its text, its exit code, lines for stderr) and the exit codes: the CLI's contract.

0 ok / fits, 1 does not fit the device (only after something was evaluated), 2 bad input or a failed trace,
130 interrupted (Ctrl-C), 143 terminated (SIGTERM), 141 the reader of stdout went away.
"""

from __future__ import annotations

import dataclasses

# SIGINT's and SIGTERM's numbers + 128, as a shell reports them: the supervisor's, which exits with them itself
from trainmem.supervised import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from trainmem.supervised import EXIT_TERMINATED as EXIT_TERMINATED

EXIT_OK, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE's number on Linux and macOS, as a shell reports a process it ended
INTERRUPTED_LINE = b"trainmem: interrupted\n"
EXIT_STATUS_HELP = ("exit status: 0 fits (or the command's answer), 1 does not fit (only after a configuration was "
                    "evaluated), 2 bad input or the model's code failed (one line on stderr), 130 interrupted "
                    "(Ctrl-C), 143 terminated (SIGTERM), 141 the reader of stdout went away")


@dataclasses.dataclass(frozen=True)
class Outcome:
    text: str
    code: int
    warnings: tuple[str, ...] = ()
    # files the worker rendered for the parent to write (cli/output_files.py deferred_writes): (absolute, shown,
    # where, bytes); empty in one process, where each command writes its own
    files: tuple[tuple[str, str, str, bytes], ...] = ()
