"""A progress bar on stderr, only when stderr is a terminal: tqdm's when it is installed, else one line
rewritten in place with '\\r'. Anywhere else (a pipe, a file, a test) it does nothing, so that logs and JSON
stay clean."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    def __init__(self, what: str, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) if enabled is None else enabled
        self.what, self.done, self.count = what, 0, 0
        self.started = time.perf_counter()
        self._bar: Any = None

    def total(self, count: int) -> None:
        self.count = count
        if not self.enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            self._line()
            return
        self._bar = tqdm(total=count, desc=self.what, file=self.stream, leave=False, unit="layout")

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
        self.stream.write(f"\r{self.what}: {self.done:,}/{self.count:,} ({seconds:.0f} s)")
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
