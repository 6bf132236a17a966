"""`trainmem compare MODEL`: the same network estimated for PyTorch and for Keras on TensorFlow, side by
side, with the mechanism behind each difference.

MODEL is one both frameworks build from the same text: `mlp:…` or a layer spec (frontends/mlp.py,
frontends/spec.py for torch; frontends/keras/builders.py for Keras). Each framework is traced with its own
engine (trace/step.py, trace/tf/keras_graph.py) and target, so every figure is that framework's own; the
words below name what makes them differ (sources cited where the mechanism lives).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainmem.errors import ModelRefError, SetupError, quote
from trainmem.setup import TrainingSetup
from trainmem.units import format_bytes


@dataclasses.dataclass(frozen=True)
class CompareRow:
    what: str
    torch: int
    keras: int
    why: str  # the mechanism behind the difference (or the sameness)

    @property
    def difference(self) -> int:
        return self.keras - self.torch


@dataclasses.dataclass(frozen=True)
class Comparison:
    model: str
    device: str
    rows: tuple[CompareRow, ...]
    torch_peak: dict[str, Any]
    keras_peak: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "device": self.device,
                "rows": [{**dataclasses.asdict(row), "difference": row.difference} for row in self.rows],
                "torch": {"peak": self.torch_peak}, "keras": {"peak": self.keras_peak}}

    def __str__(self) -> str:
        from trainmem.report.style import table as aligned

        table = [["", "PyTorch", "Keras (TensorFlow)", "Keras − PyTorch"]]
        table += [[row.what, _value(row.what, row.torch), _value(row.what, row.keras),
                   _signed(row.what, row.difference)] for row in self.rows]
        out = [f"trainmem compare — {self.model} on {self.device}: PyTorch vs Keras on TensorFlow", *aligned(table, "lrrr"),
               "", "Why they differ"]
        out += [f"  · {row.what}: {row.why}" for row in self.rows]
        out += ["", f"Peak: PyTorch in {self.torch_peak['phase']} at {self.torch_peak['op']}; Keras in "
                    f"{self.keras_peak['phase']} at {self.keras_peak['op']} (layer {self.keras_peak['module']})"]
        return "\n".join(out)


def _value(what: str, value: int) -> str:
    return f"{value:,}" if what == "parameters" else format_bytes(value)


def _signed(what: str, value: int) -> str:
    if what == "parameters":
        return f"{value:+,}"
    return ("+" if value > 0 else "−" if value < 0 else "±") + format_bytes(abs(value))


def compare(model: str, setup: TrainingSetup | None = None, device: str = "cpu", *, tf_memory: str | None = None,
            **setup_values: Any) -> Comparison:
    """Estimate `model` (mlp:… or a layer spec) for PyTorch and for Keras on TensorFlow with `setup` (a
    TrainingSetup, or its values as keywords as estimate() takes them: batch_size=256, optimizer="adam");
    `tf_memory` is TensorFlow's GPU memory mode for the Keras side (targets/tf/gpu_memory.py)."""
    from trainmem.estimate import estimate
    from trainmem.estimate.orchestrate import setup_of
    from trainmem.frontends import Kind, reference_kind
    from trainmem.install_hints import missing_keras_side_line

    setup = setup_of(setup, setup_values, "compare()")

    if not isinstance(model, str) or reference_kind(model) not in (Kind.MLP, Kind.SPEC):
        raise ModelRefError(f"expected mlp:… or a layer spec (models both frameworks build from the same text), "
                            f"got {quote(model)}", where="MODEL")
    missing = missing_keras_side_line()
    if missing is not None:  # before the PyTorch side is traced, which would be wasted
        raise SetupError(missing, where="compare")
    torch_est = estimate(model, setup=setup, device=device, framework="torch")
    keras_est = estimate(model, setup=setup, device=device, framework="keras", keras_backend="tensorflow",
                         target_options={"tf_memory": tf_memory})
    rows = compare_rows(torch_est, keras_est)
    return Comparison(model, keras_est.device.name, rows, torch_est.to_dict()["peak"], keras_est.to_dict()["peak"])


