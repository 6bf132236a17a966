"""The terminal report of a Keras estimate on TensorFlow: TensorFlow's own numbers by their own names
(get_memory_info's peak, the BFC regions, nvidia-smi; peak RSS on the CPU), the breakdown in PyTorch's
categories, and the layer table as `model.summary()` prints it, with the memory of each layer."""

from __future__ import annotations

from typing import Any

from trainmem.estimate.result import module_label, step_label
from trainmem.report.style import table
from trainmem.targets import words_for
from trainmem.units import format_bytes


def _shape(shape: Any) -> str:
    if isinstance(shape, tuple) and shape and isinstance(shape[0], tuple):
        return ", ".join(_shape(item) for item in shape)
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")" if isinstance(shape, tuple) else str(shape)


def _peak_table(est) -> list[str]:
    """The target's labelled peak rows (targets/tf/target.py), the verdict beside the process's, the last."""
    verdict = f"of {format_bytes(est.device.capacity_bytes)}: " + ("fits" if est.fits else "DOES NOT FIT")
    rows = [[label, format_bytes(value), note] for label, value, note in est.framework.peak_rows]
    rows[-1][2] = verdict
    return table(rows, "lrl")


def _layer_table(est) -> list[str]:
    """model.summary()'s columns (Layer (type), Output Shape, Param #) and the memory of each layer."""
    at_peak = {row.module: row.bytes_at_peak for row in est.modules}
    rows = [["Layer (type)", "Output Shape", "Param #", "kept for backward", "at peak"]]
    rows += [[f"{row.name} ({row.class_name})", _shape(row.output_shape), f"{row.parameters:,}",
              format_bytes(row.activation_bytes), format_bytes(at_peak.get(row.name, 0))] for row in est.framework.layers]
    rest = at_peak.get(module_label(""), 0)
    rows.append([f"{module_label('')}: loss, gradients' tape, optimizer", "", "", "", format_bytes(rest)])
    return table(rows, "llrrr")


def _what_the_model_uses(est) -> list[str]:
    """On a GPU, what the step needs before what TensorFlow maps: in the default memory mode TensorFlow takes almost
    the whole card at start whatever the model (targets/tf/gpu_memory.py), so nvidia-smi's figure says little about
    the model; the line that makes TensorFlow map only what the step needs goes beside it."""
    figures = est.framework.figures
    by_mode = figures.get("nvidia_smi_by_mode")
    if not by_mode:  # the CPU: peak RSS is what the process uses
        return []
    lines = [f"The step needs {format_bytes(figures['needed_in_use'])} in use at its peak "
             f"(get_memory_info's peak); with memory growth nvidia-smi shows {format_bytes(by_mode['growth'])}."]
    if figures.get("memory_mode") == "default":
        lines.append(f"TensorFlow's default maps {format_bytes(by_mode['default'])} of the card at start, whatever the "
                     "model: call tf.config.experimental.set_memory_growth(gpu, True) for each GPU before the first "
                     "op (or set TF_FORCE_GPU_ALLOW_GROWTH=true) to map only what the step needs (here: --tf-memory "
                     "growth).")
    return lines + [""]


def render_keras(est) -> str:
    s = est.setup
    out = [f"trainmem — {est.model_name}: {est.parameters:,} parameters ({est.trainable_parameters:,} trainable) · "
           f"Keras on TensorFlow",
           f"  batch {s.batch_size} · {s.optimizer} (Keras's) · {s.precision} · device {est.device.name}",
           "  loop model.fit: one train_step per batch (forward, loss, GradientTape, optimizer.apply)", "",
           *_what_the_model_uses(est), "Peak memory (TensorFlow)", *_peak_table(est)]
    if est.process_bytes_high > est.process_bytes:
        out += table([["process, high end", format_bytes(est.process_bytes_high),
                        "the upper end of what real runs show (peak.process_bytes_high)"]], "lrl")
    out += ["", f"Where: {step_label(est.peak_step, s.steps)}, {est.peak_phase}, layer "
                f"'{module_label(est.peak_module)}', op {est.peak_op}", "", "Breakdown at the peak"]
    rows = [[k, format_bytes(v), f"{v:,} B"] for k, v in est.breakdown.items() if v]
    total = est.allocated_bytes
    out += table(rows + [["total", format_bytes(total), f"{total:,} B"]], "lrr")
    out += ["", f"Process memory ({words_for(est).process_counter})"]
    out += table([[k, format_bytes(v)] for k, v in est.process_parts.items()], "lr")
    out += ["", "What TensorFlow's numbers are"] + [f"  · {line}" for line in est.framework.explanation]
    out += ["", "Layers (as model.summary() lists them)", *_layer_table(est)]
    out += ["", "How this adds up (by hand → traced)"]
    for row in est.explanation.rows:
        out.append(f"  {row.what}: {row.formula} = {row.hand_bytes:,} B → traced {row.traced_bytes:,} B")
        if row.note:
            out.append(f"      {row.note}")
    out += ["", f"Order assumed: {est.framework.order}"]
    if est.warnings:
        out += ["", "Assumptions and warnings"] + [f"  - {w}" for w in est.warnings]
    return "\n".join(out)
