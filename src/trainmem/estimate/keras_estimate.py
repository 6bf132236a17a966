"""A Keras model on TensorFlow: resolve → trace the fit step (trace/keras_graph.py) → the target's figures
(targets/tf_cpu.py on the CPU, targets/tf_gpu.py on a GPU of the catalog) → an Estimate with the same JSON
keys as PyTorch's, plus a "keras" section (the Keras-style layer table, the TensorFlow figures explained).

What the common keys hold for TensorFlow:
    peak.tensor_bytes     live tensor bytes at their peak, as requested
    peak.allocated_bytes  GPU: tf.config.experimental.get_memory_info("GPU:0")["peak"] (BFC chunks in use);
                          CPU: the tensor peak with oneDNN off (the default CPUAllocator is malloc, it caches
                          nothing); with oneDNN on, the MklCPUAllocator pool's chunks in use at their peak
    peak.reserved_bytes   GPU: what the BFC regions hold (cuMemAlloc); CPU: null
    peak.process_bytes    GPU: nvidia-smi per process (context + regions); CPU: peak RSS of the fit process
No TensorFlow import here: the trace and the targets import it lazily.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.devices import Device, DeviceRef, get_device
from trainmem.estimate.result import Estimate
from trainmem.explain import Explanation, HandRow, saved_at_backward_start
from trainmem.setup import Optimizer, Precision, TrainingSetup
from trainmem.trace.events import Category

# Keras's per-parameter optimizer variables (keras/src/optimizers/*.py build): the slot names and how many
# values each keeps per parameter; adafactor's factored r/c are counted by the trace, not by hand
KERAS_SLOTS = {Optimizer.SGD: (), Optimizer.MOMENTUM: ("momentums",), Optimizer.ADAM: ("momentums", "velocities"),
               Optimizer.ADAMW: ("momentums", "velocities"), Optimizer.RMSPROP: ("velocities",),
               Optimizer.ADAGRAD: ("accumulators",), Optimizer.LION: ("momentums",)}
DEFAULT_MEMORY_MODE = "default"


@dataclasses.dataclass(frozen=True)
class KerasEstimate(Estimate):
    """An Estimate of a Keras model on TensorFlow: the common figures, and what only TensorFlow has."""

    framework: str = "keras"
    keras_backend: str = "tensorflow"
    layers: tuple = ()  # trace/keras_traced.py LayerRow, in the model's order
    tf_figures: dict[str, Any] = dataclasses.field(default_factory=dict)  # the target's own numbers
    tf_explanation: tuple[str, ...] = ()  # what each TensorFlow number is, in words
    order: str = ""  # the executor order the trace assumed

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["framework"] = {"name": self.framework, "keras_backend": self.keras_backend}
        out["keras"] = {
            "layers": [{"name": row.name, "class_name": row.class_name, "output_shape": _shape_list(row.output_shape),
                        "parameters": row.parameters, "activation_bytes": row.activation_bytes} for row in self.layers],
            "tensorflow": dict(self.tf_figures), "explanation": list(self.tf_explanation), "order": self.order}
        return out

    def __str__(self) -> str:
        from trainmem.report.keras_text import render_keras

        return render_keras(self)


def _shape_list(shape: Any) -> Any:
    if isinstance(shape, tuple):
        return [_shape_list(item) for item in shape]
    return shape


def estimate_keras(ref: Any, setup: TrainingSetup, device: DeviceRef = "cpu", *, depth: int = 2,
                   memory_mode: str | None = None, cuda_context: int | None = None, onednn: str | None = None,
                   **options: Any) -> KerasEstimate:
    """Estimate `ref` (a Keras reference, a keras.Model, or a frontends.keras_ref.KerasSource) training with
    `setup` on `device`: "cpu" or a GPU of the catalog. `memory_mode` is TensorFlow's GPU memory mode
    ("default", "growth", "limit:8GiB", "fraction:0.5"; targets/tf_gpu.py); `cuda_context` overrides the
    CUDA context bytes; `onednn` (auto|on|off, CPU only) whether the run has oneDNN and its MklCPUAllocator
    (alloc/tf_mkl_cpu.py onednn_choice; auto: as TensorFlow decides). Options of PyTorch's CUDA stack are refused."""
    from trainmem.frontends.keras_ref import KerasSource, resolve_keras
    from trainmem.trace.keras_graph import trace_keras

    torch_only = sorted(key for key, value in options.items() if value is not None)
    if torch_only:
        from trainmem.errors import SetupError

        flag = "--" + torch_only[0].replace("_", "-")
        raise SetupError(f"expected no {flag} for a Keras model on TensorFlow ({flag} describes PyTorch's CUDA run; "
                         "TensorFlow's GPU memory is set by --tf-memory)", where=flag)
    target = get_device(device)
    source = ref if isinstance(ref, KerasSource) else resolve_keras(ref, setup)
    if not isinstance(source, KerasSource):  # Keras on the torch backend: the torch engine's ModelSource
        from trainmem.estimate.orchestrate import estimate

        return estimate(source, setup=setup, device=target, depth=depth)
    if target.kind == "cuda" and onednn is not None:
        from trainmem.errors import SetupError

        raise SetupError(f"expected --device cpu with --tf-onednn, got --device {target.name} (oneDNN and its "
                         "MklCPUAllocator are TensorFlow's CPU path)", where="--tf-onednn")
    traced = trace_keras(source.build, setup, name=source.name)
    if target.kind == "cuda":
        return _on_gpu(source, setup, target, traced, memory_mode or DEFAULT_MEMORY_MODE, cuda_context)
    if memory_mode is not None:
        from trainmem.errors import SetupError

        raise SetupError(f"expected a GPU --device with --tf-memory, got --device {target.name}", where="--tf-memory")
    return _on_cpu(source, setup, target, traced, onednn or "auto")


