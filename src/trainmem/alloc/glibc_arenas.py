"""glibc malloc with one arena per thread: which thread allocates each tensor of a TensorFlow step, and
the resident memory of each thread's arena.

Threads. TensorFlow's executor (tensorflow/core/common_runtime/executor.cc) runs a function's graph on
its runner, the inter-op thread pool (default: one thread per core). RunAsync hands the root nodes to
the runner (ScheduleReady with no inline queue). A thread that finished a node calls ScheduleReady on
the nodes that became ready: inexpensive ones (OpKernel::IsExpensive false: constants, identities,
shapes, variable reads…) go to its own inline queue; of the expensive ones (every CPU kernel by
default: OpKernel's expensive_ is true off the GPU) the last stays on the thread when nothing inexpensive
is queued, and every other one is handed to the runner (RunTask → the pool). So a chain of kernels stays
on one thread and a fork sends all branches but one to another thread. The kernel-cost estimates
(KernelStats::IsExpensive: kInitialCostEstimateCycles 100M against kOpIsExpensiveThresholdCycles 8,000,
each run moving the estimate 1/kCostDecay = 1/10 toward the measured cycles) stay above the threshold
for about the first 90 runs of the function (0.9^n · 100M > 8,000 for n < 90), so in a short fit the
kernel's own flag decides; in a long fit fast kernels become inexpensive and run inline, which this
model does not follow. Which idle thread picks
up a task is up to Eigen's thread pool (work stealing); this model ASSUMES the pool's threads are taken in
turn, skipping the thread that hands the task over (with two threads: always the other one), and that
only the nodes released by one finished node are queued at once. The weights and optimizer slots are
made by the Python (main) thread before fit; the batches by tf.data's threads.

Arenas (malloc/arena.c). The main thread allocates from main_arena; another thread gets an arena of its
own at its first malloc while there are fewer than 8 × cores arenas (arena_get2), which covers every
thread here. free() returns a chunk to the arena it came from, whichever thread calls it
(arena_for_chunk), and a thread's malloc takes only its own arena's free chunks: a chunk freed in
thread A's arena does not serve thread B. The mmap threshold and trim threshold are process-wide
(mp_.mmap_threshold, mp_.trim_threshold, raised in __libc_free by any thread's munmap_chunk), so all
arenas here share them. A thread arena grows its heap without M_TOP_PAD and gives memory back by
heap_trim against the same trim threshold; this model replays every arena with alloc/cpu_heap.py's GlibcModel
(main-arena rules, top pad included: at most 128 KiB more per arena).
"""

from __future__ import annotations

import dataclasses

from trainmem.alloc.cpu_heap import MMAP_THRESHOLD_START, GlibcModel
from trainmem.alloc.device_events import DeviceEvent
from trainmem.trace.events import Category, Phase, TensorMeta, Trace

MAIN, DATA = 0, -1  # the Python thread (main_arena) and tf.data's threads
# kernels whose IsExpensive() returns false (TensorFlow sources): constant_op.h ConstantOp,
# host_constant_op.h _HostConstantOp, identity_op.h IdentityOp, identity_n_op.h IdentityNOp, shape_ops.h
# ShapeOp/ShapeNOp/RankOp/SizeOp/ExpandDimsOp/SqueezeOp, reshape_op.h ReshapeOp, no_op.h NoOp,
# resource_variable_ops.h ReadVariableOp/VarHandleOp, function_ops.h ArgOp/RetvalOp,
# strided_slice_op.cc StridedSliceGradOp, bcast_ops.cc BCastGradArgsOp
CHEAP_OPS = frozenset({
    "Const", "HostConst", "Identity", "IdentityN", "StopGradient", "Snapshot", "Shape", "ShapeN", "Rank", "Size",
    "ExpandDims", "Squeeze", "Reshape", "NoOp", "ReadVariableOp", "VarHandleOp", "_Arg", "_Retval",
    "StridedSliceGrad", "BroadcastGradientArgs"})


@dataclasses.dataclass(frozen=True)
class OpNode:
    """One kernel run as the trace shows it: its op type and the earlier nodes it waits for."""

    op: str
    preds: tuple[int, ...]  # indices of earlier nodes whose outputs it consumes

    @property
    def cheap(self) -> bool:
        return self.op in CHEAP_OPS


def assign_threads(nodes: list[OpNode], pool: int) -> list[int]:
    """Thread (1..pool) of each node, by ScheduleReady's rule (module docstring): a node is released by
    its last predecessor, in the node order; roots and dispatched nodes take the pool's threads in turn."""
    threads = list(range(1, max(1, pool) + 1))
    turn = 0

    def dispatch(current: int | None) -> int:
        nonlocal turn
        for _ in threads:
            thread = threads[turn % len(threads)]
            turn += 1
            if thread != current or len(threads) == 1:
                return thread
        return threads[0]

    released: dict[int, list[int]] = {}
    for index, node in enumerate(nodes):
        if node.preds:
            released.setdefault(max(node.preds), []).append(index)
    assigned: list[int] = [0] * len(nodes)
    for index, node in enumerate(nodes):
        if not node.preds:
            assigned[index] = dispatch(None)  # RunAsync: roots go to the runner
        here = assigned[index]
        ready = released.get(index, [])
        cheap = [k for k in ready if nodes[k].cheap]
        expensive = [k for k in ready if not nodes[k].cheap]
        for k in cheap:
            assigned[k] = here
        stays = expensive[-1] if expensive and not cheap else None
        for k in expensive:
            assigned[k] = here if k == stays else dispatch(here)
    return assigned


