"""Turn a traced run into an Estimate for a device: target stream → allocator replay → report facts."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from trainmem.alloc import small_objects
from trainmem.alloc.cpu import aligned, replay_actions, replay_tensors
from trainmem.devices import Device
from trainmem.estimate import Estimate
from trainmem.baselines import baselines
from trainmem.explain import explain
from trainmem.setup import TrainingSetup
from trainmem.targets import cpu as cpu_target
from trainmem.targets import cpu_runtime
from trainmem.targets.cpu_info import CpuInfo
from trainmem.trace.events import Category, Phase


def assemble(source, setup: TrainingSetup, device: Device, traced, depth: int) -> Estimate:
    cpu = CpuInfo.this_machine()
    capability = cpu.capability
    stream, fired = cpu_target.device_stream(traced.trace, cpu)
    tensors = replay_tensors(stream)
    breakdown = {str(c): 0 for c in Category}
    for event in tensors.live_at_peak.values():
        breakdown[str(event.category)] += event.nbytes
    breakdown[str(Category.RUNTIME)] += tensors.peak_bytes - sum(breakdown.values())  # 64-byte alignment slack
    # peft imports transformers itself, so LoRA brings both into the process
    libraries = frozenset(source.libraries) | ({"peft", "transformers"} if setup.lora_spec() else set())
    runtime = cpu_runtime.runtime_floor(traced.op_counts, libraries)
    heap = heap_replay(stream, runtime.parts)
    process_parts = {**runtime.parts, "tensor_heap_resident": heap["resident"]}
    peak_event = stream[tensors.peak_index]
    warnings = list(traced.warnings) + runtime.assumptions + heap["assumptions"] + [
        f"CPU kernel rule '{rule}' applied ×{count} (buffers below the dispatcher, {capability})"
        for rule, count in sorted(fired.items())]
    if traced.checkpointed:
        warnings.append(f"activation checkpointing wraps {len(traced.checkpointed)} blocks: "
                        f"{', '.join(traced.checkpointed[:6])}{' …' if len(traced.checkpointed) > 6 else ''}")
    return Estimate(
        model_name=source.name, setup=setup, device=device, parameters=traced.parameters,
        trainable_parameters=traced.trainable_parameters, tensor_bytes=tensors.peak_bytes,
        process_bytes=sum(process_parts.values()),
        process_high=heap["high"],
        breakdown=breakdown, peak_phase=str(peak_event.phase),
        peak_module=peak_event.module, peak_op=peak_event.op, peak_step=peak_event.step,
        modules=module_table(traced, tensors.live_at_peak, depth), warnings=warnings,
        explanation=explain(traced, setup, breakdown), process_parts=process_parts,
        baselines=baselines(traced, setup, tensors.peak_bytes, "tensor peak"),
        coverage={"ops": dict(traced.op_counts), "kernel_rules": fired, "capability": capability,
                  "threads": cpu.threads})


def heap_replay(stream, runtime_parts: dict[str, int]) -> dict:
    """glibc's resident heap for the tensor stream with the runtime's small objects interleaved
    (alloc/small_objects.py), and the process's high figure: the larger of that replay with every freed
    chunk pinned and the expected process plus the run-to-run spread measured on the calibration models."""
    interleaved = small_objects.interleave(stream)
    resident = replay_actions(interleaved.actions)
    pinned = replay_actions(interleaved.actions, pinned=True)
    table = small_objects.load_table()
    source, spread = table["source"], table["spread"]
    floor = sum(runtime_parts.values())
    high = max(floor + pinned, int((floor + resident) * (1 + spread["above_median"])))
    assumptions = [f"peak RSS replays the tensor allocations with {interleaved.objects:,} runtime small objects "
                   "(TensorImpls, autograd nodes, oneDNN descriptors) interleaved as malloc logs of real runs show "
                   f"(targets/data/cpu_small_objects.json, torch {source['torch']}, {source['date']}); they pin "
                   "freed tensor chunks inside glibc's heap",
                   f"where the objects fall changes from run to run: process_bytes_high {high / 2**20:.0f} MiB is the "
                   f"larger of the process with every freed heap chunk pinned (heap {pinned / 2**20:.0f} MiB against "
                   f"{resident / 2**20:.0f} MiB expected) and the expected process plus the largest run-to-run spread "
                   f"above the median measured on the calibration models (+{spread['above_median']:.1%}, "
                   "targets/data/cpu_small_objects.json 'spread')"]
    if interleaved.defaulted_ops:
        ops = sorted(interleaved.defaulted_ops, key=lambda k: -interleaved.defaulted_ops[k])
        assumptions.append(f"no small-object row for {len(ops)} op kinds ({', '.join(ops[:5])}"
                           f"{' …' if len(ops) > 5 else ''}): their phase's average is used")
    return {"resident": resident, "high": high, "assumptions": assumptions}


def _prefix(name: str, depth: int) -> str:
    return ".".join(name.split(".")[:depth]) if name else ""


def module_table(traced, live_at_peak: dict, depth: int) -> list[dict[str, Any]]:
    """Per module (to `depth`): parameters, activations saved for backward in the last step, and
    the bytes it owns at the peak."""
    rows: dict[str, dict[str, int]] = defaultdict(lambda: {"parameters": 0, "activation_bytes": 0, "bytes_at_peak": 0})
    for name, count in traced.module_parameters.items():
        rows[_prefix(name, depth)]["parameters"] += count
    last = max((r.step for r in traced.trace.storages.values()), default=0)
    for record in traced.trace.storages.values():
        if record.category == Category.ACTIVATIONS and record.step == last and record.phase == Phase.FORWARD:
            rows[_prefix(record.module, depth)]["activation_bytes"] += record.nbytes
    for key, event in live_at_peak.items():
        owner = traced.trace.storages[key].module if key >= 0 else event.module  # kernel buffers: the running module
        rows[_prefix(owner, depth)]["bytes_at_peak"] += aligned(event.nbytes)
    return [{"module": name or "(model)", **values} for name, values in sorted(rows.items())]
