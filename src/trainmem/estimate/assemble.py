"""The one assembler: a traced run and a target → the target's stream → one allocator replay → the
Estimate. What differs between devices is asked of the target (targets/__init__.py Target)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from trainmem.alloc.replay import ReplayResult, breakdown_at_peak
from trainmem.baselines import baselines
from trainmem.devices import Device
from trainmem.estimate.load_report import load_section
from trainmem.estimate.result import AllocatorSummary, Estimate, ModuleRow, ReplayInput
from trainmem.explain import explain
from trainmem.setup import TrainingSetup
from trainmem.setup.presets import said as torch_version_said
from trainmem.targets import Target
from trainmem.trace.events import Category, Phase


def assemble(source: Any, setup: TrainingSetup, device: Device, target: Target, traced: Any, depth: int) -> Estimate:
    stream = target.device_stream(traced.trace)
    allocator = target.allocator()
    replayed = allocator.replay(stream.events)
    breakdown = breakdown_at_peak(replayed, allocator.charged)
    process = target.process_memory(source, setup, traced, stream, replayed)
    peak_event = stream.events[replayed.peak_index]
    settings = target.allocator_settings()
    own = process.framework  # a target of another framework reports some rows in its own terms
    load, load_lines = load_section(setup, stream.events, allocator, target.allocated_name)
    return Estimate(
        model_name=source.name, setup=setup, device=device,
        # the model's own parameter count, LoRA's adapters beside it (as a model card counts)
        parameters=traced.parameters - traced.adapter_parameters, trainable_parameters=traced.trainable_parameters,
        tensor_bytes=own.tensor_bytes if own else replayed.tensor_peak, process_bytes=sum(process.parts.values()),
        breakdown=breakdown, peak_phase=str(peak_event.phase), peak_module=peak_event.module, peak_op=peak_event.op,
        peak_step=peak_event.step,
        modules=own.modules if own else module_table(traced, replayed.live, depth, target.module_rounding),
        warnings=tuple(process.leading_warnings + list(traced.warnings) + process.warnings
                       + _checkpointing(traced.checkpointed, target.checkpoint_lists_blocks)
                       + torch_version_said(setup) + load_lines),
        explanation=own.explanation if own else explain(traced, setup, breakdown, target.runtime_words),
        process_parts=process.parts,
        coverage=own.coverage if own else {"ops": dict(sorted(traced.op_counts.items())), "kernel_rules": stream.rules,
                                           **process.coverage},
        allocated_bytes=replayed.allocated if replayed.reserved is not None else None,
        reserved_bytes=replayed.reserved,
        allocator=allocator_summary(replayed, settings) if settings is not None else None,
        fits_override=None if replayed.out_of_memory is None else False,
        baselines=() if own else baselines(traced, setup, replayed.allocated, target.allocated_name),
        process_bytes_high=process.high, quantized_parameters=traced.quantized_parameters,
        adapter_parameters=traced.adapter_parameters, quantized_storage_bytes=traced.quantized_storage_bytes,
        resolved=traced.resolved,
        replay_input=ReplayInput(tuple(stream.events), allocator, device.capacity_bytes),
        framework=own.section if own else None, trace_cache=getattr(traced, "cache_use", None), load=load)


def allocator_summary(replayed: ReplayResult, settings: str) -> AllocatorSummary:
    segments = replayed.segments
    return AllocatorSummary(
        replayed.fragmentation.at_allocated_peak, replayed.fragmentation.at_reserved_peak, segments.segments,
        segments.large_bytes, segments.small_bytes, settings, replayed.out_of_memory)


def _checkpointing(checkpointed: list[str], lists_blocks: bool) -> list[str]:
    if not checkpointed:
        return []
    line = f"activation checkpointing wraps {len(checkpointed)} blocks"
    if lists_blocks:
        line += f": {', '.join(checkpointed[:6])}{' …' if len(checkpointed) > 6 else ''}"
    return [line]


def _prefix(name: str, depth: int) -> str:
    return ".".join(name.split(".")[:depth]) if name else ""


def module_table(traced, live_at_peak: dict, depth: int, rounding) -> tuple[ModuleRow, ...]:
    """Per module (to `depth`): parameters, activations saved for backward in the last step, and
    the bytes it owns at the peak (each live block at the target's `rounding`)."""
    rows: dict[str, dict[str, int]] = defaultdict(lambda: {"parameters": 0, "activation_bytes": 0, "bytes_at_peak": 0})
    for name, count in traced.module_parameters.items():
        rows[_prefix(name, depth)]["parameters"] += count
    last = max((r.step for r in traced.trace.storages.values()), default=0)
    for record in traced.trace.storages.values():
        if record.category == Category.ACTIVATIONS and record.step == last and record.phase == Phase.FORWARD:
            rows[_prefix(record.module, depth)]["activation_bytes"] += record.nbytes
    for key, event in live_at_peak.items():
        owner = traced.trace.storages[key].module if key >= 0 else event.module  # kernel buffers: the running module
        rows[_prefix(owner, depth)]["bytes_at_peak"] += rounding(event.nbytes)
    return tuple(ModuleRow(name or "(model)", **values) for name, values in sorted(rows.items()))
