"""alloc/glibc_arenas.py: executor.cc's thread rule and one glibc arena per thread, by hand."""

from trainmem.alloc.cpu_heap import MINSIZE, PAGE, TOP_PAD, GlibcModel, request_to_chunk
from trainmem.alloc.glibc_arenas import MAIN, OpNode, assign_threads, replay_arenas, trace_nodes
from trainmem.alloc.device_events import DeviceEvent
from trainmem.trace.events import Category, Event, KernelCall, Phase, TensorMeta, Trace

KIB = 1024


def ev(action, nbytes, key, seq=0, phase=Phase.FORWARD):
    return DeviceEvent(action, nbytes, key, Category.ACTIVATIONS, phase, "m", "Op", 0, seq)


def heap_for(nbytes: int) -> int:
    """A fresh heap's extent after one posix_memalign(64, nbytes): _int_memalign asks for
    nb + 64 + MINSIZE, sysmalloc grows by that + M_TOP_PAD + MINSIZE, page-rounded."""
    ask = request_to_chunk(request_to_chunk(nbytes) + 64 + MINSIZE)
    return (ask + TOP_PAD + MINSIZE + PAGE - 1) // PAGE * PAGE


def test_chain_stays_on_one_thread():
    nodes = [OpNode("Conv2D", ()), OpNode("Relu", (0,)), OpNode("MaxPool", (1,)), OpNode("MatMul", (2,))]
    threads = assign_threads(nodes, 2)
    assert threads == [1, 1, 1, 1]


def test_fork_sends_all_but_the_last_expensive_branch_away():
    # node 0 releases 1 and 2, both expensive: the last (2) stays, 1 goes to the other thread
    nodes = [OpNode("MatMul", ()), OpNode("MatMul", (0,)), OpNode("MatMul", (0,)), OpNode("Relu", (1,))]
    assert assign_threads(nodes, 2) == [1, 2, 1, 2]


def test_fork_with_inexpensive_work_dispatches_every_expensive_node():
    # 0 releases a Shape (inexpensive: inline) and two MatMuls: both expensive ones go to the runner
    nodes = [OpNode("Relu", ()), OpNode("Shape", (0,)), OpNode("MatMul", (0,)), OpNode("MatMul", (0,))]
    assert assign_threads(nodes, 2) == [1, 1, 2, 2]


def test_roots_take_the_pool_in_turn_and_one_thread_pool_keeps_all():
    nodes = [OpNode("MatMul", ()), OpNode("MatMul", ()), OpNode("MatMul", ())]
    assert assign_threads(nodes, 2) == [1, 2, 1]
    assert assign_threads(nodes, 1) == [1, 1, 1]


def test_a_chunk_freed_in_one_arena_does_not_serve_another_thread():
    size = 64 * KIB  # below the 128 KiB mmap threshold: heap chunks
    stream = [ev("alloc", size, 1), ev("free", size, 1), ev("alloc", size, 2)]
    one = replay_arenas(stream, [1, 1, 1])
    two = replay_arenas(stream, [1, 1, 2])
    assert heap_for(size) == 200704  # 49 pages
    assert one.peak_resident == 200704  # the freed chunk went back to the top and served key 2
    assert two.peak_resident == 2 * 200704  # thread 2's arena grew a heap of its own
    assert two.arena_peaks == {1: 200704, 2: 200704}


def test_free_from_another_thread_returns_to_the_owning_arena():
    size = 64 * KIB
    # thread 2 frees thread 1's chunk; thread 1 then reuses it, so thread 1's arena does not grow
    stream = [ev("alloc", size, 1), ev("free", size, 1), ev("alloc", size, 2)]
    replay = replay_arenas(stream, [1, 2, 1])
    assert replay.peak_resident == 200704
    assert set(replay.arena_peaks) == {1}


def test_the_mmap_threshold_is_the_process_s():
    big = 4 * 2**20
    # thread 1 maps and frees 4 MiB: glibc raises mp_.mmap_threshold to that chunk's size for every thread,
    # so thread 2's 4 MiB request is served from its arena's heap, not mapped
    stream = [ev("alloc", big, 1), ev("free", big, 1), ev("alloc", big, 2)]
    replay = replay_arenas(stream, [1, 1, 2])
    assert replay.arena_peaks[1] == (request_to_chunk(request_to_chunk(big) + 64 + MINSIZE) + 8 + PAGE - 1) // PAGE * PAGE
    assert replay.arena_peaks[2] == heap_for(big)
    alone = GlibcModel()  # a thread whose threshold was never raised maps it
    alone.malloc(3, big)
    assert alone.brk == 0 and alone.mapped > 0


def test_one_thread_equals_the_single_arena_model():
    stream = [ev("alloc", 300 * KIB, 1), ev("alloc", 50 * KIB, 2), ev("free", 300 * KIB, 1),
              ev("alloc", 40 * KIB, 3), ev("free", 50 * KIB, 2), ev("free", 40 * KIB, 3)]
    model = GlibcModel()
    for event in stream:
        (model.malloc(event.key, event.nbytes) if event.action == "alloc" else model.free(event.key))
    assert replay_arenas(stream, [1] * len(stream)).peak_resident == model.peak_resident


def _trace(rows):
    trace = Trace()
    for seq, (action, sid, op, phase) in enumerate(rows):
        trace.events.append(Event(seq, action, 1024, sid, phase, "layer", op, 0))
    return trace


def test_trace_nodes_split_on_free_then_alloc_and_link_last_consumers():
    F, B = Phase.FORWARD, Phase.BACKWARD
    trace = _trace([("alloc", 0, "VarHandleOp", Phase.INIT),  # weights: no node
                    ("alloc", 1, "MatMul", F),  # node 0
                    ("alloc", 2, "Relu", F),  # node 1 (frees nothing: 1 is kept for backward)
                    ("alloc", 3, "MatMul", B), ("free", 2, "MatMul", B),  # node 2, after node 1
                    ("alloc", 4, "MatMul", B), ("free", 1, "MatMul", B)])  # node 3: alloc after a free
    trace.kernel_calls.append(KernelCall("MatMul", 5, 1, (TensorMeta((16, 16), 4, "float32", storage_key=3),
                                                          TensorMeta((16, 16), 4, "float32", storage_key=0), {}),
                                         (), (4,)))
    nodes, node_of = trace_nodes(trace)
    assert [n.op for n in nodes] == ["MatMul", "Relu", "MatMul", "MatMul"]
    assert [n.preds for n in nodes] == [(), (), (1,), (0, 2)]
    assert node_of == {1: 0, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3} and 0 not in node_of
    assert MAIN == 0


def test_mapped_chunks_cost_the_same_in_any_arena():
    # 1 MiB is above the 128 KiB threshold: a mapping of its own whichever thread asks, so splitting the
    # threads adds nothing (only heap chunks stay behind in an arena)
    mib = 2**20
    stream = [ev("alloc", mib, 1), ev("alloc", mib, 2), ev("free", mib, 1), ev("free", mib, 2)]
    assert replay_arenas(stream, [1, 2, 1, 2]).peak_resident == replay_arenas(stream, [1] * 4).peak_resident
    assert replay_arenas(stream, [1] * 4).peak_resident == 2 * (mib + PAGE)
