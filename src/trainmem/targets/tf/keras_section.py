"""What a Keras estimate on TensorFlow reports beside the common figures: the `framework` section of the Estimate
(`KerasSection`: the layer table as `model.summary()` lists it, TensorFlow's own numbers and what each is), the
per-layer rows and the hand arithmetic in Keras's names. The TensorFlow targets (targets/tf/target.py) build it;
report/keras_text.py renders it. No TensorFlow import."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.setup import Optimizer, Precision, TrainingSetup

# Keras's per-parameter optimizer variables (keras/src/optimizers/*.py build): the slot names and how many
# values each keeps per parameter; adafactor's factored r/c are counted by the trace, not by hand
KERAS_SLOTS = {Optimizer.SGD: (), Optimizer.MOMENTUM: ("momentums",), Optimizer.ADAM: ("momentums", "velocities"),
               Optimizer.ADAMW: ("momentums", "velocities"), Optimizer.RMSPROP: ("velocities",),
               Optimizer.ADAGRAD: ("accumulators",), Optimizer.LION: ("momentums",)}


@dataclasses.dataclass(frozen=True)
class KerasSection:
    """The Estimate's `framework` section for a Keras model on TensorFlow: what only TensorFlow has."""

    layers: tuple = ()  # trace/tf/keras_facts.py LayerRow, in the model's order
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)  # the target's own numbers
    explanation: tuple[str, ...] = ()  # what each TensorFlow number is, in words
    order: str = ""  # the executor order the trace assumed
    # the peak table of the text report, (label, bytes, what the figure is), the process's last (the report puts
    # the verdict beside it)
    peak_rows: tuple[tuple[str, int, str], ...] = ()
    name: str = "keras"
    keras_backend: str = "tensorflow"
    report_words: Any = None  # targets.ReportWords: what the reports call the figures on the target that made it

    def to_json(self) -> dict[str, Any]:
        """The keys this section adds to the estimate's JSON."""
        return {"framework": {"name": self.name, "keras_backend": self.keras_backend},
                "keras": {"layers": [{"name": row.name, "class_name": row.class_name,
                                      "output_shape": _shape_list(row.output_shape), "parameters": row.parameters,
                                      "activation_bytes": row.activation_bytes} for row in self.layers],
                          "tensorflow": dict(self.figures), "explanation": list(self.explanation),
                          "order": self.order}}

    def quiet_note(self) -> str:
        """After --quiet's answer: in TensorFlow's default GPU memory mode, what the step needs apart from the card
        TensorFlow maps at start (report/keras_text.py says how to map only that)."""
        by_mode = self.figures.get("nvidia_smi_by_mode")
        if not by_mode or self.figures.get("memory_mode") != "default":
            return ""
        from trainmem.units import format_bytes

        return (f"; TensorFlow's default maps the card at start: with memory growth "
                f"(tf.config.experimental.set_memory_growth) {format_bytes(by_mode['growth'])}")

    def render(self, est: Any) -> str:
        """The terminal report of the estimate this section belongs to."""
        from trainmem.report.keras_text import render_keras

        return render_keras(est)


def _shape_list(shape: Any) -> Any:
    if isinstance(shape, tuple):
        return [_shape_list(item) for item in shape]
    return shape


def layer_rows(traced: Any, live: dict[int, Any]) -> tuple:
    """One row per Keras layer (the trace's layer table, in the model's order) and one for what no layer owns
    (the loss, the optimizer's updates): parameters, activations kept for backward, bytes alive at the peak."""
    from trainmem.estimate.result import ModuleRow, module_label

    at_peak: dict[str, int] = {}
    for event in live.values():
        at_peak[event.module] = at_peak.get(event.module, 0) + event.nbytes
    rows = [ModuleRow(row.name, row.parameters, row.activation_bytes, at_peak.pop(row.name, 0))
            for row in traced.framework.layers]
    rest = sum(at_peak.values())
    return tuple(rows + [ModuleRow(module_label(""), 0, 0, rest)])


def unsupported_lines(traced: Any) -> list[str]:
    """The TensorFlow ops without a memory rule that the trace's own warnings do not name yet."""
    said = " ".join(traced.warnings)  # the trace names its unsupported ops itself; said once
    return [f"TensorFlow op {op} ({count}×) has no memory rule: traced by its output sizes alone"
            for op, count in sorted(traced.framework.unsupported_ops.items()) if op not in said]


def keras_coverage(traced: Any) -> dict[str, Any]:
    return {"ops": dict(traced.op_counts), "unsupported_ops": dict(traced.framework.unsupported_ops),
            "order": traced.framework.order, "runtime_graph": traced.framework.runtime_graph}


def explain_keras(traced: Any, setup: TrainingSetup, breakdown: dict[str, int], words: list[str]) -> Any:
    """The hand arithmetic beside the trace, with Keras's names: weights, gradients, optimizer slots."""
    from trainmem.explain import Explanation, HandRow, saved_at_backward_start

    value_bytes = 2 if setup.precision == Precision.BF16 else 4
    params, trainable = traced.parameters, traced.trainable_parameters
    slot_bytes = traced.framework.optimizer_slot_bytes
    slots = KERAS_SLOTS.get(setup.optimizer)
    slot_formula = (f"{len(slots)} slots ({', '.join(slots) or 'none'}) × {trainable:,} × {value_bytes} B"
                    if slots is not None else f"{setup.optimizer}'s slots as Keras builds them")
    slot_hand = len(slots) * trainable * value_bytes if slots is not None else slot_bytes
    saved, by_op = saved_at_backward_start(traced)
    rows = (HandRow("parameters", f"{params:,} weights × {value_bytes} B (count_params(): trainable and not)",
                    params * value_bytes, breakdown["parameters"] + breakdown["buffers"]),
            HandRow("gradients", f"{trainable:,} trainable weights × {value_bytes} B", trainable * value_bytes,
                    breakdown["gradients"], "tape.gradient's results: tensors of the step, freed once applied"),
            HandRow("optimizer_state", slot_formula, slot_hand, slot_bytes,
                    "traced: every optimizer variable, the slots and its scalars (iterations, learning rate)"),
            HandRow("activations", "tensors the gradient ops read, alive when the backward begins", saved, saved,
                    "by op: " + ", ".join(f"{op} {n:,} B" for op, n in by_op.most_common(6))))
    return Explanation(rows, saved, dict(by_op.most_common()), tuple(words))
