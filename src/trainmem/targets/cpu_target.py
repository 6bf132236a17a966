"""The CPU target behind the Target interface: the CPU kernel rules' stream (targets/cpu_kernels.py), c10's CPU
allocator for the tensor peak, and the process's peak RSS (the runtime's floor, targets/cpu_runtime.py,
plus glibc's resident heap for the tensors and the runtime's small objects, alloc/replay.py glibc_heap; for a
Keras model on the torch backend, also Keras's import and model.fit's machinery, targets/keras_torch_runtime.py)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib

from trainmem.alloc import small_objects
from trainmem.alloc.cpu_heap import aligned
from trainmem.alloc.replay import CpuTensorAllocator, glibc_heap
from trainmem.alloc.steady_state import SteadyHeap, steady_heap
from trainmem.errors import SetupError
from trainmem.targets import DeviceStream, ProcessMemory, ReportWords, cpu_runtime, keras_torch_runtime
from trainmem.targets import cpu_kernels
from trainmem.targets.cpu_info import CpuInfo
from trainmem.targets.onednn import matmul_cache
from trainmem.targets.onednn.rnn_layout import rnn_layout
from trainmem.trace.cache_store import remembered
from trainmem.trace.events import Trace


@dataclasses.dataclass(frozen=True)
class CpuTarget:
    cpu: CpuInfo  # the instruction set and thread count the kernel rules follow

    allocated_name = "tensor peak"
    report_words = ReportWords("peak RSS", "", "= tensors on the CPU", "the CPU allocator caches nothing",
                               "allocated (live tensors)", "tensor_bytes", "tensor_bytes", " RAM", False,
                               (("tensors", "tensor_bytes"), ("process (peak RSS)", "process_bytes")),
                               "what the process holds beyond tensors: importing TensorFlow maps more library pages and "
                               "allocates more than importing torch, and model.fit builds a graph and a tf.data "
                               "pipeline.")
    runtime_words = "kernel-internal buffers and 64-byte allocation rounding"
    # the peak RSS error columns of every bundled CPU family's table: benchmarks/results/accuracy_cpu.md (AMD EPYC,
    # worst -12.32%, resnet_small batch 32) and accuracy_cpu_intel_amx.md (Intel Xeon with AMX, worst -12.82%,
    # tied_lm batch 16, adam); the worst of them, rounded up
    fit_margin = (0.13, "benchmarks/results/accuracy_cpu_intel_amx.md: worst low error of peak RSS over the bundled "
                        "CPU families' tables, -12.82% (tied_lm, batch 16, adam; accuracy_cpu.md: -12.32%), rounded up")
    checkpoint_lists_blocks = True  # the checkpointing warning names the first wrapped blocks

    @classmethod
    def create(cls, device, setup, **options) -> CpuTarget:
        """The CPU this process runs on; the CUDA target's options are refused."""
        if any(value is not None for value in options.values()):
            raise SetupError("expected --cuda-context, --alloc-conf, --cuda-version, --module-loading and "
                             "--cudnn-benchmark only with a GPU --device, got --device cpu", where="--device")
        return cls(CpuInfo.this_machine())

    def module_rounding(self, nbytes: int) -> int:
        return aligned(nbytes)  # c10's 64-byte posix_memalign

    def kernel_ops(self) -> frozenset[str]:
        return cpu_kernels.kernel_ops()

    def trace_semantics(self) -> None:
        return None  # the trace runs the CPU's own kernels already

    def rank_process_parts(self, layout, role) -> list[tuple[str, int, str]]:
        """torch.distributed's own runtime on the CPU (gloo's process group, the wrapper's imports), measured
        (targets/distributed_runtime.py); gloo's collectives' temporaries are kernel rules (targets/gloo.py)."""
        from trainmem.targets.distributed_runtime import PART, distributed_runtime_bytes

        nbytes, assumption = distributed_runtime_bytes(layout)
        return [(PART, nbytes, assumption)]

    def device_stream(self, trace: Trace) -> DeviceStream:
        events, fired = cpu_kernels.device_stream(trace, self.cpu)
        layout = rnn_layout(self.cpu.onednn_version)
        # a oneDNN release whose LSTM layout was not checked against the real op gets the larger known layout:
        # never low, but the estimate must say it is a bound
        gaps = (layout.note(),) if "oneDNN LSTM workspace and buffers" in fired and not layout.exact else ()
        return DeviceStream(events, fired, gaps)

    def allocator(self) -> CpuTensorAllocator:
        return CpuTensorAllocator()

    def allocator_settings(self) -> None:
        return None

    def process_memory(self, source, setup, traced, stream: DeviceStream, replayed) -> ProcessMemory:
        # peft imports transformers itself, so LoRA brings both into the process
        libraries = (frozenset(source.libraries) | ({"peft", "transformers"} if setup.lora_spec() else set())
                     | frozenset(traced.libraries))
        keras_parts, keras_spread, keras_said = {}, 0, []
        if keras_torch_runtime.applies(source):  # Keras's import and model.fit, measured apart
            keras_parts, keras_spread, keras_said = keras_torch_runtime.keras_parts()
            libraries -= {"keras"}
        runtime = cpu_runtime.runtime_floor(traced.op_counts, libraries, self.cpu, setup.compile)
        matmuls, problems, path = matmul_cache.resident_bytes(traced.trace.kernel_calls, self.cpu)
        if matmuls:
            runtime.parts["runtime_onednn_matmul_shapes"] = matmuls
        heap = _steady_heap(source, setup, traced, stream, self.cpu)
        # --compile: what compiling gave back counts at the point where the tensors' heap is smaller (its pages are
        # then the peak's); whether larger heaps reuse them varies from run to run (compile_cpu.md), so the high end
        # keeps all of it
        unreused = max(0, runtime.compile_transient - heap.resident)
        if unreused:
            runtime.parts["runtime_compile_transient"] = unreused
        floor = sum(runtime.parts.values()) + sum(keras_parts.values())
        spread = heap.table["spread"]
        # runtime.spread: the bundled machines' floors differ by that much when this one is not calibrated
        high = (max(floor + heap.pinned, int((floor + heap.resident) * (1 + spread["above_median"]))) + keras_spread
                + runtime.spread + runtime.compile_transient - unreused)
        matmul_said = [f"{problems} distinct reduced-precision matmul problems run on oneDNN ({path} kernels): "
                       f"{matmuls / 2**20:.1f} MiB of compiled code and cache entries kept for the run, as measured "
                       "per new shape (targets/onednn/matmul_cache.py); shapes that change from step to step "
                       "(routing) add one each time"] if matmuls else []
        warnings = runtime.assumptions + keras_said + matmul_said + _heap_assumptions(heap, high) + [
            f"CPU kernel rule '{rule}' applied ×{count} (buffers below the dispatcher, {self.cpu.capability})"
            for rule, count in sorted(stream.rules.items())] + list(stream.gaps)
        parts = {**runtime.parts, **keras_parts, "tensor_heap_resident": heap.resident}
        coverage = {"capability": self.cpu.capability, "threads": self.cpu.threads, "heap_steps": heap.steps}
        return ProcessMemory(parts, high, [], warnings, coverage)


