"""--memory-snapshot: the simulated CUDA caching allocator's history, pickled as PyTorch writes it, for memory_viz.

The file holds what `torch.cuda.memory._snapshot()` returns and `_dump_snapshot` pickles, read from the code of
torch 2.13 (torch/csrc/cuda/Module.cpp THCPModule_memorySnapshot, torch/cuda/memory.py _snapshot's docstring):
- "segments": the allocator's state when the recorded history ends (as a real snapshot taken after the steps):
  one dict per cudaMalloc'd segment (or mapped range of an expandable one) with device, address, total_size,
  allocated_size, active_size, requested_size, stream, segment_type, segment_pool_id, is_expandable, frames and
  its blocks (address, size, requested_size, state "active_allocated" / "inactive", frames);
- "device_traces": one list per device of record_trace's entries (action, addr, size, stream, time_us,
  compile_context, user_metadata, frames); "oom" entries carry device_free in place of addr;
- "allocator_settings", and "external_annotations" (START / END of record_function ranges, here the phases).
A real dump (torch 2.11.0+cu130 on an H200: a Linear-ReLU-Linear model, two Adam steps) has exactly these keys;
its trace has no "snapshot" entry at the end, which ours adds (below).
memory_viz (torch/utils/viz/MemoryViz.js) rebuilds every earlier state by walking the trace backwards from the
segments, so the trace kept always ends at the state written.

What we fill in for what a GPU run would record:
- frames: one per entry naming what the trace knows, {"filename": module, "line": 0, "name": "op [category,
  phase]"}; freed blocks carry none (c10 clears context_when_allocated in free_block);
- "category" on alloc entries (our Category), as torch's own _profile_to_snapshot does: MemoryViz.js colours
  and labels the Active Memory Timeline by it;
- time_us is the entry's position in the whole history (the simulation has no clock); compile_context and
  user_metadata are what a run without torch.compile or annotations records ("N/A", "");
- external_annotations mark where each phase of each step starts and ends ("forward (step 0)"), in time_us;
- a last entry "snapshot" (a TraceEntry action c10 defines and memory_viz lists; addr 0, size: the active bytes)
  with category "unknown": MemoryViz.js's annotate_snapshot() adds "unknown" to the categories it found through
  a misspelt `snapshot.categores`, which throws unless "unknown" is there already;
- stream ids are the target's stream numbers (0: the default stream), not cudaStream_t pointers.

memory_viz's Active Memory Timeline sums the alloc entries' sizes, which c10 records as the request's own size
(orig_size), so its peak is the requested-bytes peak (the estimate's tensor_bytes); max_memory_allocated
(allocated_bytes) adds each block's rounding to 512 B, which the trace does not carry.

Estimates on another allocator are refused, each in one line naming it: the snapshot is PyTorch's caching
allocator's segments and blocks; c10's CPU allocator has neither, and TensorFlow's BFC allocator (a Keras model
on a GPU) has its own.
"""

from __future__ import annotations

import pickle
from typing import Any

from trainmem.alloc.cuda_caching import SegmentInfo
from trainmem.alloc.cuda_config import SIZE_MAX, AllocatorConfig, MiB
from trainmem.alloc.replay import CudaAllocator, Recording
from trainmem.errors import TrainmemError, quote
from trainmem.report.memviz_limits import DEFAULT_MAX_ENTRIES

WHERE = "--memory-snapshot"
# MemoryViz.js unpickle() throws "Unhandled version" for a pickle protocol above 4 (torch/utils/viz/MemoryViz.js);
# pickle.dump's default is 4 up to Python 3.13, but 5 from 3.14.
PICKLE_PROTOCOL = 4
SUFFIXES = (".pickle", ".pkl")
NO_FRAMES: list = []  # one shared empty list: pickle writes it once and refers to it after
# what record_trace stores without torch.compile and without record_annotations (seen in a torch 2.11 dump)
UNANNOTATED = {"compile_context": "N/A", "user_metadata": ""}


def write_snapshot(estimate: Any, path: str, max_entries: int | None = DEFAULT_MAX_ENTRIES) -> str:
    """Write the snapshot pickle to `path`; return a one-line note of what was cut ("" if nothing)."""
    if not isinstance(path, str) or not path.lower().endswith(SUFFIXES):
        raise TrainmemError(f"expected a file name ending in {' or '.join(SUFFIXES)}, got {quote(path)}", where=WHERE)
    snapshot, note = build_snapshot(estimate, max_entries)
    try:
        with open(path, "wb") as handle:
            pickle.dump(snapshot, handle, protocol=PICKLE_PROTOCOL)
    except OSError as error:
        raise TrainmemError(f"expected a writable file, got {quote(path)} ({error.strerror})", where=WHERE) from None
    return note


