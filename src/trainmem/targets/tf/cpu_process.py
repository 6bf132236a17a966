"""TensorFlow on the CPU: peak RSS of a process that imports TensorFlow and Keras and runs `model.fit`.

The allocator: two paths, chosen as TensorFlow chooses (alloc/tf_mkl_cpu.py `onednn_choice`, --tf-onednn
auto|on|off).
tensorflow-cpu 2.21 for x86-64 is built with oneDNN (INTEL_MKL), which registers the MklCPUAllocator at
priority 200 only when IsMKLEnabled() holds (threadpool_device.cc, REGISTER_MEM_ALLOCATOR
"MklCPUAllocator"). On Linux that is TF_ENABLE_ONEDNN_OPTS when it reads as a boolean, else
DefaultOneDnnPolicy: on for CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX (util.cc).
- oneDNN off: the default CPUAllocator (priority 100, cpu_allocator_impl.cc) serves every tensor:
  port::AlignedMalloc → posix_memalign(64), caching nothing. Measured on AMD EPYC (AVX2 only; IsMklEnabled()
  False): a 512 MB tensor made and dropped three times raises RSS by 512 MB and gives it all back each time
  (glibc maps it and unmaps it); 64 tensors of 4 MB dropped once are given back, and after that glibc's mmap
  threshold has risen to 4 MB and the next 64 stay resident in the heap after they are freed — glibc's
  dynamic threshold, as alloc/cpu_heap.py models it for PyTorch (same 64-byte posix_memalign). So the tensors'
  resident bytes are alloc/cpu_heap.py's GlibcModel replay of the trace, the allocator's peak is the live bytes
  rounded to 64 B, and nothing is cached. The kernels run on the executor's inter-op threads and each thread
  allocates from a glibc arena of its own, so the replay keeps one arena per thread (alloc/glibc_arenas.py:
  which thread runs each kernel by executor.cc's rule, the pool's threads taken in turn). Measured: with
  MALLOC_ARENA_MAX=1 the convolutional and LSTM rows of benchmarks/results/accuracy_keras_cpu.md peak 3-9%
  lower than with glibc's default.
- oneDNN on: the MklCPUAllocator (alloc/tf_mkl_cpu.py) sends requests of 256 KiB and more to a BFC pool that
  grows by regions and never gives a page back, the rest to glibc. The tensors' resident bytes are the pool's
  pages ever written plus the small requests' glibc arenas (one per thread, as above). The graph's MatMul,
  BatchMatMul, Einsum, Conv2D and its gradients, MaxPool and its gradient, Softmax, Transpose and _FusedMatMul
  then run as _Mkl* kernels (targets/tf/cpu_kernel_rules.py ONEDNN_KERNELS), whose scratch is not sized.
Each path has its own measured constants (targets/data/tf_cpu_floor.json, one entry per CPU class and path).

The process. Its RSS has two high points, and the peak is the larger:
- fit's set-up (measured at on_train_begin): model.fit on numpy arrays wraps them in
  tf.data.Dataset.from_tensors(...).repeat() and gathers each batch from them in a parallel map
  (keras/src/trainers/data_adapters/array_data_adapter.py get_tf_dataset); at that point RSS holds the
  dataset `setup_factor` times (the user's arrays, the tensor made from them and one more copy), beside
  the import floor, the weights and the optimizer's slots;
- training: one copy is gone by the first step; then RSS = the import floor (anonymous and file-backed
  pages apart) + what fit adds for a graph of no ops (tf.function tracing, data adapter, callbacks,
  threads) + a cost per op of the traced train step (Python FuncGraph objects, GraphDef, the optimized
  graph, kernels) + the dataset `train_factor` times + the batches tf.data holds + the tensors' resident
  heap (the glibc replay of the trace, weights and slots included).
Every constant but the heap is measured by benchmarks/calibrate_tf_cpu.py on synthetic models in fresh
processes (targets/data/tf_cpu_floor.json). The estimate assumes the dataset the measured run passes:
steps × batch samples of the traced input and label shapes, as numpy arrays.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainmem.alloc.cpu_heap import GlibcModel, replay_tensors
from trainmem.alloc.glibc_arenas import thread_arenas
from trainmem.alloc.tf_mkl_cpu import (  # noqa: F401  (the oneDNN decision, re-exported)
    ONEDNN_FLAGS, PAGE, OneDnnChoice, cpu_flags, memory_limit, onednn_choice, onednn_default, pooled, replay_pool,
    small_events, uses_system_alloc)
from trainmem.alloc.device_events import DeviceEvent
from trainmem.trace.events import Category, Phase, Trace

DATA = Path(__file__).parent.parent / "data" / "tf_cpu_floor.json"  # targets/data


@dataclasses.dataclass(frozen=True)
class TfCpuFigures:
    tensor_peak: int  # live tensor bytes at their peak (64-B rounded requests)
    allocator_peak: int  # the CPU allocator's bytes in use at its peak (glibc: the tensor peak; oneDNN: + pool chunks)
    parts: dict[str, int]  # process parts; process_bytes is their sum
    process_bytes: int  # expected peak RSS
    process_high: int  # the part that varies (page cache, heap placement) at its measured high
    warnings: list[str]
    onednn: bool = False  # the path modelled: the MklCPUAllocator's (True) or the default CPUAllocator's
    onednn_reason: str = ""


def isa_class(flags: frozenset[str] | None = None) -> str:
    """The CPU class the calibration entries are keyed by: amx, avx512, avx2 or baseline."""
    flags = cpu_flags()[0] if flags is None else flags
    for name, flag in (("amx", "amx_tile"), ("avx512", "avx512f"), ("avx2", "avx2")):
        if flag in flags:
            return name
    return "baseline"


@lru_cache(maxsize=1)
def _entries() -> tuple[dict, ...]:
    return tuple(json.loads(DATA.read_text())["entries"])


def load_floor(onednn: bool | None = None, isa: str | None = None) -> dict:
    """The measured constants for a path (oneDNN on/off) on a CPU class: the entry of both, else one of the
    same path measured on another class (the entry's `matched` says which was taken)."""
    onednn = onednn_choice().on if onednn is None else onednn
    isa = isa or isa_class()
    return _own_import_floor(_bundled_floor(onednn, isa))


def _bundled_floor(onednn: bool, isa: str) -> dict:
    entries = _entries()
    for wanted, why in (((isa, onednn), "this CPU class and path"), ((None, onednn), "same path, another CPU class")):
        found = [e for e in entries if (wanted[0] is None or e["isa"] == wanted[0]) and bool(e["onednn"]) == onednn]
        if found:
            return {**found[0], "matched": why}
    return {**entries[0], "matched": "no entry for this path: the first entry"}


def _own_import_floor(floor: dict) -> dict:
    """The import floor `trainmem calibrate` measured on this machine under the installed TensorFlow, in place of the
    bundled entry's (targets/tf/calibration.py); the bundled entry as it is where there is none."""
    from trainmem.targets.calibrations import cache_dir
    from trainmem.targets.tf import calibration

    versions = calibration.installed_versions() or {}
    return calibration.with_own_floor(floor, cache_dir(), versions.get("tensorflow"))


def device_events(trace: Trace) -> list[DeviceEvent]:
    """The trace's events as the allocator sees them: TensorFlow's CPU kernels allocate their outputs
    through the one CPU allocator, so the stream is the trace itself."""
    storages = trace.storages
    return [DeviceEvent(e.action, e.nbytes, e.sid, storages[e.sid].category if e.sid in storages else Category.TEMPORARIES,
                        e.phase, e.module, e.op, e.step, e.seq) for e in trace.events]


def heap_resident(events: list[DeviceEvent], pinned: bool = False) -> int:
    """Peak bytes glibc keeps resident for the tensors; `pinned`: no freed heap chunk is ever reused by
    the top or trimmed (small runtime objects above each), the high bound."""
    return _replay(events, pinned)[0]


def _replay(events: list[DeviceEvent], pinned: bool = False) -> tuple[int, int]:
    """(peak resident bytes, peak bytes of the heap proper: brk, not the mapped chunks)."""
    model = GlibcModel(pinned)
    peak_heap = 0
    for event in events:
        if event.action == "alloc":
            model.malloc(event.key, event.nbytes)
            peak_heap = max(peak_heap, model.brk)
        elif event.key in model.chunks:
            model.free(event.key)
    return model.peak_resident, peak_heap


def arenas_high(events: list[DeviceEvent], threads: int) -> int:
    """The tensors' resident bytes if each thread that runs kernels keeps a heap of its own as large as
    the single heap's peak. glibc gives a thread its own arena when the one it would share is busy
    (malloc/arena.c arena_get2, up to 8 per core), and memory freed into one arena serves only the
    threads attached to it; TensorFlow's executor runs kernels on its inter-op threads and inline on the
    caller (executor.cc ScheduleReady). Chunks above the mmap threshold are mappings in any arena. Measured
    here: cnn_bn (benchmarks/keras_models.py) at batch 32 peaked at 728 MiB with MALLOC_ARENA_MAX=1 and
    761-815 MiB with glibc's default, one run each of 3."""
    resident, heap = _replay(events, pinned=True)
    return resident + max(0, threads - 1) * heap


def batch_bytes(trace: Trace) -> int:
    """Bytes of one batch (inputs and labels) as the trace holds them: its INPUTS storages of one step."""
    return sum(r.nbytes for r in _first_batch(trace))


def _first_batch(trace: Trace) -> list:
    steps = {record.step for record in trace.storages.values() if record.category == Category.INPUTS}
    first = min(steps) if steps else 0
    return [r for r in trace.storages.values() if r.category == Category.INPUTS and r.step == first]


def dataset_events(trace: Trace, steps: int, batches: int = 0) -> list[DeviceEvent]:
    """The tensors model.fit keeps beside the step's: the dataset, one tensor per input of steps × that
    input's batch bytes, from fit's start to its end, and `batches` batches tf.data has gathered ahead, as
    allocations never freed. Measured with oneDNN on (wide_input, 64 steps of 256): at on_train_begin
    get_memory_info('CPU:0') "current" is the inputs' 256 MiB, which stays in the pool to the end while
    another copy of the arrays leaves RSS by the first step."""
    records = _first_batch(trace)
    sizes = [r.nbytes * steps for r in records] + [r.nbytes for _ in range(batches) for r in records]
    return [DeviceEvent("alloc", n, -(1 << 62) + i, Category.INPUTS, Phase.INPUTS, "", "dataset", 0, 0)
            for i, n in enumerate(sizes)]


def with_initializers(events: list[DeviceEvent]) -> list[DeviceEvent]:
    """The stream with the eager tensors Keras's initializers make at build: before each weight of 256 KiB or
    more (assumed: a kernel or embedding with a random initializer, as Keras's layers give them; their zero-
    and one-initialized weights are vectors), two more of its size, freed once the weight exists. A random
    initializer runs stateless_random_uniform (or _normal), then × scale and + shift, each a new tensor;
    measured with oneDNN on: get_memory_info('CPU:0') "peak" while keras.Variable(glorot_uniform((1000, 1000)))
    is made is 3 × its 4 MB, and 1.0 × with zeros. Only the pool keeps their pages (glibc unmaps them)."""
    out: list[DeviceEvent] = []
    keys = iter(range(-(1 << 61), -(1 << 60)))
    for event in events:
        big = event.action == "alloc" and event.phase == Phase.INIT and event.category == Category.PARAMETERS
        if not big or not pooled(event.nbytes):
            out.append(event)
            continue
        made = [dataclasses.replace(event, key=next(keys), category=Category.TEMPORARIES) for _ in range(2)]
        out += made + [event] + [dataclasses.replace(e, action="free") for e in made]
    return out


def init_bytes(trace: Trace) -> int:
    """Bytes of the storages made before the step (weights, optimizer slots, metric variables)."""
    return sum(r.nbytes for r in trace.storages.values() if str(r.phase) == "init")


def training_parts(floor: dict, step_ops: int, batch: int, steps: int, heap: int) -> dict[str, int]:
    """RSS while the steps run: import floor, fit's machinery, the graph's ops, the dataset held
    `train_factor` times (`steps` batches of `batch` bytes), the batches tf.data holds, the tensors' heap."""
    return {"tf_import_anon": int(floor["import_anon_bytes"]), "tf_import_file": int(floor["import_file_bytes"]),
            "fit_machinery": int(floor["fit_machinery_bytes"]), "graph_ops": int(floor["per_op_bytes"]) * step_ops,
            "dataset": int(floor["train_factor"] * batch * steps),
            "prefetch_batches": int(batches_ahead(floor, steps) * batch), "tensor_heap_resident": heap}


def batches_ahead(floor: dict, steps: int) -> float:
    """The batches tf.data holds beside the step's own: the measured `batches_held` (at 8 and 64 steps), but
    never more than the epoch has left to gather (steps - 1): model.fit's dataset has steps batches."""
    return min(float(floor["batches_held"]), float(max(0, steps - 1)))


def setup_parts(floor: dict, batch: int, steps: int, weights: int) -> dict[str, int]:
    """RSS when fit has made its dataset, before the first step: import floor, the dataset held
    `setup_factor` times, what fit's set-up adds besides, the weights and slots."""
    return {"tf_import_anon": int(floor["import_anon_bytes"]), "tf_import_file": int(floor["import_file_bytes"]),
            "fit_setup": max(0, int(floor["setup_base_bytes"])), "dataset": int(floor["setup_factor"] * batch * steps),
            "weights_and_slots": weights}


@dataclasses.dataclass(frozen=True)
class _Heap:
    expected: int  # the tensors' resident bytes
    high: int  # their high end
    one_arena: int  # the glibc part replayed as one arena (diagnostic)
    pinned: int  # the glibc part with freed heap chunks pinned
    pool: Any = None  # MklPoolReplay on the oneDNN path


def _glibc_heap(events: list[DeviceEvent], trace: Trace, threads: int) -> _Heap:
    """The default CPUAllocator: every tensor through glibc, one arena per allocating thread."""
    heap = thread_arenas(events, trace, threads).peak_resident
    pinned = thread_arenas(events, trace, threads, pinned=True).peak_resident
    arenas = arenas_high(events, threads + 1)  # the inter-op threads and the caller
    return _Heap(heap, max(heap, pinned, arenas), heap_resident(events), pinned)


def pool_stream(events: list[DeviceEvent], trace: Trace, steps: int, batches: int) -> tuple[list, int]:
    """What the MklCPUAllocator's pool sees, in order: the weights (their initializers' tensors included),
    the dataset and the batches tf.data holds ahead (kept to the end), then the steps; and the pages of
    those kept tensors."""
    data = dataset_events(trace, steps, batches)
    events = with_initializers(events)
    first_step = next((i for i, e in enumerate(events) if e.phase != Phase.INIT), len(events))
    kept = sum(-(-e.nbytes // PAGE) * PAGE for e in data if pooled(e.nbytes))
    return events[:first_step] + data + events[first_step:], kept


def _mkl_heap(events: list[DeviceEvent], traced: Any, threads: int, steps: int, batches: int) -> _Heap:
    """The MklCPUAllocator: requests of 256 KiB and more in its BFC pool (with the dataset tensor and the
    batches tf.data holds ahead, which take pages the step's tensors cannot use: their pages are the
    `dataset` and `prefetch_batches` parts, not counted twice), the rest through glibc's arenas. The pool
    only grows, so its resident pages at the end are its peak; adding the glibc part's peak is exact when that
    peak comes after the pool's last new page, and high by at most the glibc part's drop otherwise. The high
    end counts every page of the regions the pool opened: the executor's threads may run the kernels in
    another order than the replay's, placing chunks elsewhere inside them, and the oneDNN kernels' scratchpads
    (not sized) take pool chunks too."""
    stream, kept = pool_stream(events, traced.trace, steps, batches)
    pool = replay_pool(stream, memory_limit())
    small = _glibc_heap(small_events(events), traced.trace, threads)
    resident = max(0, pool.resident - kept)
    reserved = max(resident, pool.region_bytes - kept)
    return _Heap(resident + small.expected, reserved + small.high, resident + small.one_arena,
                 resident + small.pinned, pool)


def tensor_heap(traced: Any, steps: int, *, onednn: bool, threads: int, ahead: int = 0) -> int:
    """The tensors' resident bytes (the `tensor_heap_resident` part) on one path: `ahead` batches held by tf.data
    in the pool beside the dataset (oneDNN on)."""
    from trainmem.targets.tf.cpu_kernel_rules import tf_cpu_device_stream

    events = tf_cpu_device_stream(traced.trace, onednn=onednn).events
    if onednn and not uses_system_alloc():
        return _mkl_heap(events, traced, threads, steps, ahead).expected
    return _glibc_heap(events, traced.trace, threads).expected


def tf_cpu_figures(traced: Any, setup: Any, *, floor: dict | None = None, steps: int | None = None,
                   onednn: str = "auto") -> TfCpuFigures:
    """TensorFlow CPU figures for a traced Keras train step (a TraceResult of trace/tf/keras_graph.py trace_keras): the
    tensor and allocator peaks (kernel temporaries included), and the process's peak RSS by part (those of
    the larger high point). `onednn` (auto|on|off) picks the path as `onednn_choice` does."""
    from trainmem.targets.tf.cpu_kernel_rules import tf_cpu_device_stream

    choice = onednn_choice(onednn)
    floor = floor or load_floor(choice.on)
    steps = steps or setup.steps
    # the trace plus each kernel's temporaries (allocate_temp: conv col buffers …), through the same allocator
    stream = tf_cpu_device_stream(traced.trace, onednn=choice.on)
    events = stream.events
    tensors = replay_tensors(events)
    # ops inside function bodies (While/If branches: the LSTM's loop) are graph ops too; a trace that counts
    # them apart says so in `function_ops` (the LSTM of benchmarks/keras_models.py: 294 in 12 functions)
    step_ops = sum(traced.op_counts.values()) + traced.framework.function_ops
    batch = traced.input_bytes or batch_bytes(traced.trace)
    threads = int(floor["inter_op_threads"]) or int(floor["nproc"])  # 0: TensorFlow's default, one per core
    pooling = choice.on and not uses_system_alloc()
    ahead = round(batches_ahead(floor, steps))  # whole batches tf.data keeps gathered ahead, in the pool
    heap = _mkl_heap(events, traced, threads, steps, ahead) if pooling else _glibc_heap(events, traced.trace, threads)
    training = training_parts(floor, step_ops, batch, steps, heap.expected)
    at_setup = setup_parts(floor, batch, steps, init_bytes(traced.trace))
    parts = max(training, at_setup, key=lambda p: sum(p.values()))
    process = sum(parts.values())
    file_room, file_said = library_pages_room(floor)
    high = max(sum(training.values()) + heap.high - heap.expected, sum(at_setup.values())) + file_room
    said = _warnings(floor, step_ops, steps, heap, training, threads) + [file_said] + _path_words(choice, floor, heap,
                                                                                                pooling)
    said += [f"TensorFlow CPU kernel rule '{rule}' applied ×{count} (temporaries inside the kernel, "
             "targets/tf/cpu_kernel_rules.py)" for rule, count in sorted(stream.rules.items())]
    said += [f"kernel temporaries not sized: {gap}" for gap in stream.gaps]
    said.append(f"peak RSS at {'training' if parts is training else 'fit set-up (dataset made, before the first step)'}"
                f": training {sum(training.values()) / 2**20:.0f} MiB, set-up {sum(at_setup.values()) / 2**20:.0f} MiB")
    allocator = tensors.peak_bytes if heap.pool is None else heap.pool.peak_in_use
    return TfCpuFigures(tensors.peak_bytes, allocator, parts, process, high, said, choice.on, choice.reason)


PAGES = Path(__file__).parent.parent / "data" / "library_pages.json"  # targets/data


def library_pages_room(floor: dict) -> tuple[int, str]:
    """How far above the calibration's library pages (`tf_import_file`) the high end reaches, and why: the run-to-run
    spread measured with them, or, where larger, the pages the same imports keep right after `pip install` wrote the
    files (targets/data/library_pages.json: 37.6 MiB more than once they were evicted and read back on an AMD EPYC)."""
    spread = int(floor["import_file_max"]) - int(floor["import_file_bytes"])
    measured = json.loads(PAGES.read_text())["frameworks"]["tensorflow"]
    fresh = int(measured["fresh_bytes"]) - int(floor["import_file_bytes"])
    mib = 2**20
    said = (f"library pages: {int(floor['import_file_bytes']) / mib:.0f} MiB at the point; right after `pip install` "
            f"wrote the files the same imports kept {int(measured['fresh_bytes']) / mib:.0f} MiB, "
            f"{int(measured['read_back_bytes']) / mib:.0f} MiB once they were evicted and read back (the page cache "
            f"keeps a freshly written file whole; measured with TensorFlow {measured['versions']['tensorflow']}, "
            "targets/data/library_pages.json): the high end allows the larger")
    return max(spread, fresh), said


def _warnings(floor: dict, step_ops: int, steps: int, heap: _Heap, parts: dict[str, int], threads: int) -> list[str]:
    mib = 2**20
    return [f"TensorFlow import floor {parts['tf_import_anon'] / mib:.0f} MiB anonymous + "
            f"{parts['tf_import_file'] / mib:.0f} MiB library pages (file-backed, {floor['import_file_min'] / mib:.0f}"
            f"–{floor['import_file_max'] / mib:.0f} MiB measured), TensorFlow {floor['tensorflow']}, Keras "
            f"{floor['keras']}, {floor['cpu_model']} ({floor.get('isa', '?')}), {floor['nproc']} cores, oneDNN "
            f"{'on' if floor['onednn'] else 'off'} (targets/data/tf_cpu_floor.json: {floor.get('matched', 'given')})"
            + (f"; the import floor calibrated on this machine, {floor['own_import_floor']} (trainmem calibrate)"
               if floor.get("own_import_floor") else ""),
            f"fit's machinery {parts['fit_machinery'] / mib:.0f} MiB and {floor['per_op_bytes'] / 1024:.1f} KiB per op "
            f"of the train step's {step_ops:,} ops, measured on synthetic Dense stacks",
            f"the dataset is assumed to be {steps} steps × the batch, as numpy arrays passed to model.fit: RSS holds "
            f"it {floor['setup_factor']:.2f}× when fit has made its dataset and {floor['train_factor']:.2f}× while "
            f"training, and tf.data {batches_ahead(floor, steps):.1f} batches more ({floor['batches_held']:.2f} "
            "measured, at most the epoch's other batches)",
            f"glibc arenas: one per thread, the kernels on {threads} inter-op threads, each kernel's thread by "
            "executor.cc's rule (a chain stays on its thread, a fork hands its other expensive branches to the "
            f"pool; assumed: the pool's threads in turn), weights on the main thread ({heap.one_arena / mib:.0f} MiB "
            f"with one arena, {heap.pinned / mib:.0f} MiB if every freed heap chunk stays pinned); the high end "
            "gives each thread a heap as large as the single heap's peak (any thread may run any kernel)"]


def _path_words(choice: OneDnnChoice, floor: dict, heap: _Heap, pooling: bool) -> list[str]:
    """Which allocator path was modelled and why, in one line (and a second where the constants do not match)."""
    mib = 2**20
    if not choice.on:
        said = [f"oneDNN off ({choice.reason}): TensorFlow's default CPUAllocator (posix_memalign, nothing "
                f"cached); tensors' resident heap {heap.expected / mib:.0f} MiB by glibc's rules"]
    elif not pooling:
        said = [f"oneDNN on ({choice.reason}) with TF_ONEDNN_USE_SYSTEM_ALLOCATOR: the MklCPUAllocator sends every "
                f"request to glibc; tensors' resident heap {heap.expected / mib:.0f} MiB by glibc's rules"]
    else:
        pool = heap.pool
        said = [f"oneDNN on ({choice.reason}): the MklCPUAllocator pools requests of 256 KiB and more in a BFC "
                f"allocator that never gives a page back (alloc/tf_mkl_cpu.py): {pool.resident / mib:.0f} MiB of its "
                f"pages written (the dataset tensor's included), {pool.peak_in_use / mib:.0f} MiB in use at its peak, "
                f"regions {pool.region_bytes / mib:.0f} MiB reserved (the high end counts all of their pages); smaller "
                f"requests through glibc; tensors' resident total {heap.expected / mib:.0f} MiB"]
    if floor.get("matched") not in (None, "this CPU class and path"):
        said.append(f"the constants for this path were measured on {floor['cpu_model']} ({floor['isa']}), not this "
                    f"CPU class ({isa_class()}): {floor['matched']}")
    return said
