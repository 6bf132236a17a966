"""Bytes to text and back, in IEC units. Bytes stay int until rendered. No torch."""

from __future__ import annotations

import re

from trainmem.errors import expected

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def format_bytes(nbytes: int | None) -> str:
    """1536 -> '1.5 KiB'; None -> 'n/a'."""
    if nbytes is None:
        return "n/a"
    sign = "-" if nbytes < 0 else ""
    value = float(abs(nbytes))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{sign}{int(value)} B" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_bytes(text: str, where: str = "size") -> int:
    """'24GiB' -> 25769803776, '1.5 GB' -> 1500000000, '4096' -> 4096."""
    match = _PATTERN.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise expected("a size such as 4096, 512MiB or 24GiB", text, where)
    return int(float(match.group(1)) * _UNITS[unit])