def _on_cpu(source, setup: TrainingSetup, device: Device, traced, onednn: str = "auto") -> KerasEstimate:
    from trainmem.alloc.cpu_heap import replay_tensors
    from trainmem.targets.tf_cpu import device_events, tf_cpu_figures

    figures = tf_cpu_figures(traced, setup, onednn=onednn)
    events = device_events(traced.trace)
    replay = replay_tensors(events)
    requested: dict[Category, int] = {}
    for event in replay.live_at_peak.values():
        requested[event.category] = requested.get(event.category, 0) + event.nbytes
    breakdown = _charged_as_requested(requested, replay.peak_bytes)  # replay_tensors holds each 64-B aligned
    peak = events[replay.peak_index] if events else None
    words = [f"peak RSS {figures.process_bytes:,} B: " + " + ".join(f"{name} {value:,} B"
                                                                   for name, value in figures.parts.items()),
             "tf_import_file is the file-backed part (TensorFlow's shared libraries' pages, page-cache dependent); "
             "tf_import_anon, fit_machinery and graph_ops are anonymous memory of the runtime; dataset and "
             "prefetch_batches the data model.fit holds; tensor_heap_resident the tensors as glibc keeps them",
             f"high end {figures.process_high:,} B: library pages at their measured most and freed heap chunks pinned",
             "allocator path: oneDNN " + ("on, the MklCPUAllocator" if figures.onednn else "off, the default "
                                          "CPUAllocator") + f" ({figures.onednn_reason})"]
    return _estimate(source, setup, device, traced, breakdown, peak, replay.live_at_peak, figures.tensor_peak,
                     figures.process_bytes, figures.process_high, dict(figures.parts), list(figures.warnings), words,
                     {"tensor_peak": figures.tensor_peak, "allocator_peak": figures.allocator_peak,
                      "onednn": figures.onednn, "onednn_reason": figures.onednn_reason}, None, None, None)


def _on_gpu(source, setup: TrainingSetup, device: Device, traced, mode: str, context: int | None) -> KerasEstimate:
    from trainmem.targets.tf_gpu import device_streams, tf_gpu_figures

    figures = tf_gpu_figures(traced, device, mode, context_bytes=context)
    replay = figures.replay
    point = device_streams(traced.trace)[0]
    breakdown = _charged_as_requested(replay.requested_at_peak, replay.peak_in_use)  # BFC's 256-B chunks
    peak = point[replay.peak_index] if point and replay.peak_index < len(point) else None
    numbers = {"memory_mode": figures.memory_mode, "memory_limit": figures.memory_limit,
               "peak_in_use": figures.peak_in_use, "peak_in_use_high": figures.peak_in_use_high,
               "region_bytes": figures.region_bytes, "region_bytes_high": figures.region_bytes_high,
               "process_bytes": figures.process_bytes, "process_bytes_high": figures.process_bytes_high,
               "needed_in_use": figures.needed_in_use, "out_of_memory": figures.out_of_memory,
               "nvidia_smi_by_mode": _modes(traced, device, context, mode, figures)}
    words = list(figures.explanation) + [_mode_line(numbers["nvidia_smi_by_mode"])]
    return _estimate(source, setup, device, traced, breakdown, peak, replay.live_events, replay.tensor_peak,
                     figures.process_bytes,
                     figures.process_bytes_high, dict(figures.parts), list(figures.warnings), words, numbers,
                     figures.peak_in_use, figures.region_bytes, figures.fits)


