"""Reports on a stdout that cannot encode them (PYTHONIOENCODING=ascii; LC_ALL=C with PYTHONUTF8=0): written in
ASCII, never lost to a UnicodeEncodeError (cli/encoding.py)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainmem.cli.encoding import ASCII_FOR, for_stream

ROOT = Path(__file__).resolve().parents[1]


def test_every_character_of_trainmems_strings_has_an_ascii_form():
    found = set()
    for path in (ROOT / "src" / "trainmem").rglob("*.py"):
        found |= set(re.findall(r"[^\x00-\x7f]", path.read_text()))
    assert found and not {c for c in found if ord(c) not in ASCII_FOR}, sorted(c for c in found if ord(c) not in ASCII_FOR)


def test_a_stream_that_encodes_the_text_gets_it_unchanged():
    utf8 = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    ascii_ = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    text = "peak 1.2 GiB — 3 × 4 → 12 ≤ 16 … ☃"
    assert for_stream(text, utf8) == text
    assert for_stream(text, ascii_) == "peak 1.2 GiB - 3 x 4 -> 12 <= 16 ... ?"
    assert for_stream("ok", object()) == "ok"  # no encoding attribute: UTF-8


@pytest.mark.heavy
@pytest.mark.parametrize("args", [
    ["estimate", "mlp:1000-100-10", "--input-shape", "1000", "--batch-size", "8"],
    ["estimate", "mlp:1000-100-10", "--input-shape", "1000", "--batch-size", "8", "--device", "a100-40gb"],
    ["estimate", "--help"],
])
def test_the_cli_writes_ascii_where_stdout_is_ascii(args):
    """The same command on a UTF-8 stdout and on an ASCII one: the second is the first in ASCII, every
    character mapped (none replaced by '?')."""
    out = {}
    for encoding in ("utf-8", "ascii"):
        env = {**os.environ, "PYTHONIOENCODING": encoding}
        done = subprocess.run([sys.executable, "-m", "trainmem", *args], capture_output=True, env=env, timeout=300,
                              cwd=ROOT)
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
        out[encoding] = done.stdout.decode(encoding)
    assert not out["utf-8"].isascii()  # the case is one: the report has characters beyond ASCII
    assert out["ascii"] == out["utf-8"].translate(ASCII_FOR)


def test_an_error_line_with_a_symbol_survives_an_ascii_stderr():
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    done = subprocess.run([sys.executable, "-m", "trainmem", "estimate", "mlp:8-4", "--batch-size", "8",
                           "--device", "a100-40gb", "--cuda-context", "1000TiB"], capture_output=True, env=env,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.startswith(b"trainmem: error: --cuda-context: expected a CUDA context")
    assert done.stderr.isascii() and done.stdout == b""