def build_snapshot(estimate: Any, max_entries: int | None = DEFAULT_MAX_ENTRIES) -> tuple[dict, str]:
    """The snapshot dict (builtins only: loading it needs no trainmem) and the note of what was cut."""
    allocator, events = _cuda_input(estimate)
    if max_entries is not None and (isinstance(max_entries, bool) or not isinstance(max_entries, int)
                                    or max_entries < 1):
        raise TrainmemError(f"expected a whole number of at least 1, got {quote(max_entries)}",
                            where="--snapshot-max-entries")
    whole = allocator.record(events, len(events))
    start, stop = _window(whole, max_entries)
    # the segments must be the state where the kept trace ends; when the window stops before the end, the
    # state there comes from a second replay up to the window's last event
    kept = whole if stop == len(whole.entries) else allocator.record(events, whole.owner[stop - 1] + 1)
    assert len(kept.entries) == stop, "the replay up to the window's end recorded a different history"
    snapshot = _snapshot_dict(kept, events, start, stop, allocator.config)
    return snapshot, _note(len(whole.entries), start, stop, whole.oom)


def _cuda_input(estimate: Any) -> tuple[CudaAllocator, tuple]:
    replay = getattr(estimate, "replay_input", None)
    if replay is None:
        raise TrainmemError("expected an estimate with its allocator replay (the snapshot replays its event "
                            "stream), got one without it", where=WHERE)
    if not isinstance(replay.allocator, CudaAllocator):
        raise TrainmemError("expected a GPU --device (a memory snapshot replays PyTorch's CUDA caching "
                            f"allocator), got {estimate.device.name}" + _other_allocator(replay.allocator), where=WHERE)
    return replay.allocator, tuple(replay.events)


def _other_allocator(allocator: Any) -> str:
    """What the estimate replayed instead, where a GPU device has another allocator (Keras on TensorFlow)."""
    named = getattr(allocator, "label", "")
    return f", whose estimate replays {named}" if named else ""


