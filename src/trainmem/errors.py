"""The one exception family trainmem raises for bad input or a failed trace.

Every message says what was expected, what was given, and where, so that the CLI can print it as
one line and exit 2 (see cli/main.py). Nothing here imports torch.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Sequence

# A value quoted back in an error is there so that the user recognises it, not to reproduce it: an
# 80-character prefix names any flag value, file name or layer argument a person types, while a
# 4,000-character reference or an expanded YAML structure would otherwise fill the terminal (and
# repr() of a huge structure costs as much time and memory as the structure itself).
QUOTE_LIMIT = 80


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """repr(value) cut to about `limit` characters, saying how long the original was: a long text keeps its start
    and its end, which for a path is the file's name. Containers are summarised by reprlib (a few items of each
    level), so a billion-element list is never rendered."""
    if isinstance(value, str):
        head = limit // 4
        text = (repr(value) if len(value) <= limit
                else repr(f"{value[:head]}…{value[-(limit - head):]}") + f" ({len(value):,} characters)")
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


class TorchVersionError(TrainmemError):
    """A feature the installed torch cannot run: the feature, the torch it needs and the torch found, in one line
    (trace/torch_private.py probes what moved between releases)."""


def unknown_key(key: object, known: Iterable[str], where: str | None, keys_are: str) -> TrainmemError:
    """An unknown key, with the nearest known one where there is one; the full list would fill lines."""
    import difflib

    close = difflib.get_close_matches(str(key), sorted(known), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return SetupError(f"expected a known key, got {quote(key)} ({hint}{keys_are})", where=where)


def expected(what: str, got: object, where: str | None = None, cls: type[TrainmemError] = SetupError) -> TrainmemError:
    """Build the standard 'expected X, got Y' error; Y is quoted short (quote())."""
    return cls(f"expected {what}, got {quote(got)}", where=where)


def failure_reason(error: BaseException) -> str:
    """Why an evaluation failed, in one line: a TrainmemError's own message (with its where), anything else as
    its type and the first line of its message."""
    if isinstance(error, TrainmemError):
        return one_line(error)
    return f"{type(error).__name__}: {one_line(error)}"


def failure_groups(failures: Sequence[tuple[str, str]]) -> list[dict[str, object]]:
    """(what, why) pairs grouped by reason, the most frequent first: [{"reason", "count", "failed": [what…]}]."""
    by_reason: dict[str, list[str]] = {}
    for what, why in failures:
        by_reason.setdefault(why, []).append(what)
    ranked = sorted(by_reason.items(), key=lambda item: -len(item[1]))  # stable: first seen first among equals
    return [{"reason": why, "count": len(whats), "failed": whats} for why, whats in ranked]


def grouped_failures(failures: Sequence[tuple[str, str]], plural: str, limit: int = 3) -> list[str]:
    """(what, why) pairs as lines, one per reason, the most frequent first: "12 layouts failed: ImportError: …",
    or "batch size 4 failed: …" for a reason only one has; past `limit` reasons, one line counts the rest."""
    ranked = [(group["reason"], group["failed"]) for group in failure_groups(failures)]
    lines = [f"{_which(whats, plural)} failed: {why}" for why, whats in ranked[:limit]]
    rest = ranked[limit:]
    if rest:
        count = sum(len(whats) for _, whats in rest)
        lines.append(f"{count:,} more failed for {len(rest):,} other reason{'s' * (len(rest) != 1)}")
    return lines


def _which(whats: Sequence[str], plural: str) -> str:
    """"batch size 4"; "2 layouts (fsdp dp2 mb1, fsdp dp2 mb2)"; "12 layouts" (a longer list is in the JSON)."""
    if len(whats) == 1:
        return whats[0]
    return f"{len(whats):,} {plural}" + (f" ({', '.join(whats)})" if len(whats) <= 3 else "")


class NothingEvaluated(TrainmemError):
    """Every configuration a search, planner or sweep tried failed to evaluate: there is no answer, which is not
    "does not fit" (exit 2, never 1). `failures` holds each (what, why)."""

    def __init__(self, failures: Sequence[tuple[str, str]], noun: str, plural: str, *, where: str | None = None,
                 also: str = "") -> None:
        self.failures = tuple(failures)
        lines = grouped_failures(self.failures, plural)
        super().__init__(f"no {noun} could be evaluated: " + "; ".join(lines) + (f" ({also})" if also else ""),
                         where=where)
