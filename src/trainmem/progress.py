"""A progress bar on stderr for long work (fit's search, plan, sweeps, measure's runs), only when stderr is a
terminal and NO_COLOR is not set: tqdm's when it is installed, else one line rewritten in place with '\\r'.
Anywhere else (a pipe, a file, a test, a notebook's captured stderr) it does nothing, so that logs and JSON
stay clean.

The total may be unknown (fit doubles until a batch does not fit): `total(None)` shows a count without one."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO


def wanted(stream: TextIO) -> bool:
    """A bar only on a terminal, and never with NO_COLOR set to anything non-empty (no-color.org asks for no
    ANSI styling; a bar redrawn with escape sequences is styling)."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class Progress:
    def __init__(self, what: str, stream: TextIO | None = None, enabled: bool | None = None,
                 unit: str = "layout") -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = wanted(self.stream) if enabled is None else enabled
        self.what, self.unit, self.done, self.count = what, unit, 0, 0
        self.started = time.perf_counter()
        self._bar: Any = None

    def total(self, count: int | None) -> None:
        """Start the bar: `count` steps, or None when the number is not known in advance."""
        self.count = count
        if not self.enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._line()
            return
        # tqdm writes "{n}{unit}": a leading space reads "7 candidates" rather than "7candidate"
        self._bar = tqdm(total=count, desc=self.what, file=self.stream, leave=False, unit=f" {self.unit}s")

    def advance(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
        else:
            self._line()

    def _line(self) -> None:
        seconds = time.perf_counter() - self.started
        of = "" if self.count is None else f"/{self.count:,}"
        self.stream.write(f"\r{self.what}: {self.done:,}{of} ({seconds:.0f} s)")
        self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

