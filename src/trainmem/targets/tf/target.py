"""Keras on TensorFlow behind the Target interface, so that its estimate goes through the one assembler
(estimate/assemble.py) like PyTorch's:

- TfCpuTarget: the trace's storages as TensorFlow's CPU allocator sees them, c10-style 64-byte tensor peak
  (alloc/replay.py CpuTensorAllocator) for the breakdown, and peak RSS by targets/tf/cpu_process.py (oneDNN's
  MklCPUAllocator pool or glibc's arenas, the import floor, model.fit's dataset and machinery);
- TfGpuTarget: the trace with Eigen's and cuDNN's scratch (targets/tf/gpu_memory.py device_streams) through TensorFlow's
  BFC allocator in the memory mode asked for (alloc/tf_bfc.py), and nvidia-smi as the CUDA context plus the
  BFC regions.
Both report Keras's layer table and TensorFlow's own numbers in the Estimate's framework section
(targets/tf/keras_section.py). The trace comes from trace/tf/keras_graph.py trace_keras; kernel_ops and
trace_semantics are PyTorch's tracing hooks and are empty here."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.alloc.replay import CpuTensorAllocator, breakdown_at_peak
from trainmem.alloc.tf_bfc_allocator import TfBfcAllocator
from trainmem.errors import SetupError
from trainmem.targets import DeviceStream, FrameworkFigures, ProcessMemory, ReportWords
from trainmem.targets.cpu_target import CpuTarget
from trainmem.targets.cuda_target import CudaTarget
from trainmem.targets.tf.keras_section import KerasSection, explain_keras, keras_coverage, layer_rows, unsupported_lines
from trainmem.trace.events import Trace

DEFAULT_MEMORY_MODE = "default"
MAX_DATASET_SAMPLES = 10**12  # far above any dataset held in RAM as arrays; bounds the arithmetic


def _refuse_torch_options(options: dict[str, Any]) -> None:
    torch_only = sorted(key for key, value in options.items() if value is not None)
    if torch_only:
        flag = "--" + torch_only[0].replace("_", "-")
        raise SetupError(f"expected no {flag} for a Keras model on TensorFlow ({flag} describes PyTorch's CUDA run; "
                         "TensorFlow's GPU memory is set by --tf-memory)", where=flag)


class _KerasTarget:
    """What both TensorFlow targets share: no PyTorch tracing hooks, no many-rank runtime, Keras's rows."""

    checkpoint_lists_blocks = False  # Keras's trace wraps no blocks in torch.utils.checkpoint

    def module_rounding(self, nbytes: int) -> int:
        return nbytes  # Keras's layer rows count each live tensor as requested

    def kernel_ops(self) -> frozenset[str]:
        return frozenset()

    def trace_semantics(self) -> None:
        return None

    def allocator_settings(self) -> None:
        return None  # TensorFlow's allocator settings are the memory mode, stated in the section's figures

    def rank_process_parts(self, layout, role) -> list[tuple[str, int, str]]:
        raise SetupError("expected a PyTorch model with --strategy (many ranks are traced with torch.distributed), "
                         "got a Keras model", where="--strategy")

    def _framework(self, setup, traced, replayed, tensor_bytes: int, figures: dict[str, Any], words: list[str],
                   peak_rows: tuple) -> FrameworkFigures:
        breakdown = breakdown_at_peak(replayed, self.allocator().charged)
        section = KerasSection(tuple(traced.framework.layers), figures, tuple(words), traced.framework.order,
                               peak_rows, report_words=self.report_words)
        return FrameworkFigures(tensor_bytes, layer_rows(traced, replayed.live),
                                explain_keras(traced, setup, breakdown, words), keras_coverage(traced), section)