def trace_nodes(trace: Trace) -> tuple[list[OpNode], dict[int, int]]:
    """The step's kernel runs rebuilt from the trace, and the node of each trace event (by seq).

    A node is a run of events with one (step, phase, module, op) in which no allocation follows a free
    (the executor allocates an op's outputs, then releases its inputs: trace/tf/lifetimes.py). Consecutive ops of
    one type in one layer that only allocate merge into one node. A node waits for the node that
    allocated a buffer it frees (its last consumer) and for the producers of a kernel call's inputs
    (KernelCall.args storage keys). Ops that allocate nothing (aliases, variable reads) are not seen; a
    chain through them stays a chain. Weights (INIT) and batches (INPUTS) belong to no node. A node whose inputs the
    trace does not show (it is not their last consumer and no kernel call names them: Adam's Sub of a
    gradient, BiasAddGrad) is a root here, dispatched in turn like the function's own roots: 28% of the
    nodes of benchmarks/keras_models.py's models. Keeping such nodes on the previous node's thread instead
    moves the tensors' heap by -7 to +44 MiB on those models at their small batch (cnn_bn 32: 201 -> 245)."""
    nodes_ops: list[str] = []
    preds: list[set[int]] = []
    node_of: dict[int, int] = {}
    producer: dict[int, int] = {}
    label, last_action = None, ""
    for event in trace.events:
        if event.phase in (Phase.INIT, Phase.INPUTS):
            continue
        key = (event.step, event.phase, event.module, event.op)
        if key != label or (last_action == "free" and event.action == "alloc"):
            nodes_ops.append(event.op)
            preds.append(set())
            label = key
        last_action = event.action
        node = len(nodes_ops) - 1
        node_of[event.seq] = node
        if event.action == "alloc":
            producer[event.sid] = node
        elif producer.get(event.sid, node) != node:
            preds[node].add(producer[event.sid])
    for call in trace.kernel_calls:
        node = node_of.get(call.at_seq)
        if node is None:
            continue
        for arg in call.args:
            source = producer.get(arg.storage_key) if isinstance(arg, TensorMeta) else None
            if source is not None and source < node:
                preds[node].add(source)
    return [OpNode(op, tuple(sorted(p))) for op, p in zip(nodes_ops, preds)], node_of


def event_threads(stream: list[DeviceEvent], trace: Trace, pool: int) -> list[int]:
    """The thread that performs each event of the allocator's stream: weights and slots on the main thread,
    the batch on tf.data's, the step's tensors and kernel temporaries (DeviceEvent.trace_seq = the
    kernel's first output event) on the pool thread of their node."""
    nodes, node_of = trace_nodes(trace)
    threads = assign_threads(nodes, pool)
    out = []
    for event in stream:
        if event.phase == Phase.INIT:
            out.append(MAIN)
        elif event.phase == Phase.INPUTS or event.category == Category.INPUTS:
            out.append(DATA)
        else:
            node = node_of.get(event.trace_seq)
            out.append(threads[node] if node is not None else MAIN)
    return out


class _Thresholds:
    """mp_'s process-wide dynamic thresholds (malloc.c: mp_.mmap_threshold, mp_.trim_threshold)."""

    def __init__(self) -> None:
        self.mmap_threshold = MMAP_THRESHOLD_START
        self.trim_threshold = 2 * MMAP_THRESHOLD_START


def _shared(name: str) -> property:
    return property(lambda self: getattr(self.shared, name), lambda self, value: setattr(self.shared, name, value))


class ArenaModel(GlibcModel):
    """GlibcModel for one arena whose mmap and trim thresholds are the process's, shared by all arenas."""

    mmap_threshold = _shared("mmap_threshold")
    trim_threshold = _shared("trim_threshold")

    def __init__(self, shared: _Thresholds, pinned: bool = False) -> None:
        self.shared = shared
        kept = (shared.mmap_threshold, shared.trim_threshold)
        super().__init__(pinned)  # sets the start values; an arena made later must not reset them
        shared.mmap_threshold, shared.trim_threshold = kept


@dataclasses.dataclass(frozen=True)
class ArenaReplay:
    peak_resident: int  # the largest sum over arenas of heap extent + mapped chunks
    peak_index: int  # the stream event at that peak
    arena_peaks: dict[int, int]  # thread -> its arena's own peak resident bytes
    at_peak: dict[int, int]  # thread -> its arena's resident bytes at the process peak


def replay_arenas(stream: list[DeviceEvent], threads: list[int], pinned: bool = False) -> ArenaReplay:
    """Resident bytes with each thread's allocations in its own arena and each free back to the chunk's
    arena (threads[i]: the thread of stream[i]; an arena is made at its thread's first malloc)."""
    shared = _Thresholds()
    arenas: dict[int, ArenaModel] = {}
    owner: dict[int, int] = {}  # key -> thread of the arena its chunk came from
    resident: dict[int, int] = {}
    total = peak = peak_index = 0
    at_peak: dict[int, int] = {}
    for index, (event, thread) in enumerate(zip(stream, threads)):
        if event.action == "alloc":
            arena = arenas.get(thread) or arenas.setdefault(thread, ArenaModel(shared, pinned))
            arena.malloc(event.key, event.nbytes)
            owner[event.key] = thread
        else:
            thread = owner.pop(event.key, None)
            if thread is None:
                continue
            arena = arenas[thread]
            arena.free(event.key)
        now = arena.resident()
        total += now - resident.get(thread, 0)
        resident[thread] = now
        if total > peak:
            peak, peak_index, at_peak = total, index, dict(resident)
    return ArenaReplay(peak, peak_index, {t: a.peak_resident for t, a in arenas.items()}, at_peak)


def thread_arenas(stream: list[DeviceEvent], trace: Trace, pool: int, pinned: bool = False) -> ArenaReplay:
    """The stream replayed with one glibc arena per thread, threads assigned by executor.cc's rule."""
    return replay_arenas(stream, event_threads(stream, trace, pool), pinned)
