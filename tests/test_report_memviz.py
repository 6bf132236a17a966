"""--memory-snapshot (report/memviz.py): the pickle loads with plain pickle, PyTorch's own torch.cuda._memory_viz
helpers read it, and the peaks memory_viz computes from it are ours.

memory_viz's views are drawn by torch/utils/viz/MemoryViz.js in the browser; the Python helpers (trace_plot,
segment_plot) only embed the pickle in a page. So this file also walks the trace as MemoryViz.js does:
- annotate_snapshot: a free_requested followed by free_completed of the same address becomes one "free";
- process_alloc_data: the Active Memory Timeline adds each alloc's size and takes it away at its free; blocks
  alive in the segments whose alloc is not in the trace start allocated; its max_size is the plot's peak.
  With plot_segments (Active Cached Segment Timeline) the same over segment_alloc / segment_free;
- MemoryView.simulate_memory: the Allocator State History rebuilds the state before each entry by undoing the
  entries after it, starting from the segments; drawing it looks up the segment of every live block (it throws
  when there is none), and undoing a free_requested or a segment_map needs the block / segment it names.
"""

from __future__ import annotations

import json
import pickle
import pickletools

import pytest

from trainmem import estimate
from trainmem.alloc.cuda_caching import replay as cuda_replay
from trainmem.errors import TrainmemError
from trainmem.report.memviz import PICKLE_PROTOCOL, build_snapshot, write_snapshot
from trainmem.setup.target_options import TargetOptions

_memory_viz = pytest.importorskip("torch.cuda._memory_viz")

