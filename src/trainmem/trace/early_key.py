"""A repeated question on an `hf:` model answered from the trace cache without importing transformers or building
the model.

The trace cache's key (trace/cache_key.py) describes the model as built, so a cached answer still pays for building
it: for Llama-3.1-70B on meta, importing transformers and building took about 4 of the 6 s of an answer from the
cache. An `hf:` model that transformers' own classes build is fully named before any of that: by its config as read
(the bundled table's entry, a local config.json's content, or a hub snapshot's, which names its commit), the setup,
and the versions of trainmem's code and data, torch, transformers and the other libraries the trace key names. So a
run that traced (or found its trace) also keeps two small records beside the traces:
- under the early key of the source (`for_hf`): that transformers accepted this config and built the model; a later
  resolve with the same key skips transformers' checks and imports (frontends/hf.py), and builds only if asked to;
- under the early key of the run (the source's key, the setup, the target's kernel ops and semantics): the trace
  key, so trace_training finds the trace without building the model.
Any part that cannot be described (NotCacheable) leaves the run to the full key; a missing or unreadable record,
or a trace evicted since, leaves it to the ordinary path. The repository's own code (--trust-remote-code) is never
named early: it can change under the same config.
"""

from __future__ import annotations

import hashlib
from typing import Any

from trainmem.trace import cache_store
from trainmem.trace.cache_codec import NotCacheable

RECORD_FORMAT = "early-1"


def for_hf(ref: str, resolved: Any, setup: Any) -> str | None:
    """The early key of an `hf:` source, or None (the cache off, the repository's own code, an undescribable part)."""
    if not cache_store.enabled() or resolved.auto_map:
        return None
    return _digest("hf", ref, resolved, setup)


def checked(key: str | None) -> bool:
    """Whether a run of this source traced, or found its trace, before: transformers accepted its config."""
    return key is not None and _recall(key) is True


def trace_key(source: Any, setup: Any, kernel_ops: frozenset[str], semantics: Any) -> str | None:
    """The trace key an earlier run of the same source, setup and target stored, or None."""
    early = _run_key(source, setup, kernel_ops, semantics)
    found = _recall(early) if early is not None else None
    return found if isinstance(found, str) else None


def remember(source: Any, setup: Any, kernel_ops: frozenset[str], semantics: Any, key: str) -> None:
    """After a run traced or found its trace under `key`: both records (module docstring)."""
    early = _run_key(source, setup, kernel_ops, semantics)
    if early is not None:
        _note(source.prekey, True)
        _note(early, key)


def _run_key(source: Any, setup: Any, kernel_ops: frozenset[str], semantics: Any) -> str | None:
    prekey = getattr(source, "prekey", None)
    if prekey is None or not cache_store.enabled():
        return None
    return _digest("run", prekey, setup, sorted(kernel_ops), semantics)


def _digest(*parts: Any) -> str | None:
    from trainmem.trace.cache_key import described, versions

    digest = hashlib.sha256(RECORD_FORMAT.encode())
    try:
        for part in (versions(), *parts):
            digest.update(described(part, "a part of the early key").encode())
            digest.update(b"\0")
    except NotCacheable:
        return None
    return "early-" + digest.hexdigest()


def _recall(key: str) -> Any:
    data = cache_store.read_record(key)
    return data.get("value") if isinstance(data, dict) and data.get("format") == RECORD_FORMAT else None


def _note(key: str, value: Any) -> None:
    cache_store.write_record(key, {"format": RECORD_FORMAT, "value": value})