def _modes(traced, device: Device, context: int | None, mode: str, figures) -> dict[str, int]:
    """What nvidia-smi shows under each TensorFlow memory mode for the same step: the report explains the
    three numbers side by side (the default maps almost all memory, growth what the step needs)."""
    from trainmem.targets.tf_gpu import tf_gpu_figures

    shown = {mode: figures.process_bytes}
    for other in ("default", "growth"):
        if other not in shown:
            shown[other] = tf_gpu_figures(traced, device, other, context_bytes=context).process_bytes
    return shown


def _mode_line(shown: dict[str, int]) -> str:
    from trainmem.units import format_bytes

    return ("nvidia-smi by TensorFlow memory mode: " + ", ".join(f"{mode} {format_bytes(value)}" for mode, value in
                                                                 shown.items())
            + " (default maps the whole limit at start; growth maps regions as the step needs them; "
            "limit:SIZE one region of SIZE)")


def _charged_as_requested(requested: dict[Category, int], held: int) -> dict[str, int]:
    """The one charging rule of every estimate (estimate/assemble.py breakdown_at_peak): the live tensors of each
    category at the bytes they asked for (count × item size), and what the allocator holds beyond them at the peak
    (64-byte alignment on the CPU, the BFC allocator's 256-byte chunks on a GPU) under `runtime`."""
    breakdown = {str(c): 0 for c in Category}
    for category, nbytes in requested.items():
        breakdown[str(category)] += nbytes
    breakdown[str(Category.RUNTIME)] += held - sum(requested.values())
    return breakdown


def _estimate(source, setup, device, traced, breakdown, peak, live, tensor_bytes, process, high, parts, warnings, words,
              numbers, allocated, reserved, fits) -> KerasEstimate:
    from trainmem.report.keras_text import module_rows

    said = " ".join(traced.warnings)  # the trace names its unsupported ops itself; said once
    unsupported = [f"TensorFlow op {op} ({count}×) has no memory rule: traced by its output sizes alone"
                   for op, count in sorted(traced.unsupported_ops.items()) if op not in said]
    return KerasEstimate(
        model_name=source.name, setup=setup, device=device, parameters=traced.parameters,
        trainable_parameters=traced.trainable_parameters, tensor_bytes=tensor_bytes, process_bytes=process,
        breakdown=breakdown, peak_phase=str(peak.phase) if peak else "", peak_module=peak.module if peak else "",
        peak_op=peak.op if peak else "", peak_step=peak.step if peak else 0,
        modules=module_rows(traced, live), warnings=tuple(list(source.notes) + list(traced.warnings) + warnings
                                                           + unsupported),
        explanation=explain_keras(traced, setup, breakdown, words), process_parts=parts,
        coverage={"ops": dict(traced.op_counts), "unsupported_ops": dict(traced.unsupported_ops),
                  "order": traced.order, "runtime_graph": traced.runtime_graph},
        allocated_bytes=allocated, reserved_bytes=reserved, fits_override=None if fits is None or fits else False,
        process_bytes_high=high, layers=tuple(traced.layers), tf_figures=numbers, tf_explanation=tuple(words),
        order=traced.order, resolved={"framework": "keras", "keras_backend": "tensorflow", "source": source.kind})


def explain_keras(traced, setup: TrainingSetup, breakdown: dict[str, int], words: list[str]) -> Explanation:
    """The hand arithmetic beside the trace, with Keras's names: weights, gradients, optimizer slots."""
    value_bytes = 2 if setup.precision == Precision.BF16 else 4
    params, trainable = traced.parameters, traced.trainable_parameters
    slots = KERAS_SLOTS.get(setup.optimizer)
    slot_formula = (f"{len(slots)} slots ({', '.join(slots) or 'none'}) × {trainable:,} × {value_bytes} B"
                    if slots is not None else f"{setup.optimizer}'s slots as Keras builds them")
    slot_hand = len(slots) * trainable * value_bytes if slots is not None else traced.optimizer_slot_bytes
    saved, by_op = saved_at_backward_start(traced)
    rows = (HandRow("parameters", f"{params:,} weights × {value_bytes} B (count_params(): trainable and not)",
                    params * value_bytes, breakdown["parameters"] + breakdown["buffers"]),
            HandRow("gradients", f"{trainable:,} trainable weights × {value_bytes} B", trainable * value_bytes,
                    breakdown["gradients"], "tape.gradient's results: tensors of the step, freed once applied"),
            HandRow("optimizer_state", slot_formula, slot_hand, traced.optimizer_slot_bytes,
                    "traced: every optimizer variable, the slots and its scalars (iterations, learning rate)"),
            HandRow("activations", "tensors the gradient ops read, alive when the backward begins", saved, saved,
                    "by op: " + ", ".join(f"{op} {n:,} B" for op, n in by_op.most_common(6))))
    return Explanation(rows, saved, dict(by_op.most_common()), tuple(words))
