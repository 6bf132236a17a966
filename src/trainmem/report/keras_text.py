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


def render_keras(est) -> str:
    s = est.setup
    out = [f"trainmem — {est.model_name}: {est.parameters:,} parameters ({est.trainable_parameters:,} trainable) · "
           f"Keras on TensorFlow",
           f"  batch {s.batch_size} · {s.optimizer} (Keras's) · {s.precision} · device {est.device.name}",
           "  loop model.fit: one train_step per batch (forward, loss, GradientTape, optimizer.apply)", "",
           "Peak memory (TensorFlow)", *_peak_table(est)]
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