def _window(recording: Recording, max_entries: int | None) -> tuple[int, int]:
    """The kept entries [start, stop): all of them, or max_entries around the allocated peak. The window ends
    after a whole stream event (the segments are the state between two events), and holds the peak."""
    total, owner = len(recording.entries), recording.owner
    if max_entries is None or total <= max_entries:
        return 0, total
    start = max(0, recording.peak_entry - max_entries // 2)
    stop = min(total, start + max_entries)
    if stop < total and owner[stop] == owner[stop - 1]:  # the window would end inside one event's entries
        first = owner.index(owner[stop - 1])
        stop = first if first > recording.peak_entry else _event_end(owner, stop)
    return min(max(0, stop - max_entries), recording.peak_entry), stop


def _event_end(owner: list[int], position: int) -> int:
    """The position just after the last entry of the event that owns entry position - 1."""
    event = owner[position - 1]
    while position < len(owner) and owner[position] == event:
        position += 1
    return position


def _note(total: int, start: int, stop: int, oom: str | None) -> str:
    parts = []
    if oom:
        parts.append(f"the simulated run ran out of memory, so the history ends there with an 'oom' entry: {oom}")
    if (start, stop) != (0, total):
        ends = "" if stop == total else ", the segments are the allocator's state where the kept entries end"
        parts.append(f"kept {stop - start:,} of {total:,} trace entries around the allocated peak: {start:,} cut "
                     f"before, {total - stop:,} cut after (--snapshot-max-entries){ends}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------------- the snapshot dict


class _Frames:
    """One shared frames list per (module, op, category, phase), so the pickle stores each once."""

    def __init__(self, events: tuple) -> None:
        self.events = events
        self.cache: dict[tuple, list] = {}

    def of(self, index: int) -> list:
        event = self.events[index]
        key = (event.module, event.op, str(event.category), str(event.phase))
        if key not in self.cache:
            module, op, category, phase = key
            self.cache[key] = [{"filename": module or "(model)", "line": 0, "name": f"{op} [{category}, {phase}]"}]
        return self.cache[key]


def _snapshot_dict(recording: Recording, events: tuple, start: int, stop: int, config: AllocatorConfig) -> dict:
    frames = _Frames(events)
    created = {}  # segment address -> frames of the event that cudaMalloc'd or mapped it
    for (action, addr, _size, _stream), owner in zip(recording.entries[:stop], recording.owner[:stop]):
        if action in ("segment_alloc", "segment_map"):
            created[addr] = frames.of(owner)
    state = recording.allocator.snapshot()
    trace = [_trace_entry(recording.entries[i], i, frames.of(recording.owner[i]), events[recording.owner[i]])
             for i in range(start, stop)]
    active = sum(block.size for seg in state for block in seg.blocks if block.state == "active_allocated")
    # the "snapshot" entry with the category "unknown" that MemoryViz.js needs once any entry has a category
    trace.append({"action": "snapshot", "addr": 0, "size": active, "stream": 0, "time_us": stop, **UNANNOTATED,
                  "frames": NO_FRAMES, "category": "unknown"})
    segments = [_segment_dict(seg, created, frames, recording.alloc_event) for seg in state]
    annotations = _phase_annotations([events[i] for i in recording.owner[start:stop]], start)
    return {"segments": segments, "device_traces": [trace], "allocator_settings": _settings(config),
            "external_annotations": annotations}


def _phase_annotations(owners: list, start: int) -> list[dict]:
    """START / END pairs, as record_function ranges appear in external_annotations, around each run of entries
    of one phase of one step."""
    out: list[dict] = []
    for offset, event in enumerate(owners):
        name = f"{event.phase} (step {event.step})"
        if not out or out[-1]["name"] != name:
            if out:
                out.append({**out[-1], "stage": "END", "time_us": start + offset - 1})
            out.append({"stage": "START", "name": name, "device": 0, "time_us": start + offset})
    if out:
        out.append({**out[-1], "stage": "END", "time_us": start + len(owners) - 1})
    return out


def _trace_entry(entry: tuple[str, int, int, int], position: int, frames: list, event: Any) -> dict:
    action, addr, size, stream = entry
    out = {"action": action, ("device_free" if action == "oom" else "addr"): addr, "size": size, "stream": stream,
           "time_us": position, **UNANNOTATED, "frames": frames}
    if action == "alloc":
        out["category"] = str(event.category)
    return out


def _segment_dict(seg: SegmentInfo, created: dict, frames: _Frames, alloc_event: dict) -> dict:
    blocks = []
    for block in seg.blocks:
        live = block.state == "active_allocated"
        blocks.append({"address": block.address, "size": block.size, "requested_size": block.requested_size,
                       "state": block.state, "frames": frames.of(alloc_event[block.key]) if live else NO_FRAMES})
    return {"device": 0, "address": seg.address, "total_size": seg.total_size, "allocated_size": seg.allocated_size,
            # active_size: allocated plus blocks awaiting a cross-stream free, which this model never holds
            "active_size": seg.allocated_size, "requested_size": seg.requested_size, "stream": seg.stream,
            "segment_type": seg.segment_type, "segment_pool_id": (0, 0),  # (0, 0): the default pool, no MemPool
            "is_expandable": seg.is_expandable, "frames": created.get(seg.address, NO_FRAMES), "blocks": blocks}


def _settings(config: AllocatorConfig) -> dict:
    """allocator_settings as THCPModule_memorySnapshot writes them from CUDAAllocatorConfig; the host (pinned)
    settings, which this model does not read, are c10's defaults (c10/cuda/CUDAAllocatorConfig.h:
    m_pinned_num_register_threads{1}, m_release_lock_on_cudamalloc{false}, m_pinned_use_cuda_host_register{false})."""
    divisions = {str(1 << i): d for i, d in enumerate(config.roundup_power2_divisions)}  # keys 1, 2, 4 … (MiB)
    return {"PYTORCH_CUDA_ALLOC_CONF": alloc_conf_string(config),
            "max_split_size": -1 if config.max_split_size == SIZE_MAX else config.max_split_size,  # int64_t(SIZE_MAX)
            "garbage_collection_threshold": config.garbage_collection_threshold,
            "expandable_segments": config.expandable_segments, "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False,
            "graph_capture_record_stream_reuse": False,  # m_graph_capture_record_stream_reuse{false}
            "roundup_power2_divisions": divisions}


def alloc_conf_string(config: AllocatorConfig) -> str:
    """The settings that differ from the defaults, written back as PYTORCH_CUDA_ALLOC_CONF (c10 keeps the text the
    user gave; the estimate keeps only the parsed values, so this is their canonical spelling)."""
    default, parts = AllocatorConfig(), []
    if config.max_split_size != default.max_split_size:
        parts.append(f"max_split_size_mb:{config.max_split_size // MiB}")
    if config.large_segment_size != default.large_segment_size:
        parts.append(f"large_segment_size_mb:{config.large_segment_size // MiB}")
    if config.max_non_split_rounding_size != config.large_segment_size:
        parts.append(f"max_non_split_rounding_mb:{config.max_non_split_rounding_size // MiB}")
    if config.roundup_power2_divisions != default.roundup_power2_divisions:
        steps = ",".join(f"{1 << i}:{d}" for i, d in enumerate(config.roundup_power2_divisions))
        parts.append(f"roundup_power2_divisions:[{steps}]")
    if config.garbage_collection_threshold:
        parts.append(f"garbage_collection_threshold:{config.garbage_collection_threshold}")
    if config.expandable_segments:
        parts.append("expandable_segments:True")
    if config.per_process_memory_fraction != 1.0:
        parts.append(f"per_process_memory_fraction:{config.per_process_memory_fraction}")
    return ",".join(parts)
