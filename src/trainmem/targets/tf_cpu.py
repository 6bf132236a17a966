"""TensorFlow on the CPU: peak RSS of a process that imports TensorFlow and Keras and runs `model.fit`.

The allocator. tensorflow-cpu 2.21 for x86-64 is built with oneDNN (INTEL_MKL), which registers the
MklCPUAllocator (a BFC allocator for large requests) at priority 200 only when IsMKLEnabled() holds
(threadpool_device.cc, REGISTER_MEM_ALLOCATOR "MklCPUAllocator"). On Linux that is TF_ENABLE_ONEDNN_OPTS,
whose default is on only for CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX (util.cc
DefaultOneDnnPolicy). Elsewhere the priority drops to 50 and the default CPUAllocator (priority 100,
cpu_allocator_impl.cc) serves every tensor: port::AlignedMalloc → posix_memalign(64), caching nothing.
Measured here (AMD EPYC, AVX2 only; IsMklEnabled() False): a 512 MB tensor made and dropped three times
raises RSS by 512 MB and gives it all back each time (glibc maps it and unmaps it); 64 tensors of 4 MB
dropped once are given back, and after that glibc's mmap threshold has risen to 4 MB and the next 64
stay resident in the heap after they are freed — glibc's dynamic threshold, as alloc/cpu.py models it for
PyTorch (same 64-byte posix_memalign). So the tensors' resident bytes are alloc/cpu.py's GlibcModel replay
of the trace, the allocator's peak is the live bytes rounded to 64 B, and nothing is cached. The kernels
run on the executor's inter-op threads and each thread allocates from a glibc arena of its own, so the
replay keeps one arena per thread (alloc/glibc_arenas.py: which thread runs each kernel by executor.cc's
rule, the pool's threads taken in turn). Measured: with MALLOC_ARENA_MAX=1 the convolutional and LSTM
rows of benchmarks/results/accuracy_keras_cpu.md peak 3-9% lower than with glibc's default.

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

from trainmem.alloc.cpu import GlibcModel, replay_tensors
from trainmem.alloc.glibc_arenas import thread_arenas
from trainmem.targets import DeviceEvent
from trainmem.trace.events import Category, Trace

DATA = Path(__file__).parent / "data" / "tf_cpu_floor.json"
ONEDNN_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")  # util.cc


@dataclasses.dataclass(frozen=True)
class TfCpuFigures:
    tensor_peak: int  # live tensor bytes at their peak (64-B rounded requests)
    allocator_peak: int  # the CPU allocator's bytes in use at its peak (malloc-based: the tensor peak)
    parts: dict[str, int]  # process parts; process_bytes is their sum
    process_bytes: int  # expected peak RSS
    process_high: int  # the part that varies (page cache, heap placement) at its measured high
    warnings: list[str]


@lru_cache(maxsize=1)
def load_floor() -> dict:
    return json.loads(DATA.read_text())


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
    steps = {record.step for record in trace.storages.values() if record.category == Category.INPUTS}
    first = min(steps) if steps else 0
    return sum(r.nbytes for r in trace.storages.values() if r.category == Category.INPUTS and r.step == first)


def onednn_default(flags: frozenset[str] | None = None) -> bool:
    """Whether TensorFlow turns oneDNN (and so the MklCPUAllocator) on by default on this CPU (util.cc)."""
    if flags is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
        flags = frozenset(next((line.split(":", 1)[1].split() for line in text.splitlines()
                                if line.startswith("flags")), []))
    return any(flag in flags for flag in ONEDNN_FLAGS)


def init_bytes(trace: Trace) -> int:
    """Bytes of the storages made before the step (weights, optimizer slots, metric variables)."""
    return sum(r.nbytes for r in trace.storages.values() if str(r.phase) == "init")


def training_parts(floor: dict, step_ops: int, batch: int, steps: int, heap: int) -> dict[str, int]:
    """RSS while the steps run: import floor, fit's machinery, the graph's ops, the dataset held
    `train_factor` times (`steps` batches of `batch` bytes), the batches tf.data holds, the tensors' heap."""
    return {"tf_import_anon": int(floor["import_anon_bytes"]), "tf_import_file": int(floor["import_file_bytes"]),
            "fit_machinery": int(floor["fit_machinery_bytes"]), "graph_ops": int(floor["per_op_bytes"]) * step_ops,
            "dataset": int(floor["train_factor"] * batch * steps),
            "prefetch_batches": int(floor["batches_held"] * batch), "tensor_heap_resident": heap}


def setup_parts(floor: dict, batch: int, steps: int, weights: int) -> dict[str, int]:
    """RSS when fit has made its dataset, before the first step: import floor, the dataset held
    `setup_factor` times, what fit's set-up adds besides, the weights and slots."""
    return {"tf_import_anon": int(floor["import_anon_bytes"]), "tf_import_file": int(floor["import_file_bytes"]),
            "fit_setup": max(0, int(floor["setup_base_bytes"])), "dataset": int(floor["setup_factor"] * batch * steps),
            "weights_and_slots": weights}


