"""Text for a stream that cannot encode it: with PYTHONIOENCODING=ascii, or LC_ALL=C and PYTHONUTF8=0, Python's
stdout is ASCII and one typographic dash would lose the whole report to a UnicodeEncodeError. There the
characters trainmem's reports use are written in ASCII (`→` as `->`, `×` as `x`) and anything else as `?`."""

from __future__ import annotations

from typing import Any

# every non-ASCII character in trainmem's own strings (src/trainmem), and the usual typographic ones
ASCII_FOR = str.maketrans({
    "…": "...", "×": "x", "→": "->", "←": "<-", "—": "-", "–": "-", "−": "-", "·": "*", "≤": "<=", "≥": ">=",
    "÷": "/", "±": "+/-", "µ": "u", "²": "^2", "⁹": "^9", "ᵀ": "^T", "₁": "1", "₂": "2", "₃": "3", "∏": "prod", "Ψ": "Psi",
    "◀": "<", "▸": ">", "✓": "ok", "✗": "x", "‘": "'", "’": "'", "“": '"', "”": '"', "≈": "~", "\u00a0": " ",
})


def for_stream(text: str, stream: Any) -> str:
    """`text` as `stream` can write it: unchanged where its encoding holds every character."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
        return text
    except UnicodeEncodeError:
        return text.translate(ASCII_FOR).encode(encoding, errors="replace").decode(encoding)
    except LookupError:  # an encoding Python does not know: ASCII is safe on any stream
        return text.translate(ASCII_FOR).encode("ascii", errors="replace").decode("ascii")
