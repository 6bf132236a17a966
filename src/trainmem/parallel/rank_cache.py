"""One rank's trace kept in the trace cache (trace/cache_store.py), as a single process's is (trace/run.py), so a
layout asked again (an estimate with --strategy run twice, a `plan` run again after its --time-limit, with another
--margin or --top) reads its ranks' traces instead of tracing them.

The key is the single-process key of the model as every rank builds it (trace/cache_key.py: the model on meta, its
code, the setup with its parallel layout, the target, the versions) and the role traced (its rank, the ranks it
stands for, its pipeline stage and data-parallel indices): within one layout, a rank's trace depends on no more.
"""

from __future__ import annotations

import hashlib
from typing import Any

from trainmem.trace import cache_store
from trainmem.trace.cache_codec import NotCacheable
from trainmem.trace.cache_store import CacheUse


def rank_key(model: Any, make_batch: Any, loss_fn: Any, source: Any, setup: Any, role: Any,
             kernel_ops: frozenset[str], semantics: Any) -> tuple[str | None, CacheUse | None]:
    """The rank's key, or None and why not (the cache off, a model the key cannot describe)."""
    if not cache_store.enabled():
        return None, CacheUse("off")
    from trainmem.trace.cache_key import trace_key

    try:
        run = trace_key(model, make_batch, loss_fn, source, setup, kernel_ops, semantics)
    except NotCacheable as why:
        return None, CacheUse("not cached", str(why))
    described = (run, "rank", role.rank, tuple(role.ranks), role.pp_index, tuple(role.dp_indices))
    return hashlib.sha256(repr(described).encode()).hexdigest(), None