@dataclasses.dataclass(frozen=True)
class TfCpuTarget(_KerasTarget):
    onednn: str = "auto"  # auto|on|off: the allocator path (alloc/tf_mkl_cpu.py onednn_choice)
    dataset_size: int | None = None  # samples model.fit holds (None: the traced steps × the batch)

    allocated_name = CpuTarget.allocated_name
    report_words = CpuTarget.report_words
    runtime_words = "64-byte allocation rounding"
    fit_margin = CpuTarget.fit_margin

    @classmethod
    def create(cls, device, setup, tf_memory: str | None = None, tf_onednn: str | None = None,
               cuda_context: int | None = None, dataset_size: int | None = None, **options: Any) -> TfCpuTarget:
        _refuse_torch_options({"cuda_context": cuda_context, **options})
        if tf_memory is not None:
            raise SetupError(f"expected a GPU --device with --tf-memory, got --device {device.name}", where="--tf-memory")
        if dataset_size is not None and (isinstance(dataset_size, bool) or not isinstance(dataset_size, int)
                                         or not 1 <= dataset_size <= MAX_DATASET_SAMPLES):
            raise SetupError(f"expected a number of samples from 1 to {MAX_DATASET_SAMPLES:,}, got {dataset_size!r}",
                             where="--dataset-size")
        return cls(tf_onednn or "auto", dataset_size)

    def device_stream(self, trace: Trace) -> DeviceStream:
        from trainmem.targets.tf.cpu_process import device_events

        # TensorFlow's CPU kernels allocate their outputs through the one CPU allocator: the stream is the trace
        return DeviceStream(device_events(trace), {})

    def allocator(self) -> CpuTensorAllocator:
        return CpuTensorAllocator()

    def process_memory(self, source, setup, traced, stream: DeviceStream, replayed) -> ProcessMemory:
        from trainmem.targets.tf.cpu_process import tf_cpu_figures

        # model.fit's arrays: the batches of one epoch (the last one partial, as Keras's data adapter makes it)
        steps = -(-self.dataset_size // setup.batch_size) if self.dataset_size else None
        figures = tf_cpu_figures(traced, setup, onednn=self.onednn, steps=steps)
        words = [f"peak RSS {figures.process_bytes:,} B: " + " + ".join(f"{name} {value:,} B"
                                                                       for name, value in figures.parts.items()),
                 "tf_import_file is the file-backed part (TensorFlow's shared libraries' pages, page-cache dependent); "
                 "tf_import_anon, fit_machinery and graph_ops are anonymous memory of the runtime; dataset and "
                 "prefetch_batches the data model.fit holds; tensor_heap_resident the tensors as glibc keeps them",
                 f"high end {figures.process_high:,} B: library pages at their measured most and freed heap chunks "
                 "pinned",
                 "allocator path: oneDNN " + ("on, the MklCPUAllocator" if figures.onednn else "off, the default "
                                              "CPUAllocator") + f" ({figures.onednn_reason})"]
        numbers = {"tensor_peak": figures.tensor_peak, "allocator_peak": figures.allocator_peak,
                   "onednn": figures.onednn, "onednn_reason": figures.onednn_reason}
        rows = (("tensors (live storage)", figures.tensor_peak, f"{figures.tensor_peak:,} B"),
                ("allocated", figures.tensor_peak, "= tensors: TensorFlow's CPU allocator caches nothing"),
                ("process (peak RSS)", figures.process_bytes, ""))
        own = self._framework(setup, traced, replayed, figures.tensor_peak, numbers, words, rows)
        return ProcessMemory(dict(figures.parts), figures.process_high, list(source.notes),
                             list(figures.warnings) + unsupported_lines(traced), {}, own)


@dataclasses.dataclass(frozen=True)
class TfGpuTarget(_KerasTarget):
    device: Any  # devices.Device of kind cuda
    memory_mode: str = DEFAULT_MEMORY_MODE  # TensorFlow's GPU memory mode (targets/tf/gpu_memory.py parse_mode)
    cuda_context: int | None = None  # the CUDA context's bytes where given

    allocated_name = "get_memory_info peak"
    report_words = ReportWords("nvidia-smi", "as requested", "tf.config.experimental.get_memory_info('GPU:0')['peak']",
                               "the BFC regions TensorFlow took from cuMemAlloc", "in use (BFC)", "allocated_bytes",
                               "reserved_bytes", "", True, (("in use", "allocated_bytes"), ("BFC regions",
                                                                                            "reserved_bytes"),
                                                            ("nvidia-smi", "process_bytes")),
                               CudaTarget.report_words.keras_floor_contrast)
    runtime_words = "the BFC allocator's 256-byte chunk rounding and chunks kept whole"
    fit_margin = CudaTarget.fit_margin

    @classmethod
    def create(cls, device, setup, tf_memory: str | None = None, tf_onednn: str | None = None,
               cuda_context: int | None = None, dataset_size: int | None = None, **options: Any) -> TfGpuTarget:
        from trainmem.targets.tf.gpu_memory import parse_mode

        _refuse_torch_options(options)
        if dataset_size is not None:
            raise SetupError(f"expected --device cpu with --dataset-size (model.fit's arrays are in host RAM, not in "
                             f"{device.name}'s memory), got --device {device.name}", where="--dataset-size")
        if tf_onednn is not None:
            raise SetupError(f"expected --device cpu with --tf-onednn, got --device {device.name} (oneDNN and its "
                             "MklCPUAllocator are TensorFlow's CPU path)", where="--tf-onednn")
        mode = tf_memory or DEFAULT_MEMORY_MODE
        parse_mode(mode)  # a bad mode is refused before anything is traced
        return cls(device, mode, cuda_context)

    def device_stream(self, trace: Trace) -> DeviceStream:
        from trainmem.targets.tf.gpu_memory import device_streams

        return DeviceStream(device_streams(trace)[0], {})

    def allocator(self) -> TfBfcAllocator:
        from trainmem.targets.tf.gpu_memory import bfc_config, is_scratch

        return TfBfcAllocator(bfc_config(self.device, self.memory_mode, self.cuda_context), is_scratch)

    def process_memory(self, source, setup, traced, stream: DeviceStream, replayed) -> ProcessMemory:
        from trainmem.targets.tf.gpu_memory import tf_gpu_figures
        from trainmem.units import format_bytes

        figures = tf_gpu_figures(traced, self.device, self.memory_mode, context_bytes=self.cuda_context)
        numbers = {"memory_mode": figures.memory_mode, "memory_limit": figures.memory_limit,
                   "peak_in_use": figures.peak_in_use, "peak_in_use_high": figures.peak_in_use_high,
                   "region_bytes": figures.region_bytes, "region_bytes_high": figures.region_bytes_high,
                   "process_bytes": figures.process_bytes, "process_bytes_high": figures.process_bytes_high,
                   "needed_in_use": figures.needed_in_use, "out_of_memory": figures.out_of_memory,
                   "nvidia_smi_by_mode": self._modes(traced, figures)}
        words = list(figures.explanation) + [_mode_line(numbers["nvidia_smi_by_mode"])]
        tensors, regions = figures.replay.tensor_peak, figures.region_bytes
        rows = (("tensors (live storage)", tensors, f"{tensors:,} B as requested"),
                ("in use (peak)", figures.peak_in_use, f"{figures.peak_in_use:,} B  "
                 "tf.config.experimental.get_memory_info('GPU:0')['peak']"),
                ("BFC regions", regions, f"{regions:,} B  memory mode {figures.memory_mode}, limit "
                 f"{format_bytes(figures.memory_limit)}"),
                ("process (nvidia-smi)", figures.process_bytes, ""))
        own = self._framework(setup, traced, replayed, tensors, numbers, words, rows)
        return ProcessMemory(dict(figures.parts), figures.process_bytes_high, list(source.notes),
                             list(figures.warnings) + unsupported_lines(traced), {}, own)

    def _modes(self, traced, figures) -> dict[str, int]:
        """What nvidia-smi shows under each TensorFlow memory mode for the same step: the report explains the
        three numbers side by side (the default maps almost all memory, growth what the step needs)."""
        from trainmem.targets.tf.gpu_memory import tf_gpu_figures

        shown = {self.memory_mode: figures.process_bytes}
        for other in ("default", "growth"):
            if other not in shown:
                shown[other] = tf_gpu_figures(traced, self.device, other, context_bytes=self.cuda_context).process_bytes
        return shown


def _mode_line(shown: dict[str, int]) -> str:
    from trainmem.units import format_bytes

    return ("nvidia-smi by TensorFlow memory mode: " + ", ".join(f"{mode} {format_bytes(value)}" for mode, value in
                                                                 shown.items())
            + " (default maps the whole limit at start; growth maps regions as the step needs them; "
            "limit:SIZE one region of SIZE)")
