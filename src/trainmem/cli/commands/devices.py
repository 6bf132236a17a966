"""`trainmem devices [--search TEXT]`: the devices an estimate can target."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from trainmem.cli.outcome import EXIT_OK, Outcome


def add(commands: Any, add_command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    devices = commands.add_parser("devices", help="list target devices")
    devices.add_argument("--format", choices=["table", "json"], default="table", help="(default: table)")
    devices.add_argument("--search", metavar="TEXT", help="only the devices whose name, alias or product name "
                         "contains TEXT, ignoring case, spaces and dashes (e.g. 3060, 'a100 80gb', mi300x); "
                         "none: one line, exit 2")


def run(args: argparse.Namespace) -> Outcome:
    from trainmem.devices import all_devices, format_table, search_devices

    devices = all_devices() if args.search is None else search_devices(args.search)
    return Outcome(json.dumps([d.listing() for d in devices], indent=2) if args.format == "json"
                   else format_table(devices), EXIT_OK)