MLP = dict(device="a100-40gb", batch_size=8, input_shape="1024", optimizer="adam")
# the opcodes MemoryViz.js's unpickle() handles (torch/utils/viz/MemoryViz.js); any other throws "UNKNOWN OPCODE"
VIEWER_OPCODES = {"PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET", "BININT",
                  "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET", "MARK", "MEMOIZE",
                  "BINPUT", "LONG_BINPUT", "SETITEMS", "SETITEM", "DICT", "SHORT_BINUNICODE", "BINUNICODE", "STOP",
                  "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "BINFLOAT"}
# the keys of a real torch.cuda.memory._dump_snapshot: torch 2.11.0+cu130 on an H200, Linear(1024, 1024)-ReLU-
# Linear(1024, 10), batch 8, two Adam steps after _record_memory_history(max_entries=100000), plain and with
# expandable_segments:True. On those dumps the walkers below gave torch's own memory_stats(): timeline peak =
# requested_bytes.all.peak = 89,387,212 B (allocated peak 89,390,080), cached-segment timeline and walk-back
# maximum = reserved peak = 90,177,536 B (expandable: walk-back 106,954,752 B = its reserved peak)
REAL_KEYS = {
    "top": {"allocator_settings", "device_traces", "external_annotations", "segments"},
    "segment": {"active_size", "address", "allocated_size", "blocks", "device", "frames", "is_expandable",
                "requested_size", "segment_pool_id", "segment_type", "stream", "total_size"},
    "block": {"address", "frames", "requested_size", "size", "state"},
    "entry": {"action", "addr", "compile_context", "frames", "size", "stream", "time_us", "user_metadata"},
    "frame": {"filename", "line", "name"},
    "settings": {"PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold", "expandable_segments",
                 "pinned_num_register_threads", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                 "graph_capture_record_stream_reuse", "roundup_power2_divisions"},
    "annotation": {"stage", "name", "device", "time_us"},
}
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 128,
              "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256}


@pytest.fixture(scope="module")
def mlp():
    return estimate("mlp:1024-1024-10", **MLP)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("tiny_llama")
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return estimate(f"hf:{folder}", device="a100-40gb", batch_size=2, seq_len=32,
                    target_options=TargetOptions(alloc_conf="expandable_segments:True"))


def _written(est, tmp_path, max_entries=None):
    path = tmp_path / "snapshot.pickle"
    note = write_snapshot(est, str(path), max_entries)
    data = path.read_bytes()
    assert data[:2] == bytes([0x80, PICKLE_PROTOCOL]) and PICKLE_PROTOCOL <= 4  # MemoryViz.js reads protocols 2-4
    assert {op.name for op, _, _ in pickletools.genops(data)} <= VIEWER_OPCODES
    with open(path, "rb") as handle:
        return pickle.load(handle), note


def _entries(snapshot):
    """annotate_snapshot's elision of free_requested + free_completed into one "free"."""
    out = []
    for entry in snapshot["device_traces"][0]:
        previous = out[-1] if out else None
        if (entry["action"] == "free_completed" and previous and previous["action"] == "free_requested"
                and previous["addr"] == entry["addr"]):
            out[-1] = {**previous, "action": "free"}
            continue
        out.append(entry)
    return out


def _timeline_peak(snapshot, plot_segments=False):
    """process_alloc_data's max_size: the peak of the Active Memory (or Cached Segment) Timeline."""
    alloc, frees = ("segment_alloc", {"segment_free"}) if plot_segments else ("alloc", {"free", "free_completed"})
    elements, actions, initially, addr_to_alloc = [], [], [], {}
    for entry in _entries(snapshot):
        if entry["action"] == alloc:
            elements.append(entry)
            addr_to_alloc[entry["addr"]] = len(elements) - 1
            actions.append(len(elements) - 1)
        elif entry["action"] in frees:
            if entry["addr"] in addr_to_alloc:
                actions.append(addr_to_alloc.pop(entry["addr"]))
            else:
                elements.append(entry)
                initially.append(len(elements) - 1)
                actions.append(len(elements) - 1)
    for seg in snapshot["segments"]:
        if plot_segments and seg["address"] not in addr_to_alloc:
            elements.append({"size": seg["total_size"]})
            initially.append(len(elements) - 1)
        for block in () if plot_segments else seg["blocks"]:
            if block["state"] == "active_allocated" and block["address"] not in addr_to_alloc:
                elements.append({"size": block["requested_size"]})
                initially.append(len(elements) - 1)
    if not actions and initially:  # nothing happens in the trace: one element is drawn as its only action
        actions.append(initially.pop())
    live, total, peak = set(initially), sum(elements[i]["size"] for i in initially), 0
    for element in actions:  # the first action on an element adds it, the second takes it away
        if element in live:
            live.discard(element)
            total -= elements[element]["size"]
        else:
            live.add(element)
            total += elements[element]["size"]
        peak = max(peak, total)
    return peak


def _walk_back(snapshot):
    """simulate_memory for every entry, from the last back to the first; returns the (reserved, requested)
    bytes the Allocator State History shows at each, and fails where MemoryViz.js would throw."""
    segments = {seg["address"]: seg["total_size"] for seg in snapshot["segments"]}
    blocks = {b["address"]: b["requested_size"] for seg in snapshot["segments"] for b in seg["blocks"]
              if b["state"] == "active_allocated"}
    shown = []
    for entry in reversed(_entries(snapshot)):
        action, addr = entry["action"], entry.get("addr")
        if action in ("free", "free_completed"):
            blocks[addr] = entry["size"]
        elif action == "free_requested":
            assert addr in blocks, f"undoing {entry}: no block at {addr}"
        elif action == "alloc":
            blocks.pop(addr, None)
        elif action in ("segment_free", "segment_unmap"):
            segments = _map(segments, addr, entry["size"], merge=action == "segment_unmap")
        elif action in ("segment_alloc", "segment_map"):
            segments = _unmap(segments, addr, entry["size"], entry, merge=action == "segment_map")
        for block in blocks:  # draw(): every live block lies in a segment
            assert any(start <= block < start + size for start, size in segments.items()), f"block {block} unmapped"
        shown.append((sum(segments.values()), sum(blocks.values())))
    return shown


def _map(segments, addr, size, merge):
    """map_segment: a freed segment comes back as it was; an unmapped range joins its mapped neighbours."""
    out = dict(segments)
    before = next((start for start, length in out.items() if start + length == addr), None)
    if merge and before is not None:
        addr, size = before, out.pop(before) + size
    if merge and addr + size in out:
        size += out.pop(addr + size)
    out[addr] = size
    return out


def _unmap(segments, addr, size, entry, merge):
    """unmap_segment: a cudaMalloc'd segment is found by its address; a mapped range must lie inside a known
    segment (MemoryViz.js reads `existing.addr` of it, and splices the wrong one when an address is unknown)."""
    owner = [s for s, length in segments.items() if (s <= addr and addr + size <= s + length if merge else s == addr)]
    assert owner, f"undoing {entry}: no segment holds it"
    out, start = dict(segments), owner[0]
    length = out.pop(start)
    if addr > start:
        out[start] = addr - start
    if addr + size < start + length:
        out[addr + size] = start + length - addr - size
    return out


def _torch_helpers(snapshot):
    """torch.cuda._memory_viz's own helpers, pure Python; the flamegraph script is not fetched (identity)."""
    for plot in (_memory_viz.trace_plot, _memory_viz.segment_plot):
        page = plot(snapshot)
        assert "snapshot.pickle" in page and "add_local_files" in page
    assert _memory_viz.trace_plot(snapshot, plot_segments=True)
    summary = _memory_viz.segsum(snapshot)  # checks that each segment's blocks add up to its size
    assert f"segments: {len(snapshot['segments'])}" in summary
    assert _memory_viz.trace(snapshot).startswith("Device 0")
    for view in (_memory_viz.memory, _memory_viz.segments):
        assert view(snapshot, format_flamegraph=lambda lines: lines)


def _check_keys(snapshot):
    """The keys of a real dump; ours add "category" to alloc entries and to the trailing snapshot entry."""
    assert set(snapshot) == REAL_KEYS["top"] and set(snapshot["allocator_settings"]) == REAL_KEYS["settings"]
    assert all(set(seg) == REAL_KEYS["segment"] for seg in snapshot["segments"])
    assert all(set(b) == REAL_KEYS["block"] for seg in snapshot["segments"] for b in seg["blocks"])
    for entry in snapshot["device_traces"][0]:
        keys = set(entry) - ({"category"} if entry["action"] in ("alloc", "snapshot") else set())
        expected = REAL_KEYS["entry"] - {"addr"} | {"device_free"} if entry["action"] == "oom" else REAL_KEYS["entry"]
        assert keys == expected, entry
        assert all(set(frame) == REAL_KEYS["frame"] for frame in entry["frames"])
    assert all(set(a) == REAL_KEYS["annotation"] for a in snapshot["external_annotations"])


def test_mlp_snapshot_is_read_by_memory_viz_and_peaks_match(mlp, tmp_path):
    snapshot, note = _written(mlp, tmp_path)
    assert note == ""
    _check_keys(snapshot)
    stages = [(a["stage"], a["name"]) for a in snapshot["external_annotations"]]
    assert ("START", "forward (step 0)") in stages and ("END", "optimizer (step 0)") in stages
    _torch_helpers(snapshot)
    # the Active Memory Timeline's peak: requested bytes (c10 records each alloc's orig_size)
    assert _timeline_peak(snapshot) == mlp.tensor_bytes
    assert _timeline_peak(snapshot, plot_segments=True) == mlp.reserved_bytes
    shown = _walk_back(snapshot)
    assert max(reserved for reserved, _ in shown) == mlp.reserved_bytes
    assert max(requested for _, requested in shown) == mlp.tensor_bytes
    # the allocated peak (max_memory_allocated): block sizes, which the trace's sizes are not; at the end
    # state the segments carry them, and the last entry is the snapshot's own
    last = snapshot["device_traces"][0][-1]
    assert last["action"] == "snapshot" and last["size"] <= mlp.allocated_bytes
    frames = [e["frames"][0] for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    assert {"filename": "(model)", "line": 0, "name": "empty_like [parameters, init]"} in frames
    assert {e["category"] for e in snapshot["device_traces"][0] if "category" in e} >= {"activations", "unknown"}


def test_cut_keeps_the_peak_and_a_consistent_state(mlp, tmp_path):
    whole, _ = build_snapshot(mlp, None)
    snapshot, note = _written(mlp, tmp_path, max_entries=20)
    total = len(whole["device_traces"][0]) - 1  # less the trailing snapshot entry
    assert note.startswith(f"kept 20 of {total:,} trace entries around the allocated peak: ")
    kept = snapshot["device_traces"][0]
    assert len(kept) == 21 and kept[-1]["action"] == "snapshot"
    _torch_helpers(snapshot)
    _walk_back(snapshot)
    # the window holds the peak: the timeline over it reaches the whole run's requested peak
    assert _timeline_peak(snapshot) == mlp.tensor_bytes


def test_expandable_segments_map_and_walk_back(llama, tmp_path):
    snapshot, note = _written(llama, tmp_path)
    actions = {e["action"] for e in snapshot["device_traces"][0]}
    assert "segment_map" in actions and "segment_alloc" not in actions
    _check_keys(snapshot)
    assert snapshot["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert all(seg["is_expandable"] for seg in snapshot["segments"])
    _torch_helpers(snapshot)
    assert _timeline_peak(snapshot) == llama.tensor_bytes
    assert max(reserved for reserved, _ in _walk_back(snapshot)) == llama.reserved_bytes


def test_fsdp_rank_on_three_streams(tmp_path):
    """A distributed estimate's snapshot is its most loaded rank's, with FSDP's all-gather and reduce-scatter
    streams as the blocks' streams (their own pools, as in the caching allocator)."""
    est = estimate("mlp:256-512-512-512-10", device="h200", strategy="fsdp", world_size=2, batch_size=4,
                   input_shape="256")
    snapshot, _ = _written(est, tmp_path)
    assert {entry["stream"] for entry in snapshot["device_traces"][0]} == {0, 1, 2}
    _check_keys(snapshot)
    _torch_helpers(snapshot)
    _walk_back(snapshot)
    assert _timeline_peak(snapshot) == est.tensor_bytes
    assert _timeline_peak(snapshot, plot_segments=True) == est.reserved_bytes


@pytest.mark.parametrize("name", ["mlp", "llama"])
def test_recording_history_changes_nothing(name, request):
    """The history hook only appends: stats and segments are those of a replay without it, and the history's
    segment entries add up to what the allocator holds."""
    replay = request.getfixturevalue(name).replay_input
    config, capacity = replay.allocator.config, replay.allocator.capacity
    plain = cuda_replay(replay.events, config, capacity)
    history: list = []
    recorded = cuda_replay(replay.events, config, capacity, history=history)
    assert recorded.memory_stats() == plain.memory_stats() and recorded.snapshot() == plain.snapshot()
    grows = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    assert sum(grows.get(action, 0) * size for action, _, size, _ in history) == plain.reserved_bytes
    requested = {"alloc": 1, "free_completed": -1}
    assert sum(requested.get(action, 0) * size for action, _, size, _ in history) == \
        plain.stats["requested_bytes"]["all"].current


def test_out_of_memory_ends_the_history_with_an_oom_entry(tmp_path):
    """A run that does not fit stops at the failing request, as a snapshot dumped from an OOM observer does."""
    est = estimate("mlp:32768-32768-32768", device="t4", batch_size=8, input_shape="32768", optimizer="adam")
    assert not est.fits
    snapshot, note = _written(est, tmp_path)
    assert note.startswith("the simulated run ran out of memory") and "(at backward, op mm)" in note
    _check_keys(snapshot)
    oom, last = snapshot["device_traces"][0][-2:]
    assert oom["action"] == "oom" and last["action"] == "snapshot"
    reserved = sum(seg["total_size"] for seg in snapshot["segments"])
    assert oom["device_free"] + reserved == est.replay_input.allocator.capacity
    _torch_helpers(snapshot)
    _walk_back(snapshot)
    assert _timeline_peak(snapshot) < est.tensor_bytes  # the whole run's figures come from a card large enough


def test_cpu_estimates_and_bad_paths_are_refused(tmp_path):
    cpu = estimate("mlp:64-64", batch_size=2, input_shape="64")
    with pytest.raises(TrainmemError, match="expected a GPU --device .*, got cpu"):
        write_snapshot(cpu, str(tmp_path / "s.pickle"))
    gpu = estimate("mlp:64-64", device="a100-40gb", batch_size=2, input_shape="64")
    with pytest.raises(TrainmemError, match="ending in .pickle or .pkl"):
        write_snapshot(gpu, str(tmp_path / "s.json"))
    with pytest.raises(TrainmemError, match="expected a writable file"):
        write_snapshot(gpu, str(tmp_path / "missing" / "s.pickle"))
    with pytest.raises(TrainmemError, match="at least 1, got 0"):
        write_snapshot(gpu, str(tmp_path / "s.pickle"), 0)
