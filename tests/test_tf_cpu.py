"""targets/tf/cpu_process.py: the TensorFlow CPU process model's arithmetic, checked by hand on small traces."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainmem.setup import TrainingSetup
from trainmem.targets.tf import cpu_process as tf_cpu
from trainmem.trace.events import Category, Event, Phase, StorageRecord, Trace

pytestmark = pytest.mark.tf  # Keras or TensorFlow: left out of `make check`, run by `make test`

MIB = 2**20
FLOOR = {"import_anon_bytes": 190 * MIB, "import_file_bytes": 330 * MIB, "import_file_min": 320 * MIB,
         "import_file_max": 345 * MIB, "fit_machinery_bytes": 30 * MIB, "per_op_bytes": 4096,
         "setup_factor": 3.0, "train_factor": 2.0, "setup_base_bytes": 5 * MIB, "batches_held": 2.0, "tensorflow": "2.21.0", "keras": "3.15.1",
         "cpu_model": "test CPU", "nproc": 2, "onednn": False, "inter_op_threads": 0}


def _trace(allocs: list[tuple[int, int, Category]], frees: list[int]) -> Trace:
    """Allocations (sid, bytes, category) in order, then frees of the given sids in order."""
    trace = Trace()
    for sid, nbytes, category in allocs:
        phase = Phase.INPUTS if category == Category.INPUTS else Phase.FORWARD
        trace.storages[sid] = StorageRecord(sid, nbytes, category, phase, "layer", "Op", 0)
        trace.events.append(Event(len(trace.events), "alloc", nbytes, sid, phase, "layer", "Op", 0))
    for sid in frees:
        record = trace.storages[sid]
        trace.events.append(Event(len(trace.events), "free", record.nbytes, sid, record.phase, "layer", "Op", 0))
    return trace


def _traced(trace: Trace, ops: int = 100):
    return SimpleNamespace(trace=trace, op_counts={"MatMul": ops}, input_bytes=0, framework=SimpleNamespace(function_ops=0))


def test_parts_by_hand():
    # a batch of 1 MiB over 2 steps: the dataset is 2 MiB, held twice while training, 3 times at set-up;
    # tf.data holds 2 batches ahead (FLOOR), but a 2-step epoch has only 1 other batch to gather
    parts = tf_cpu.training_parts(FLOOR, step_ops=100, batch=MIB, steps=2, heap=7 * MIB)
    assert parts == {"tf_import_anon": 190 * MIB, "tf_import_file": 330 * MIB, "fit_machinery": 30 * MIB,
                     "graph_ops": 409_600, "dataset": 4 * MIB, "prefetch_batches": MIB,
                     "tensor_heap_resident": 7 * MIB}
    assert tf_cpu.setup_parts(FLOOR, batch=MIB, steps=2, weights=3 * MIB) == {
        "tf_import_anon": 190 * MIB, "tf_import_file": 330 * MIB, "fit_setup": 5 * MIB, "dataset": 6 * MIB,
        "weights_and_slots": 3 * MIB}


def test_figures_one_large_tensor_by_hand():
    # 8 MiB of inputs and one 16 MiB activation, both above glibc's 128 KiB mmap threshold: each is a
    # mapping of its own, request + 8 B header + 64 B alignment slack + 32 B MINSIZE rounded up to pages
    trace = _trace([(1, 8 * MIB, Category.INPUTS), (2, 16 * MIB, Category.ACTIVATIONS)], [2, 1])
    figures = tf_cpu.tf_cpu_figures(_traced(trace), TrainingSetup(batch_size=4, steps=2), floor=FLOOR, onednn="off")
    assert figures.tensor_peak == 24 * MIB
    assert figures.allocator_peak == figures.tensor_peak
    # training: 520 + 30 MiB + 100 ops × 4 KiB + dataset 2 × 16 MiB + 1 batch ahead 8 MiB + heap 24 MiB + 2 pages;
    # set-up: 520 + 5 MiB + 3 × 16 MiB: training is the larger
    assert figures.parts["tensor_heap_resident"] == 24 * MIB + 2 * 4096
    assert figures.parts["dataset"] == 2 * 16 * MIB
    assert figures.parts["prefetch_batches"] == 8 * MIB
    assert figures.parts["graph_ops"] == 100 * 4096
    assert figures.process_bytes == sum(figures.parts.values()) == 614 * MIB + 409_600 + 2 * 4096


def test_setup_peak_wins_for_a_large_dataset():
    # 8 MiB batches over 40 steps: 320 MiB of data, 3× at set-up (960) against 2× while training (640 + 46)
    trace = _trace([(1, 8 * MIB, Category.INPUTS), (2, 16 * MIB, Category.ACTIVATIONS)], [2, 1])
    figures = tf_cpu.tf_cpu_figures(_traced(trace), TrainingSetup(batch_size=4, steps=40), floor=FLOOR, onednn="off")
    assert figures.parts["dataset"] == 3 * 320 * MIB
    assert figures.process_bytes == (190 + 330 + 5 + 960) * MIB
    assert any("fit set-up" in w for w in figures.warnings)


def test_never_below_the_import_floor_and_high_above_expected():
    trace = _trace([(1, 1000, Category.INPUTS)], [1])
    figures = tf_cpu.tf_cpu_figures(_traced(trace, ops=0), TrainingSetup(batch_size=1), floor=FLOOR, onednn="off")
    assert figures.process_bytes >= FLOOR["import_anon_bytes"] + FLOOR["import_file_bytes"]
    assert {"tf_import_anon", "tf_import_file", "fit_machinery", "tensor_heap_resident"} <= set(figures.parts)
    # the high adds the file-backed pages' measured maximum over their median
    assert figures.process_high >= figures.process_bytes + 15 * MIB
    assert any("import floor" in w for w in figures.warnings)


def test_freed_heap_chunks_reused():
    # three 64 KiB tensors (below the mmap threshold: heap) alive one after the other reuse one chunk
    trace = _trace([(1, 65536, Category.ACTIVATIONS)], [1])
    for sid in (2, 3):
        trace.storages[sid] = StorageRecord(sid, 65536, Category.ACTIVATIONS, Phase.FORWARD, "l", "Op", 0)
        trace.events.append(Event(len(trace.events), "alloc", 65536, sid, Phase.FORWARD, "l", "Op", 0))
        trace.events.append(Event(len(trace.events), "free", 65536, sid, Phase.FORWARD, "l", "Op", 0))
    events = tf_cpu.device_events(trace)
    assert tf_cpu.heap_resident(events) == tf_cpu.heap_resident(events[:2])
    assert tf_cpu.heap_resident(events, pinned=True) >= tf_cpu.heap_resident(events)


def test_arenas_high_by_hand():
    # one 64 KiB tensor, below the 128 KiB mmap threshold: posix_memalign asks _int_malloc for
    # 65,536 + 16 + 64 + 32 + 8 rounded to 16 = 65,664 B; the heap grows by that + 128 KiB top pad + 32,
    # rounded up to pages: 49 pages = 200,704 B. Three threads' arenas may each hold that much.
    trace = _trace([(1, 65536, Category.ACTIVATIONS)], [1])
    events = tf_cpu.device_events(trace)
    assert tf_cpu.heap_resident(events) == 200_704
    assert tf_cpu.arenas_high(events, threads=3) == 3 * 200_704
    # a mapped chunk (1 MiB) is the same mapping in any arena: only the heap part is counted per thread
    big = tf_cpu.device_events(_trace([(1, MIB, Category.ACTIVATIONS)], [1]))
    assert tf_cpu.arenas_high(big, threads=3) == tf_cpu.heap_resident(big) == MIB + 4096


def test_onednn_default_follows_cpu_flags():
    assert tf_cpu.onednn_default(frozenset({"avx2", "fma"})) is False
    assert tf_cpu.onednn_default(frozenset({"avx512f", "avx512_vnni"})) is True
    assert tf_cpu.onednn_default(frozenset({"amx_tile"})) is True


def test_calibration_file_has_every_part():
    floor = tf_cpu.load_floor()
    for key in ("import_anon_bytes", "import_file_bytes", "import_file_min", "import_file_max", "fit_machinery_bytes",
                "per_op_bytes", "setup_factor", "train_factor", "setup_base_bytes", "batches_held", "tensorflow",
                "command"):
        assert key in floor, key
    assert floor["import_file_min"] <= floor["import_file_bytes"] <= floor["import_file_max"]
    assert floor["per_op_bytes"] > 0


def _fork_trace() -> Trace:
    """A Relu's 16 KiB output consumed by two MatMuls (a forked backward): executor.cc keeps the last
    expensive one on the Relu's thread and hands the other to the second inter-op thread."""
    from trainmem.trace.events import KernelCall, TensorMeta

    trace = Trace()
    rows = [(1, Phase.FORWARD, "a", "Relu", "alloc"), (2, Phase.BACKWARD, "b", "MatMul", "alloc"),
            (3, Phase.BACKWARD, "c", "MatMul", "alloc"), (1, Phase.BACKWARD, "c", "MatMul", "free")]
    for sid, phase, module, op, action in rows:
        trace.storages.setdefault(sid, StorageRecord(sid, 16384, Category.ACTIVATIONS, phase, module, op, 0))
        trace.events.append(Event(len(trace.events), action, 16384, sid, phase, module, op, 0))
    x = TensorMeta((64, 64), 4, "float32", storage_key=1)
    trace.kernel_calls += [KernelCall("MatMul", 1, 1, (x, x, {}), (None,), (2,)),
                           KernelCall("MatMul", 2, 1, (x, x, {}), (None,), (3,))]
    return trace


