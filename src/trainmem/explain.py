"""'How this adds up': the hand arithmetic a teacher would do, next to what the trace found, with
each difference named. Formulas explain; the trace computes."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

from trainmem.setup import Optimizer, Precision, TrainingSetup
from trainmem.trace.events import Category, Phase

# per-parameter state buffers each optimizer keeps (torch/optim/*.py)
STATE_BUFFERS = {Optimizer.SGD: (), Optimizer.MOMENTUM: ("momentum_buffer",),
                 Optimizer.ADAM: ("exp_avg", "exp_avg_sq"), Optimizer.ADAMW: ("exp_avg", "exp_avg_sq"),
                 Optimizer.RMSPROP: ("square_avg",), Optimizer.ADAGRAD: ("sum",), Optimizer.LION: ("exp_avg",),
                 Optimizer.PAGED_ADAMW: ("state1", "state2")}


@dataclasses.dataclass(frozen=True)
class HandRow:
    """One line of the hand arithmetic: what, the formula, its bytes, and what the trace found."""

    what: str
    formula: str
    hand_bytes: int
    traced_bytes: int
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Explanation:
    rows: tuple[HandRow, ...]
    saved_activation_bytes: int  # activations (and the batch) alive when the last step's backward begins
    saved_by_op: dict[str, int]  # the same, by the op that made them, largest first
    differences: tuple[str, ...]  # what the hand arithmetic leaves out, named

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [dataclasses.asdict(row) for row in self.rows],
                "saved_activation_bytes": self.saved_activation_bytes, "saved_by_op": dict(self.saved_by_op),
                "differences": list(self.differences)}


def optimizer_state_hand(setup: TrainingSetup, trainable: int, shapes: list[tuple[int, ...]],
                         value_bytes: int) -> tuple[str, int]:
    """The textbook size of the optimizer's state: (formula, bytes)."""
    kind = setup.optimizer
    if kind == Optimizer.PAGED_ADAMW:  # bitsandbytes keeps 32-bit state whatever the parameters' dtype
        value_bytes = 4
    if kind in (Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT):
        blocks = -(-trainable // 256)
        return (f"2 buffers (state1, state2) × {trainable:,} × 1 B + 2 × {blocks:,} blocks of 256 × 4 B absmax "
                "(tensors under 4,096 elements keep fp32 state)", 2 * trainable + 8 * blocks)
    if kind == Optimizer.ADAFACTOR:
        # torch/optim/_adafactor.py: a row and a column second moment per matrix, a full one per vector
        values = sum(math.prod(s) // s[-1] + math.prod(s) // s[-2] if len(s) > 1 else math.prod(s) for s in shapes)
        return (f"factored second moments: rows + columns per matrix, full per vector = {values:,} values × 4 B",
                values * 4)
    buffers = STATE_BUFFERS[kind]
    return (f"{len(buffers)} buffers ({', '.join(buffers) or 'none'}) × {trainable:,} × {value_bytes} B",
            len(buffers) * trainable * value_bytes)


def saved_at_backward_start(traced) -> tuple[int, Counter]:
    """Bytes of activations (and the batch) alive when the last step's first backward begins, by op."""
    trace = traced.trace
    last = max((e.step for e in trace.events), default=0)
    live: dict[int, Any] = {}
    for event in trace.events:
        if event.phase == Phase.BACKWARD and event.step == last:
            break
        if event.action == "alloc":
            live[event.sid] = trace.storages[event.sid]
        else:
            live.pop(event.sid, None)
    by_op: Counter = Counter()
    for record in live.values():
        if record.category == Category.ACTIVATIONS:
            by_op[record.op] += record.nbytes
        elif record.category == Category.INPUTS:
            by_op["inputs (the batch)"] += record.nbytes
    return sum(by_op.values()), by_op


def explain(traced, setup: TrainingSetup, breakdown: dict[str, int], runtime_words: str) -> Explanation:
    """The hand arithmetic beside the trace; `runtime_words` says what the target's `runtime` holds."""
    value_bytes = 2 if setup.precision == Precision.BF16 else 4
    params, trainable = traced.parameters, traced.trainable_parameters
    state_formula, state_bytes = optimizer_state_hand(setup, trainable, traced.trainable_shapes, value_bytes)
    batch = setup.batch_size
    layer_outputs = sum(n for m, n in traced.output_elements.items() if m in traced.parameter_modules) // batch
    input_values = _traced_input_values(traced, batch)
    saved_bytes, saved_by_op = saved_at_backward_start(traced)
    rows = [
        _row("parameters", f"{params:,} parameters × {value_bytes} B", params * value_bytes, breakdown["parameters"]),
        _row("gradients", f"{trainable:,} trainable parameters × {value_bytes} B", trainable * value_bytes,
             breakdown["gradients"], "at the peak" if breakdown["gradients"] else
             "none alive at the peak (zero_grad sets them to None; the peak is before they exist)"),
        _row("optimizer_state", state_formula, state_bytes, breakdown["optimizer_state"],
             "created by the first optimizer.step(); the peak of step 1 predates it" if not breakdown["optimizer_state"] and state_bytes else ""),
    ]
    if input_values:
        hand_values = input_values + 2 * layer_outputs
        rows.append(_row(
            "activations",
            f"per sample: {input_values:,} inputs + {layer_outputs:,} layer outputs = {input_values + layer_outputs:,} "
            f"activations, + {layer_outputs:,} output gradients = {hand_values:,} values × {batch} × {value_bytes} B",
            hand_values * batch * value_bytes, saved_bytes,
            "traced: tensors autograd keeps from forward to backward, by op: " + ", ".join(
                f"{op} {n:,} B" for op, n in saved_by_op.most_common(6))))
    return Explanation(tuple(rows), saved_bytes, dict(saved_by_op.most_common()),
                       tuple(_differences(breakdown, saved_by_op, setup, _loop_words(traced, setup), runtime_words)))


def _loop_words(traced, setup: TrainingSetup) -> str:
    """The loop whose names keep batches alive: the loop the frontend resolved where one did (a Keras model:
    model.fit's, trace/keras_torch_step.py puts it in the trace's resolved values), else the --loop traced."""
    resolved = getattr(traced, "resolved", None) or {}
    if resolved.get("loop"):
        return resolved["loop"].split("'s ")[0]  # its name, before the words that explain it ("model.fit's (…)")
    return f"{setup.loop}"


def _traced_input_values(traced, batch: int) -> int:
    """Values per sample in the batch the first step made (whatever made it: flags or make_batch)."""
    return sum(math.prod(record.shape) for record in traced.trace.storages.values()
               if record.phase == Phase.INPUTS and record.step == 0) // batch


def _row(name: str, formula: str, hand: int, traced: int, note: str = "") -> HandRow:
    return HandRow(name, formula, hand, traced, note)


def _differences(breakdown: dict[str, int], saved_by_op: Counter, setup: TrainingSetup, loop: str,
                 runtime_words: str) -> list[str]:
    notes = []
    if breakdown.get("inputs"):
        notes.append(f"inputs at the peak: {breakdown['inputs']:,} B (batches and targets the {loop} loop holds: "
                     "kept for backward, bound to its names, or the next one being made)")
    if breakdown.get("temporaries"):
        notes.append(f"temporaries at the peak: {breakdown['temporaries']:,} B (op outputs that die within the phase, "
                     "e.g. gradients flowing between layers in backward)")
    if breakdown.get("optimizer_scalars"):
        notes.append(f"optimizer scalars: {breakdown['optimizer_scalars']:,} B (step counters, GradScaler scale)")
    if breakdown.get("runtime"):
        notes.append(f"runtime: {breakdown['runtime']:,} B ({runtime_words})")
    if breakdown.get("checkpoint"):
        notes.append(f"checkpoint: {breakdown['checkpoint']:,} B (the loaded checkpoint's copies, --load {setup.load}: "
                     "alive beside the parameters until `del checkpoint`)")
    if "relu" in saved_by_op or "threshold_backward" in saved_by_op:
        notes.append("ReLU keeps its output; the next Linear keeps the same tensor as its input (one storage)")
    if "_log_softmax" in saved_by_op:
        notes.append("cross-entropy keeps the log-softmax of the logits for backward")
    if "native_dropout" in saved_by_op:
        notes.append("dropout keeps a 1-byte mask per element")
    if setup.precision in (Precision.FP16_MIXED, Precision.BF16_MIXED):
        notes.append("autocast keeps low-precision copies of weights and activations for backward; "
                     "master weights, gradients and optimizer state stay fp32")
    return notes
