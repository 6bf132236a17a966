"""Traces kept in the user's cache directory, so that a repeated question (a notebook cell run again, a second
`fit`, a sweep over devices) skips tracing. No torch here: `trainmem cache` lists and clears without it.

One gzip-compressed JSON file per trace (trace/cache_codec.py), named by its key (trace/cache_key.py), in
`<cache dir>/traces/`. The directory is bounded: after each store the least recently used files go until the rest
fit in MAX_DIRECTORY_BYTES (a hit touches its file). Every read is bounded too (compressed and decompressed size),
and a file that does not decode is removed and the run traced again: the cache can make an answer faster, never
different.

The cache is on unless switched off: `--no-cache` on the command line, `cache=False` in the Python API
(`switched`). Tests switch it off in-process (tests/conftest.py), where a monkeypatched rule would not change a key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import stat
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainmem.trace.cache_codec import BadCacheFile, NotCacheable, decode, encode
from trainmem.trace.traced import TraceResult

SUBDIRECTORY = "traces"
SUFFIX = ".json.gz"
RESULT_SUFFIX = ".result" + SUFFIX  # a result derived from a trace (`remembered`)
RECORD_SUFFIX = ".record" + SUFFIX  # a small record beside the traces (`read_record`: trace/early_key.py)
MAX_DIRECTORY_BYTES = 1024 * 2**20  # the whole cache: a 1.3B GPT's trace is ~2 MB, a 200-step GRU's ~40 MB
MAX_FILE_BYTES = 256 * 2**20  # one file as stored (compressed)
MAX_DECODED_BYTES = 1024 * 2**20  # one file's JSON text: bounds what a hostile file can make us hold
MAX_EVENTS = 20_000_000  # a trace longer than this is not stored (its file would pass the bounds above)
RESULT_FORMAT = "result-1"  # a file of a result derived from a trace (`remembered`), not of a trace

_enabled = True


@contextlib.contextmanager
def switched(on: bool) -> Iterator[None]:
    """The cache on or off for the calls inside (`--no-cache`, estimate(cache=False))."""
    global _enabled
    before, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = before


def enabled() -> bool:
    return _enabled


def as_asked(cache: bool | None) -> contextlib.AbstractContextManager:
    """The Python API's `cache=` keyword: True or False switches the cache for the call, None leaves it as it is
    switched (on, unless a caller switched it off)."""
    return contextlib.nullcontext() if cache is None else switched(bool(cache))


def directory() -> Path:
    from trainmem.targets.calibrations import cache_dir

    return cache_dir() / SUBDIRECTORY


@dataclasses.dataclass(frozen=True)
class CacheUse:
    """What the cache did for one trace, as the report says it: reused (when it was traced), stored, off, or
    not cached (why)."""

    used: str  # "reused" | "stored" | "off" | "not cached"
    detail: str = ""  # reused: when traced (UTC); not cached: why
    key: str = ""  # reused, stored: the trace's key, from which results derived from the trace alone are keyed


def lookup(key: str) -> tuple[TraceResult, CacheUse] | None:
    path = directory() / (key + SUFFIX)
    data = _read_json(path)
    if data is None:
        return None
    try:
        traced = decode(data)
    except BadCacheFile:
        _remove(path)
        return None
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(_traced_at(path)))
    return traced, CacheUse("reused", f"traced {when}", key)


def store(key: str, traced: TraceResult) -> CacheUse:
    """Keep `traced` under `key`; a trace the codec cannot carry exactly, or a directory that cannot be written,
    leaves the run uncached, said in the CacheUse (the estimate itself never fails for the cache)."""
    if len(traced.trace.events) > MAX_EVENTS:
        return CacheUse("not cached", f"more than {MAX_EVENTS:,} events")
    try:
        data = encode(traced)
    except NotCacheable as why:
        return CacheUse("not cached", str(why))
    written = _write(key, data)
    return CacheUse("stored", "", key) if written is None else CacheUse("not cached", written)


def remembered(key: str | None, compute: Callable[[], Any], to_plain: Callable[[Any], Any],
               from_plain: Callable[[Any], Any]) -> Any:
    """A result computed from a stored trace alone (the CPU target's replay of glibc's heap over the run, most of
    a CPU estimate's time), kept beside it under `key`, which the caller derives from the trace's key and whatever
    else the result depends on. `from_plain` raises BadCacheFile (or TypeError, ValueError, KeyError) on what it
    cannot read: the result is then computed again."""
    if key is None or not _enabled:
        return compute()
    path = directory() / (key + RESULT_SUFFIX)
    data = _read_json(path)
    if isinstance(data, dict) and data.get("format") == RESULT_FORMAT:
        try:
            return from_plain(data["result"])
        except (BadCacheFile, TypeError, ValueError, KeyError, AttributeError):
            _remove(path)
    value = compute()
    _write(key + RESULT_SUFFIX.removesuffix(SUFFIX), {"format": RESULT_FORMAT, "result": to_plain(value)})
    return value


def read_record(key: str) -> Any:
    """A small record kept beside the traces under `key` (trace/early_key.py), or None."""
    return _read_json(directory() / (key + RECORD_SUFFIX))


def write_record(key: str, data: Any) -> None:
    """Keep `data` under `key`; a directory that cannot be written leaves it unkept (a record only saves time)."""
    _write(key + RECORD_SUFFIX.removesuffix(SUFFIX), data)


def _read_json(path: Path) -> Any:
    """A stored file's JSON, within the bounds; None when there is none or it does not read (removed)."""
    try:
        status = path.lstat()
    except OSError:
        return None
    try:
        if not stat.S_ISREG(status.st_mode):  # a link, a FIFO (a read that never ends), a device: not ours
            raise BadCacheFile("not a regular file")
        if status.st_size > MAX_FILE_BYTES:
            raise BadCacheFile("larger than a stored trace can be")
        data = json.loads(_read_bounded(path))
    except (BadCacheFile, OSError, ValueError, EOFError, zlib.error, RecursionError):
        _remove(path)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: the last to be evicted
    return data


def _write(key: str, data: Any) -> str | None:
    """Store `data` under `key` atomically and keep the directory bounded; why not, when it could not."""
    folder = directory()
    try:
        text = json.dumps(data, separators=(",", ":")).encode()
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".{key}.{os.getpid()}.tmp"
        with open(temporary, "wb") as out:
            out.write(gzip.compress(text, compresslevel=1))
        os.replace(temporary, folder / (key + SUFFIX))  # atomic: a reader sees the whole file or none
        evict(MAX_DIRECTORY_BYTES)
    except OSError as error:
        return f"the cache directory {folder} cannot be written ({error.strerror or error})"
    return None


def evict(limit: int) -> int:
    """Remove the least recently used traces until the rest take at most `limit` bytes; the bytes removed."""
    files = sorted(_files(), key=lambda item: item[1].st_mtime)
    total = sum(status.st_size for _, status in files)
    removed = 0
    for path, status in files:
        if total <= limit:
            break
        if _remove(path):
            total -= status.st_size
            removed += status.st_size
    return removed


def summary() -> dict[str, Any]:
    files = _files()
    results = sum(path.name.endswith(RESULT_SUFFIX) for path, _ in files)
    records = sum(path.name.endswith(RECORD_SUFFIX) for path, _ in files)
    return {"directory": str(directory()), "traces": len(files) - results - records, "results": results,
            "records": records,
            "bytes": sum(s.st_size for _, s in files), "limit_bytes": MAX_DIRECTORY_BYTES}


def clear() -> dict[str, Any]:
    before = summary()
    evict(0)
    for leftover in directory().glob(".*.tmp") if directory().is_dir() else ():
        _remove(leftover)
    return before


def _files() -> list[tuple[Path, os.stat_result]]:
    folder = directory()
    if not folder.is_dir():
        return []
    out = []
    for path in folder.glob("*" + SUFFIX):
        with contextlib.suppress(OSError):
            out.append((path, path.lstat()))
    return [(path, stat) for path, stat in out if not path.is_symlink()]


def _read_bounded(path: Path) -> bytes:
    """The decompressed text, refused past MAX_DECODED_BYTES (a small file can claim gigabytes)."""
    out = bytearray()
    with gzip.open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            out += chunk
            if len(out) > MAX_DECODED_BYTES:
                raise BadCacheFile("decompresses past the bound of a stored trace")
    return bytes(out)


def _traced_at(path: Path) -> float:
    """When the trace was stored: gzip's header keeps the time it was compressed."""
    with open(path, "rb") as raw:
        header = raw.read(8)
    return float(int.from_bytes(header[4:8], "little")) if len(header) == 8 else 0.0


def _remove(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True
