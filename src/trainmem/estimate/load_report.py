"""What the report says of a checkpoint loaded before training (--load): the live bytes at the load's peak and in
training, as the target's allocator charges them, and which is the run's peak. The figures come from the one
replayed stream (the load is its phase "load"), so the run's peak already counts the load; this says which part
holds it."""

from __future__ import annotations

from typing import Any

from trainmem.setup import Load, TrainingSetup
from trainmem.setup.loading import load_words
from trainmem.trace.events import Phase
from trainmem.units import format_bytes


def load_section(setup: TrainingSetup, events: list, allocator: Any, allocated_name: str) -> tuple[dict | None, list[str]]:
    """(the JSON "load" object, the report's line), or (None, []) when no checkpoint is loaded. The allocator's
    figures after every event (a second replay of the same stream, made only with --load) split at the phase."""
    if setup.load == Load.NONE:
        return None, []
    series = allocator.series(events)
    in_load = [event.phase == Phase.LOAD for event in events]
    section = {"code": load_words(setup)}
    for name, values in (("peak_bytes", series.allocated), ("reserved_bytes", series.reserved)):
        if values is not None:
            section["load_" + name] = max((v for v, load in zip(values, in_load) if load), default=0)
            section["training_" + name] = max((v for v, load in zip(values, in_load) if not load), default=0)
    section["peak_in"] = "load" if section["load_peak_bytes"] > section["training_peak_bytes"] else "training"
    line = (f"load (--load {setup.load}): {section['code']}. {allocated_name}: "
            f"{format_bytes(section['load_peak_bytes'])} at most while loading, "
            f"{format_bytes(section['training_peak_bytes'])} in training; the run's peak is in "
            f"{'the load' if section['peak_in'] == 'load' else 'training'} (the load is traced as phase 'load', "
            "before the first step)")
    return section, [line]