def test_heap_has_one_arena_per_thread():
    # 16 KiB: posix_memalign asks for 16,512 B, the heap grows by that + 128 KiB pad + 32 B to 37 pages
    # (151,552 B). One arena holds all three chunks in that heap; with the fork, the second thread's
    # arena grows a heap of its own: 2 × 151,552 B
    trace = _fork_trace()
    events = tf_cpu.device_events(trace)
    assert tf_cpu.heap_resident(events) == 151_552
    figures = tf_cpu.tf_cpu_figures(_traced(trace), TrainingSetup(batch_size=4, steps=1), floor=FLOOR, onednn="off")
    assert figures.parts["tensor_heap_resident"] == 2 * 151_552
    one_thread = dict(FLOOR, inter_op_threads=1)
    alone = tf_cpu.tf_cpu_figures(_traced(trace), TrainingSetup(batch_size=4, steps=1), floor=one_thread, onednn="off")
    assert alone.parts["tensor_heap_resident"] == 151_552
    assert figures.process_high >= figures.process_bytes


def test_onednn_choice_as_tensorflow_decides():
    avx2, amx = frozenset({"avx2", "fma"}), frozenset({"avx512f", "amx_tile"})
    # util.cc IsMklEnabled: TF_ENABLE_ONEDNN_OPTS when it reads as a boolean, else DefaultOneDnnPolicy
    assert tf_cpu.onednn_choice("auto", {}, avx2).on is False
    assert tf_cpu.onednn_choice("auto", {}, amx).on is True
    assert "DefaultOneDnnPolicy" in tf_cpu.onednn_choice("auto", {}, amx).reason
    forced = tf_cpu.onednn_choice("auto", {"TF_ENABLE_ONEDNN_OPTS": "1"}, avx2)
    assert forced.on is True and "TF_ENABLE_ONEDNN_OPTS=1" in forced.reason
    assert tf_cpu.onednn_choice("auto", {"TF_ENABLE_ONEDNN_OPTS": "false"}, amx).on is False
    bogus = tf_cpu.onednn_choice("auto", {"TF_ENABLE_ONEDNN_OPTS": "maybe"}, amx)
    assert bogus.on is True and "not a boolean" in bogus.reason
    # --tf-onednn on|off stands for the variable set to 1|0, whatever the environment says
    assert tf_cpu.onednn_choice("off", {"TF_ENABLE_ONEDNN_OPTS": "1"}, amx).on is False
    assert tf_cpu.onednn_choice("on", {}, avx2).reason.startswith("--tf-onednn on")
    with pytest.raises(Exception, match="auto|on|off"):
        tf_cpu.onednn_choice("yes")


