"""The one exception family trainmem raises for bad input or a failed trace.

Every message says what was expected, what was given, and where, so that the CLI can print it as
one line and exit 2 (see cli.py). Nothing here imports torch.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable

# A value quoted back in an error is there so that the user recognises it, not to reproduce it: an
# 80-character prefix names any flag value, file name or layer argument a person types, while a
# 4,000-character reference or an expanded YAML structure would otherwise fill the terminal (and
# repr() of a huge structure costs as much time and memory as the structure itself).
QUOTE_LIMIT = 80


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """repr(value) cut to about `limit` characters, saying how long the original was. Containers are
    summarised by reprlib (a few items of each level), so a billion-element list is never rendered."""
    if isinstance(value, str):
        text = repr(value) if len(value) <= limit else repr(value[:limit]) + f" … ({len(value):,} characters)"
    else:
        short = reprlib.Repr()
        short.maxlevel, short.maxstring, short.maxother = 2, limit, limit
        short.maxlist = short.maxtuple = short.maxdict = short.maxset = 4
        text = short.repr(value)
        text = text if len(text) <= limit else text[:limit] + " …"
    return " ".join(text.split())  # one line, whatever newlines the value held


def short(text: str, limit: int = QUOTE_LIMIT) -> str:
    """Text used as a `where` (a reference, a path), unquoted, at most about `limit` characters: its
    start and its end, which for a path is the file's name."""
    text = " ".join(str(text).split())
    # control characters (a NUL, an escape sequence) are shown escaped, never sent to the terminal
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) <= limit:
        return text
    head = limit // 4
    return f"{text[:head]}…{text[-(limit - head):]}"


def one_line(text: object, limit: int = 4 * QUOTE_LIMIT) -> str:
    """The first line of a message from elsewhere (torch, a user's code), cut to `limit` characters."""
    lines = str(text).strip().splitlines()
    first = lines[0] if lines else ""
    return first if len(first) <= limit else first[:limit] + f" … ({len(first):,} characters)"


class TrainmemError(Exception):
    """Bad input or a failed trace: one line that names expected / got / where."""

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


class ModelRefError(TrainmemError):
    """A model reference that cannot be resolved or built."""


class SetupError(TrainmemError):
    """A training setup value (batch size, optimizer, precision, shape…) that is not valid."""


class TraceError(TrainmemError):
    """The model's training step failed while being traced on fake tensors."""


class MeasureError(TrainmemError):
    """A real measurement run could not be started or failed."""


def unknown_key(key: object, known: Iterable[str], where: str | None, keys_are: str) -> TrainmemError:
    """An unknown key, with the nearest known one where there is one; the full list would fill lines."""
    import difflib

    close = difflib.get_close_matches(str(key), sorted(known), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return SetupError(f"expected a known key, got {quote(key)} ({hint}{keys_are})", where=where)


def expected(what: str, got: object, where: str | None = None, cls: type[TrainmemError] = SetupError) -> TrainmemError:
    """Build the standard 'expected X, got Y' error; Y is quoted short (quote())."""
    return cls(f"expected {what}, got {quote(got)}", where=where)
