"""`trainmem cache [info|clear]`: the traces kept so that a repeated question is not traced again
(trace/cache_store.py). No torch: it reads and removes files."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from trainmem.cli.outcome import EXIT_OK, Outcome


def add(commands: Any, add_command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    cache = commands.add_parser("cache", help="list or clear the traces kept for repeated questions")
    cache.add_argument("action", nargs="?", choices=["info", "clear"], default="info",
                       help="info: where the traces are, how many and their size; clear: remove them (default: info)")
    cache.add_argument("--format", choices=["text", "json"], default="text", help="(default: text)")


def run(args: argparse.Namespace) -> Outcome:
    from trainmem.trace import cache_store
    from trainmem.units import format_bytes

    facts = cache_store.clear() if args.action == "clear" else cache_store.summary()
    if args.format == "json":
        return Outcome(json.dumps({"action": args.action, **facts}, indent=2), EXIT_OK)
    held = (f"{facts['traces']:,} traces and {facts['results']:,} results replayed from them, "
            f"{format_bytes(facts['bytes'])} in {facts['directory']}")
    if args.action == "clear":
        return Outcome(f"removed {held}", EXIT_OK)
    return Outcome(f"{held} (kept to {format_bytes(facts['limit_bytes'])}, least recently used first out; "
                   "`trainmem cache clear` removes them, --no-cache skips them for one command)", EXIT_OK)
