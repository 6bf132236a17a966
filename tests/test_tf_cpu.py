"""targets/tf_cpu.py: the TensorFlow CPU process model's arithmetic, checked by hand on small traces."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainmem.setup import TrainingSetup
from trainmem.targets import tf_cpu
from trainmem.trace.events import Category, Event, Phase, StorageRecord, Trace

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
    return SimpleNamespace(trace=trace, op_counts={"MatMul": ops})


def test_parts_by_hand():
    # a batch of 1 MiB over 2 steps: the dataset is 2 MiB, held twice while training, 3 times at set-up
    parts = tf_cpu.training_parts(FLOOR, step_ops=100, batch=MIB, steps=2, heap=7 * MIB)
    assert parts == {"tf_import_anon": 190 * MIB, "tf_import_file": 330 * MIB, "fit_machinery": 30 * MIB,
                     "graph_ops": 409_600, "dataset": 4 * MIB, "prefetch_batches": 2 * MIB,
                     "tensor_heap_resident": 7 * MIB}
    assert tf_cpu.setup_parts(FLOOR, batch=MIB, steps=2, weights=3 * MIB) == {
        "tf_import_anon": 190 * MIB, "tf_import_file": 330 * MIB, "fit_setup": 5 * MIB, "dataset": 6 * MIB,
        "weights_and_slots": 3 * MIB}


def test_figures_one_large_tensor_by_hand():
    # 8 MiB of inputs and one 16 MiB activation, both above glibc's 128 KiB mmap threshold: each is a
    # mapping of its own, request + 8 B header + 64 B alignment slack + 32 B MINSIZE rounded up to pages
    trace = _trace([(1, 8 * MIB, Category.INPUTS), (2, 16 * MIB, Category.ACTIVATIONS)], [2, 1])
    figures = tf_cpu.tf_cpu_figures(_traced(trace), TrainingSetup(batch_size=4, steps=2), floor=FLOOR)
    assert figures.tensor_peak == 24 * MIB
    assert figures.allocator_peak == figures.tensor_peak
    # training: 520 + 30 MiB + 100 ops × 4 KiB + dataset 2 × 16 MiB + 2 batches 16 MiB + heap 24 MiB + 2 pages;
    # set-up: 520 + 5 MiB + 3 × 16 MiB: training is the larger
    assert figures.parts["tensor_heap_resident"] == 24 * MIB + 2 * 4096
    assert figures.parts["dataset"] == 2 * 16 * MIB
    assert figures.parts["prefetch_batches"] == 16 * MIB
    assert figures.parts["graph_ops"] == 100 * 4096
    assert figures.process_bytes == sum(figures.parts.values()) == 622 * MIB + 409_600 + 2 * 4096


def test_setup_peak_wins_for_a_large_dataset():
    # 8 MiB batches over 40 steps: 320 MiB of data, 3× at set-up (960) against 2× while training (640 + 46)
    trace = _trace([(1, 8 * MIB, Category.INPUTS), (2, 16 * MIB, Category.ACTIVATIONS)], [2, 1])
    figures = tf_cpu.tf_cpu_figures(_traced(trace), TrainingSetup(batch_size=4, steps=40), floor=FLOOR)
    assert figures.parts["dataset"] == 3 * 320 * MIB
    assert figures.process_bytes == (190 + 330 + 5 + 960) * MIB
    assert any("fit set-up" in w for w in figures.warnings)


def test_never_below_the_import_floor_and_high_above_expected():
    trace = _trace([(1, 1000, Category.INPUTS)], [1])
    figures = tf_cpu.tf_cpu_figures(_traced(trace, ops=0), TrainingSetup(batch_size=1), floor=FLOOR)
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
    figures = tf_cpu.tf_cpu_figures(_traced(trace), TrainingSetup(batch_size=4, steps=1), floor=FLOOR)
    assert figures.parts["tensor_heap_resident"] == 2 * 151_552
    one_thread = dict(FLOOR, inter_op_threads=1)
    alone = tf_cpu.tf_cpu_figures(_traced(trace), TrainingSetup(batch_size=4, steps=1), floor=one_thread)
    assert alone.parts["tensor_heap_resident"] == 151_552
    assert figures.process_high >= figures.process_bytes