def _steady_heap(source, setup, traced, stream: DeviceStream, cpu: CpuInfo) -> SteadyHeap:
    """glibc's heap after the run, with the small objects of the code the model's modules come from (the
    libraries that define them, not those --lora imports beside them)."""
    family = small_objects.family_of(frozenset(source.libraries) | frozenset(traced.code_libraries))
    return remembered(_heap_key(traced, cpu, setup.run_steps, family),
                      lambda: steady_heap(stream.events, functools.partial(glibc_heap, family=family), setup.run_steps),
                      SteadyHeap.to_plain, SteadyHeap.from_plain)


def _heap_key(traced, cpu, run_steps: int | None, family: str) -> str | None:
    """The heap replay is a function of the device stream (the trace and this CPU's kernel rules), the run's
    length and the small objects' family alone: kept beside a trace the cache holds (trace/cache_store.py
    remembered), keyed from its key."""
    use = getattr(traced, "cache_use", None)
    if use is None or not use.key:
        return None
    return hashlib.sha256(repr(("steady_heap", use.key, cpu, run_steps, family)).encode()).hexdigest()


def _run_length(heap: SteadyHeap) -> str:
    """What the heap figure stands for: the run's length, and whether the heap had stopped growing."""
    growth = ", ".join(f"{heap_bytes / 2**20:.0f}" for heap_bytes in heap.growth.values())
    steps = ", ".join(str(steps) for steps in heap.growth)
    said = (f"peak RSS is the run's after {heap.steps} steps: the last traced step repeated (alloc/steady_state.py), "
            f"as glibc's heap keeps growing after the first steps (modelled heap {growth} MiB after {steps} steps)")
    values = list(heap.growth.values())
    if not heap.converged and len(values) > 1 and values[-1] == values[-2]:
        said += ("; it held over the last doubling, and a longer run may still add a little (--steps N for the "
                 "run's own length)")
    elif not heap.converged:
        said += ("; it was still growing where the replay stopped, so a longer run may hold more (--steps N for "
                 "the run's own length)")
    return said


# whose rows: plain PyTorch modules' (the table's first set) go unnamed
FAMILY_WORDS = {"torch": "", "transformers": ", the rows of transformers models (their Python between ops)"}


def _heap_assumptions(heap: SteadyHeap, high: int) -> list[str]:
    source, spread = heap.table["source"], heap.table["spread"]
    family = heap.table.get("family", "torch")
    assumptions = [_run_length(heap), f"peak RSS replays the tensor allocations with {heap.objects:,} runtime small objects "
                   "(TensorImpls, autograd nodes, oneDNN descriptors) interleaved as malloc logs of real runs show "
                   f"(targets/data/cpu_small_objects.json{FAMILY_WORDS[family]}, torch {source['torch']}, "
                   f"{source['date']}); they pin freed tensor chunks inside glibc's heap",
                   f"where the objects fall changes from run to run: process_bytes_high {high / 2**20:.0f} MiB is the "
                   f"larger of the process with every freed heap chunk pinned (heap {heap.pinned / 2**20:.0f} MiB "
                   f"against {heap.resident / 2**20:.0f} MiB expected) and the expected process plus the largest "
                   f"run-to-run spread above the median measured on the calibration models "
                   f"(+{spread['above_median']:.1%}, targets/data/cpu_small_objects.json 'spread')"]
    if heap.defaulted_ops:
        ops = sorted(heap.defaulted_ops, key=lambda k: -heap.defaulted_ops[k])
        assumptions.append(f"no small-object row for {len(ops)} op kinds ({', '.join(ops[:5])}"
                           f"{' …' if len(ops) > 5 else ''}): their phase's average is used")
    return assumptions

