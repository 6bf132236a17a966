"""A file named on the command line (a model, a --setup file), checked before it is opened.

Only a regular file is opened: a FIFO nobody writes to would block the open for ever, a device such as
/dev/zero would be read without end, a directory fails with an error naming nothing. Errors name the
path shortened from the middle (errors.short), so the file's own name is always in the line.
"""

from __future__ import annotations

import stat
from pathlib import Path

from trainmem.errors import ModelRefError, TrainmemError, short

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def regular_file(ref: str, what: str, error_type: type[TrainmemError] = ModelRefError) -> tuple[Path, int]:
    """The path and size of `ref`, a regular file (symbolic links followed); else one line saying what
    was expected (`what`, e.g. "a checkpoint file") and what is there."""
    path = Path(ref)
    try:
        mode, size = (status := path.stat()).st_mode, status.st_size
    except FileNotFoundError:
        raise error_type(f"expected {what}, found none", where=short(ref)) from None
    except (OSError, ValueError) as error:  # a name too long, a NUL byte, a loop of links, no permission
        raise error_type(f"expected {what}, could not look at it: {getattr(error, 'strerror', None) or error}",
                         where=short(ref)) from None
    if not stat.S_ISREG(mode):
        raise error_type(f"expected {what}, got {kind_of(mode)}", where=short(ref))
    return path, size


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words: "a FIFO", "a directory" …"""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")
