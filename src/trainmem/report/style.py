"""How the terminal report looks: colour (on a terminal only, never with NO_COLOR) and aligned columns.

Colour is ANSI SGR (ECMA-48 "Select Graphic Rendition": ESC [ n m). It is decided once, by the caller
(the CLI asks `use_colour(sys.stdout)`); everything else renders plain text by default, so that str(estimate),
notebooks, logs and pipes never see escape codes. Columns are padded by the text's visible width, escape
codes excluded, so a coloured cell lines up with plain ones."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import IO, Any

# ESC [ parameters m: the only escape sequences this module writes (Style below)
_SGR = re.compile(r"\x1b\[[0-9;]*m")
_RESET = "\x1b[0m"
# SGR parameters (ECMA-48 8.3.117): 1 bold, 2 faint, 31 red, 32 green, 33 yellow
_BOLD, _DIM, _RED, _GREEN, _YELLOW = "1", "2", "31", "32", "33"


def use_colour(stream: IO[Any] | Any) -> bool:
    """Colour for `stream`: only when it is a terminal, and never when NO_COLOR is set to anything
    non-empty (https://no-color.org: "when present and not an empty string ... prevents the addition of
    ANSI color"). DESIGN.md: NO_COLOR is the one environment variable the reports read."""
    if os.environ.get("NO_COLOR", ""):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):  # no isatty, or a closed stream
        return False


def visible_len(text: str) -> int:
    """The width `text` takes on a terminal: its length without SGR escape codes."""
    return len(_SGR.sub("", text))


def strip_colour(text: str) -> str:
    return _SGR.sub("", text)


@dataclasses.dataclass(frozen=True)
class Style:
    """Paints words when `colour` is on; with it off every method returns its text unchanged."""

    colour: bool = False

    def _paint(self, text: str, *codes: str) -> str:
        if not self.colour or not text:
            return text
        return f"\x1b[{';'.join(codes)}m{text}{_RESET}"

    def heading(self, text: str) -> str:
        return self._paint(text, _BOLD)

    def strong(self, text: str) -> str:
        return self._paint(text, _BOLD)

    def good(self, text: str) -> str:
        return self._paint(text, _GREEN)

    def bad(self, text: str) -> str:
        return self._paint(text, _BOLD, _RED)

    def warn(self, text: str) -> str:
        return self._paint(text, _YELLOW)

    def dim(self, text: str) -> str:
        return self._paint(text, _DIM)


PLAIN = Style(False)


def _pad(cell: str, width: int, how: str) -> str:
    gap = " " * (width - visible_len(cell))
    return gap + cell if how == "r" else cell + gap


def table(rows: list[list[str]], align: str, indent: str = "  ", gap: str = "  ") -> list[str]:
    """Rows of cells as aligned lines: column i left-aligned where align[i] is "l", right-aligned where it
    is "r" (numbers: their units line up). Rows may be shorter than the widest (their last cells empty).
    Trailing blanks are dropped; widths ignore colour codes."""
    if not rows:
        return []
    columns = max(len(row) for row in rows)
    if len(align) < columns:
        raise ValueError(f"expected an alignment for each of {columns} columns, got {align!r}")
    rows = [list(row) + [""] * (columns - len(row)) for row in rows]
    widths = [max(visible_len(row[i]) for row in rows) for i in range(columns)]
    return [(indent + gap.join(_pad(c, w, a) for c, w, a in zip(row, widths, align))).rstrip() for row in rows]