def test_onednn_default_by_platform():
    # DefaultOneDnnPolicy: Linux by CPU features (aarch64: Neoverse V1 only); macOS wheels lack INTEL_MKL
    assert tf_cpu.onednn_default(frozenset(), {"CPU implementer": "0x41", "CPU part": "0xd40"}, "linux") is True
    assert tf_cpu.onednn_default(frozenset(), {"CPU implementer": "0x41", "CPU part": "0xd4f"}, "linux") is False
    assert tf_cpu.onednn_default(frozenset({"amx_tile"}), {}, "darwin") is False


def test_floor_entry_by_cpu_class_and_path():
    assert tf_cpu.isa_class(frozenset({"avx2"})) == "avx2"
    assert tf_cpu.isa_class(frozenset({"avx512f", "amx_tile"})) == "amx"
    off = tf_cpu.load_floor(False, "avx2")
    assert off["onednn"] is False and off["isa"] == "avx2" and off["matched"] == "this CPU class and path"
    other = tf_cpu.load_floor(False, "no such class")
    assert other["onednn"] is False and other["matched"] == "same path, another CPU class"


def test_onednn_path_pools_large_tensors_by_hand():
    # one 8 MiB batch and one 16 MiB activation, 2 steps; with oneDNN on all go to the MklCPUAllocator's pool
    # (>= 256 KiB), after what fit keeps there: the dataset (2 × 8 MiB) takes a 16 MiB region (2 MiB doubled
    # to fit), the one batch tf.data holds ahead (a 2-step epoch has no second) a 16 MiB region (split 8 + 8),
    # the step's batch that region's tail, the activation a 32 MiB region (split 16 + 16). Pages written, each
    # region from byte 64: 4097 + 4097 + 4097; the kept tensors' own 4096 + 2048 are the dataset and prefetch
    # parts, so the tensors' part is 12291 - 6144 = 6147 pages
    trace = _trace([(1, 8 * MIB, Category.INPUTS), (2, 16 * MIB, Category.ACTIVATIONS)], [2, 1])
    setup = TrainingSetup(batch_size=4, steps=2)
    on = tf_cpu.tf_cpu_figures(_traced(trace), setup, floor=FLOOR, onednn="on")
    off = tf_cpu.tf_cpu_figures(_traced(trace), setup, floor=FLOOR, onednn="off")
    assert on.onednn is True and off.onednn is False
    assert on.parts["tensor_heap_resident"] == 6147 * 4096
    assert off.parts["tensor_heap_resident"] == 24 * MIB + 2 * 4096
    # get_memory_info's peak: the pool's chunks in use, the kept ones included
    assert on.allocator_peak == (16 + 8 + 8 + 16) * MIB
    # the high end: every page of the 16 + 16 + 32 MiB regions but the kept tensors' 24 MiB, and the library
    # pages as a fresh install keeps them (367,316,992 B, targets/data/library_pages.json) above FLOOR's 330 MiB,
    # more than FLOOR's own measured spread of 15 MiB
    assert on.process_high == on.process_bytes - 6147 * 4096 + 40 * MIB + 367316992 - 330 * MIB
    assert any(w.startswith("oneDNN on (--tf-onednn on") and "MklCPUAllocator" in w for w in on.warnings)
    assert any(w.startswith("oneDNN off (--tf-onednn off") for w in off.warnings)