def tf_cpu_figures(traced: Any, setup: Any, *, floor: dict | None = None, steps: int | None = None) -> TfCpuFigures:
    """TensorFlow CPU figures for a traced Keras train step (trace/keras_traced.py KerasTraced): the
    tensor and allocator peaks (kernel temporaries included), and the process's peak RSS by part (those of
    the larger high point)."""
    from trainmem.targets.tf_cpu_kernels import tf_cpu_device_stream

    floor = floor or load_floor()
    steps = steps or setup.steps
    # the trace plus each kernel's temporaries (allocate_temp: conv col buffers …), through the same allocator
    stream = tf_cpu_device_stream(traced.trace, onednn=onednn_default())
    events = stream.events
    tensors = replay_tensors(events)
    # ops inside function bodies (While/If branches: the LSTM's loop) are graph ops too; a trace that counts
    # them apart says so in `function_ops` (the LSTM of benchmarks/keras_models.py: 294 in 12 functions)
    step_ops = sum(traced.op_counts.values()) + int(getattr(traced, "function_ops", 0) or 0)
    batch = getattr(traced, "input_bytes", 0) or batch_bytes(traced.trace)
    threads = int(floor["inter_op_threads"]) or int(floor["nproc"])  # 0: TensorFlow's default, one per core
    # the tensors' heap: one glibc arena per thread that allocates (alloc/glibc_arenas.py)
    heap = thread_arenas(events, traced.trace, threads).peak_resident
    pinned = thread_arenas(events, traced.trace, threads, pinned=True).peak_resident
    one_arena = heap_resident(events)
    training = training_parts(floor, step_ops, batch, steps, heap)
    at_setup = setup_parts(floor, batch, steps, init_bytes(traced.trace))
    parts = max(training, at_setup, key=lambda p: sum(p.values()))
    process = sum(parts.values())
    file_spread = int(floor["import_file_max"]) - int(floor["import_file_bytes"])
    arenas = arenas_high(events, threads + 1)  # the inter-op threads and the caller
    high = max(sum(training.values()) + max(0, pinned - heap, arenas - heap), sum(at_setup.values())) + file_spread
    said = _warnings(floor, step_ops, steps, pinned, training, one_arena, threads)
    said += [f"TensorFlow CPU kernel rule '{rule}' applied ×{count} (temporaries inside the kernel, "
             "targets/tf_cpu_kernels.py)" for rule, count in sorted(stream.rules.items())]
    said += [f"kernel temporaries not sized: {gap}" for gap in stream.gaps]
    said.append(f"peak RSS at {'training' if parts is training else 'fit set-up (dataset made, before the first step)'}"
                f": training {sum(training.values()) / 2**20:.0f} MiB, set-up {sum(at_setup.values()) / 2**20:.0f} MiB")
    return TfCpuFigures(tensors.peak_bytes, tensors.peak_bytes, parts, process, high, said)


def _warnings(floor: dict, step_ops: int, steps: int, pinned: int, parts: dict[str, int], one_arena: int,
              threads: int) -> list[str]:
    mib = 2**20
    said = [f"TensorFlow import floor {parts['tf_import_anon'] / mib:.0f} MiB anonymous + "
            f"{parts['tf_import_file'] / mib:.0f} MiB library pages (file-backed, {floor['import_file_min'] / mib:.0f}"
            f"–{floor['import_file_max'] / mib:.0f} MiB measured), TensorFlow {floor['tensorflow']}, Keras "
            f"{floor['keras']}, {floor['cpu_model']}, {floor['nproc']} cores (targets/data/tf_cpu_floor.json)",
            f"fit's machinery {parts['fit_machinery'] / mib:.0f} MiB and {floor['per_op_bytes'] / 1024:.1f} KiB per op "
            f"of the train step's {step_ops:,} ops, measured on synthetic Dense stacks",
            f"the dataset is assumed to be {steps} steps × the batch, as numpy arrays passed to model.fit: RSS holds "
            f"it {floor['setup_factor']:.2f}× when fit has made its dataset and {floor['train_factor']:.2f}× while "
            f"training, and tf.data {floor['batches_held']:.1f} batches more",
            "CPU allocator: TensorFlow's default CPUAllocator (posix_memalign, nothing cached); tensors' resident "
            f"heap {parts['tensor_heap_resident'] / mib:.0f} MiB by glibc's rules with one arena per thread: the "
            f"kernels on {threads} inter-op threads, each kernel's thread by executor.cc's rule (a chain stays on "
            "its thread, a fork hands its other expensive branches to the pool; assumed: the pool's threads in "
            f"turn), weights on the main thread ({one_arena / mib:.0f} MiB with one arena, {pinned / mib:.0f} MiB "
            "if every freed heap chunk stays pinned); the high end gives each thread a heap as large as the "
            "single heap's peak (any thread may run any kernel)"]
    if onednn_default() or floor.get("onednn"):
        said.append("this CPU turns oneDNN on by default: TensorFlow then allocates through the MklCPUAllocator "
                    "(a BFC allocator for large requests), which keeps its regions; the glibc model here does not "
                    "cover it")
    return said
