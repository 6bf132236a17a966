"""The files a command writes besides its report (--plot, --html, --memory-snapshot): checked and made absolute
while the flags are read, before anything is built or traced, and written so that nothing can redirect them.

A path is resolved against the directory trainmem started in: the model's code runs later in this process and
may change the working directory (os.chdir in a factory), which must not move where a file lands. A path that is
a symbolic link is refused: writing through it would overwrite whatever it points to (a link out.html -> model.py
would replace the user's code with a report). The file is written into a private folder made beside it (mkdtemp:
a new name, mode 0700, so no one else can put a link there) and renamed over the path: a rename replaces a link
that appeared meanwhile instead of following it, and no reader ever sees half a file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from trainmem.errors import TrainmemError, quote, short
from trainmem.files import kind_of

OUTPUT_KEYS = ("plot", "html", "memory_snapshot")
T = TypeVar("T")


def suffixes(key: str) -> tuple[str, ...]:
    """The endings each writer accepts, read from the writer (report/), lowercase."""
    if key == "plot":
        from trainmem.report.plot import FORMATS

        return tuple(FORMATS)
    if key == "html":
        from trainmem.report.html import SUFFIXES

        return SUFFIXES
    from trainmem.report.memviz import SUFFIXES

    return SUFFIXES


def output_paths(values: Mapping[str, Any], where: Callable[[str], str]) -> dict[str, str]:
    """The absolute path of each output given (key → path), each checked; `where(key)` names the flag or the
    --setup file's key a refusal blames."""
    return {key: checked_path(values[key], suffixes(key), where(key))
            for key in OUTPUT_KEYS if values.get(key) is not None}


def checked_path(path: Any, endings: tuple[str, ...], where: str) -> str:
    """`path` made absolute against the current directory, refused in one line unless a file could be written
    there: the right ending, an existing folder this process may write in, and nothing there yet or a regular
    file that is not a symbolic link."""
    if not isinstance(path, str) or not path.strip():
        raise TrainmemError(f"expected a file name, got {quote(path)}", where=where)
    if not path.lower().endswith(endings):
        raise TrainmemError(f"expected a file name ending in {' or '.join(endings)}, got {quote(path)}", where=where)
    try:
        absolute = os.path.abspath(path)
        folder = os.path.dirname(absolute)
        if not os.path.isdir(folder):
            raise TrainmemError(f"expected a file in an existing folder, got {quote(path)} ({short(folder)} "
                                f"{'is not a folder' if os.path.lexists(folder) else 'does not exist'})", where=where)
        _refuse_existing(path, absolute, where)
    except (OSError, ValueError) as error:  # a name too long, a NUL byte, a loop of links in the folder's path
        raise TrainmemError(f"expected a file name, got {quote(path)} ({getattr(error, 'strerror', None) or error})",
                            where=where) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise TrainmemError(f"expected a folder you can write in, got {quote(path)} (no permission to write in "
                            f"{short(folder)})", where=where)
    return absolute


def _refuse_existing(path: str, absolute: str, where: str) -> None:
    """What is at the path already, if anything, refused unless it is a regular file this process may replace."""
    try:
        mode = os.lstat(absolute).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise TrainmemError(f"expected a new or regular file, got {quote(path)}, a symbolic link to "
                            f"{quote(os.readlink(absolute))} (writing would go through it to that file); remove "
                            "the link or choose another path", where=where)
    if stat.S_ISDIR(mode):
        raise TrainmemError(f"expected a file name, got the folder {quote(path)}", where=where)
    if not stat.S_ISREG(mode):
        raise TrainmemError(f"expected a new or regular file, got {quote(path)}, {kind_of(mode)}", where=where)
    if not os.access(absolute, os.W_OK):
        raise TrainmemError(f"expected a file you can write, got {quote(path)} (read-only)", where=where)


_deferred: list[tuple[str, str, str, bytes]] | None = None  # in the worker: files for the parent to write


@contextlib.contextmanager
def deferred_writes() -> Iterator[list[tuple[str, str, str, bytes]]]:
    """In the worker (cli/worker.py): write_safely renders each file into a private temporary folder and keeps
    its bytes, (absolute, shown, where, bytes), for the parent process to write (supervised.py): only the
    parent writes the user's files."""
    global _deferred
    _deferred = []
    try:
        yield _deferred
    finally:
        _deferred = None


def write_deferred(files: tuple[tuple[str, str, str, bytes], ...]) -> None:
    """The parent's side: each file the worker rendered, written as write_safely writes (a link is refused)."""
    for absolute, shown, where, data in files:
        write_safely(absolute, shown, where, lambda staged, data=data: _write_bytes(staged, data))


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def _render_for_the_parent(absolute: str, shown: str, where: str, write: Callable[[str], T]) -> T:
    private = tempfile.mkdtemp(prefix="trainmem-output-")
    staged = os.path.join(private, os.path.basename(absolute))
    try:
        result = write(staged)
        with open(staged, "rb") as handle:
            _deferred.append((absolute, shown, where, handle.read()))  # type: ignore[union-attr]
    except TrainmemError as error:
        raise type(error)(error.message.replace(staged, shown), where=error.where) from None
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return result


def write_safely(absolute: str, shown: str, where: str, write: Callable[[str], T]) -> T:
    """Call `write(name)` on a new file in a private folder beside `absolute`, then rename it to `absolute`;
    `shown` is the path as the user gave it, for messages. Returns what `write` returns. In the worker the file
    is rendered in a temporary folder and its bytes go to the parent (deferred_writes)."""
    if _deferred is not None:
        return _render_for_the_parent(absolute, shown, where, write)
    folder, name = os.path.split(absolute)
    _refuse_existing(shown, absolute, where)  # again: a link made since the flags were read is refused too
    try:
        private = tempfile.mkdtemp(prefix=".trainmem-", dir=folder)
    except OSError as error:
        raise TrainmemError(f"expected a folder trainmem can write in, could not write {quote(shown)} "
                            f"({error.strerror or error})", where=where) from None
    staged = os.path.join(private, name)
    try:
        result = write(staged)
        os.replace(staged, absolute)  # a link that appeared meanwhile is replaced, never followed
    except TrainmemError as error:  # the writer's own line names the staged file: name the user's instead
        raise type(error)(error.message.replace(staged, shown), where=error.where) from None
    except OSError as error:
        raise TrainmemError(f"expected a writable file, could not write {quote(shown)} ({error.strerror or error})",
                            where=where) from None
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return result