def compare_rows(torch_est, keras_est) -> tuple[CompareRow, ...]:
    t, k = torch_est, keras_est
    t_saved, k_saved = t.explanation.saved_activation_bytes, k.explanation.saved_activation_bytes
    t_state = _row(t, "optimizer_state").hand_bytes
    k_state = _row(k, "optimizer_state").traced_bytes
    t_floor, k_floor = t.process_bytes - t.tensor_bytes, k.process_bytes - k.tensor_bytes
    return (
        CompareRow("parameters", t.parameters, k.parameters, _parameters_why(t, k)),
        CompareRow("weights at the peak", t.breakdown["parameters"] + t.breakdown["buffers"],
                   k.breakdown["parameters"] + k.breakdown["buffers"],
                   "the same values (4 B each in fp32); TensorFlow's GPU allocator rounds each variable to 256 B, "
                   "PyTorch's CPU allocator to 64 B and its CUDA one to 512 B"),
        CompareRow("gradients at the peak", t.breakdown["gradients"], k.breakdown["gradients"],
                   "PyTorch keeps each gradient in param.grad from backward until zero_grad (set_to_none) frees it; "
                   "TensorFlow's tape.gradient returns ordinary tensors the executor frees after their last "
                   "consumer, the optimizer's update op (keras/src/backend/tensorflow/trainer.py train_step)"),
        CompareRow("optimizer slots", t_state, k_state, _state_why(t, k, t_state, k_state)),
        CompareRow("activations kept for backward", t_saved, k_saved, _saved_why(t, k)),
        CompareRow("temporaries at the peak", t.breakdown["temporaries"], k.breakdown["temporaries"],
                   "each framework's peak falls at a different op (below); what is transient there differs: "
                   "TensorFlow's gradient ops of a layer (MatMul for dx and dW, BiasAddGrad) run as separate "
                   "kernels, PyTorch's addmm backward as mm and sum"),
        CompareRow("tensors at the peak", t.tensor_bytes, k.tensor_bytes,
                   "the sum of the rows above and the batch at each framework's own peak"),
        CompareRow("runtime floor", t_floor, k_floor, _floor_why(t, k)),
        CompareRow("process", t.process_bytes, k.process_bytes,
                   "peak RSS on the CPU, nvidia-smi on a GPU: the floor dominates a model this small"),
    )


def _row(est, what: str):
    return next(row for row in est.explanation.rows if row.what == what)


def _parameters_why(t, k) -> str:
    if t.parameters == k.parameters:
        return ("the same count: Dense(out) holds an in × out kernel and an out bias as Linear(in, out) does "
                "(keras/src/layers/core/dense.py build)")
    return ("Keras's count_params() includes non-trainable weights such as BatchNormalization's moving mean and "
            "variance, which PyTorch keeps as buffers outside parameters()")


def _state_why(t, k, t_state: int, k_state: int) -> str:
    extra = k_state - t_state
    return (f"{t.setup.optimizer}: PyTorch's state buffers (torch/optim) and Keras's slot variables "
            "(keras/src/optimizers, build) hold the same per-parameter values; Keras adds its scalar variables, "
            f"iterations (int64) and the learning rate (float32): {extra:+,} B here; PyTorch keeps a step count per "
            "parameter beside its state (counted in optimizer_scalars)")


def _saved_why(t, k) -> str:
    t_ops = ", ".join(f"{op} {format_bytes(n)}" for op, n in list(t.explanation.saved_by_op.items())[:4])
    k_ops = ", ".join(f"{op} {format_bytes(n)}" for op, n in list(k.explanation.saved_by_op.items())[:4])
    return ("PyTorch's autograd saves what each backward formula reads (addmm its input, relu its output: "
            "tools/autograd/derivatives.yaml); TensorFlow keeps a forward tensor while a gradient op still reads it "
            "(MatMul's gradient reads its inputs, ReluGrad the Relu's output; BiasAdd's gradient only the incoming "
            f"gradient). PyTorch: {t_ops}; Keras: {k_ops}")


def _floor_why(t, k) -> str:
    t_parts = ", ".join(f"{name} {format_bytes(v)}" for name, v in t.process_parts.items())
    k_parts = ", ".join(f"{name} {format_bytes(v)}" for name, v in k.process_parts.items())
    from trainmem.targets import report_words

    return f"{report_words(t.device).keras_floor_contrast} PyTorch: {t_parts}; Keras: {k_parts}"