def test_library_pages_room_is_the_larger_of_the_spread_and_a_fresh_install():
    fresh = json.loads((Path(tf_cpu.__file__).parent.parent / "data" / "library_pages.json").read_text())
    fresh = fresh["frameworks"]["tensorflow"]["fresh_bytes"]
    assert fresh == 367316992
    room, said = tf_cpu.library_pages_room(FLOOR)
    assert room == fresh - 330 * MIB and "evicted and read back" in said and "350 MiB" in said
    # a calibration measured with the files freshly written (its own spread above the fresh figure) keeps its spread
    wide = {**FLOOR, "import_file_bytes": 340 * MIB, "import_file_max": 400 * MIB}
    assert tf_cpu.library_pages_room(wide)[0] == 60 * MIB


def test_initializers_leave_their_pages_in_the_pool():
    # a 1 MiB kernel made at build: its initializer's two other tensors of 1 MiB were live with it (measured:
    # get_memory_info peak 3 × the weight); a 100 KiB one stays with glibc, untouched by the rule
    from trainmem.targets import DeviceEvent

    def init(key, nbytes):
        return DeviceEvent("alloc", nbytes, key, Category.PARAMETERS, Phase.INIT, "dense", "VarHandleOp", 0, key)

    events = tf_cpu.with_initializers([init(1, MIB), init(2, 100_000)])
    assert [(e.action, e.nbytes) for e in events] == [("alloc", MIB)] * 3 + [("free", MIB)] * 2 + [("alloc", 100_000)]
    assert events[2].key == 1 and events[0].category == Category.TEMPORARIES
