"""A TrainingSetup as Keras objects: the optimizer (with the hyperparameters trainmem uses for PyTorch,
trace/step.py make_optimizer), the loss, the dtype policy, and the shapes of one batch (x and y)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from trainmem.errors import SetupError
from trainmem.setup import Loss, Optimizer, OptimizerImpl, Precision, TrainingSetup

# the same learning rates as trace/step.py make_optimizer; the memory a Keras optimizer holds depends on
# which slots it keeps (keras/src/optimizers/*.py build()), which these choices fix:
#   sgd: none; momentum: `momentums`; adam/adamw: `momentums`, `velocities`; rmsprop (momentum 0, not
#   centered): `velocities`; adagrad: `accumulators`; adafactor: factored `r`/`c` and `v`; lion: `momentums`
_OPTIMIZERS = {
    Optimizer.SGD: ("SGD", {"learning_rate": 0.01}),
    Optimizer.MOMENTUM: ("SGD", {"learning_rate": 0.01, "momentum": 0.9}),
    Optimizer.ADAM: ("Adam", {"learning_rate": 1e-3}),
    Optimizer.ADAMW: ("AdamW", {"learning_rate": 1e-3, "weight_decay": 0.01}),
    Optimizer.RMSPROP: ("RMSprop", {"learning_rate": 1e-3}),
    Optimizer.ADAGRAD: ("Adagrad", {"learning_rate": 0.01}),
    Optimizer.ADAFACTOR: ("Adafactor", {"learning_rate": 0.01}),
    Optimizer.LION: ("Lion", {"learning_rate": 1e-4}),
}
# Keras dtype policies (keras/src/dtype_policies/dtype_policy.py): mixed_* keep float32 variables and
# compute in half precision; a bare "bfloat16" policy makes the variables bfloat16 too
POLICIES = {Precision.FP32: "float32", Precision.FP16_MIXED: "mixed_float16",
            Precision.BF16_MIXED: "mixed_bfloat16", Precision.BF16: "bfloat16"}


def check_supported(setup: TrainingSetup) -> None:
    """Refuse, in one line each, what a Keras fit step cannot be told to do."""
    unsupported = {  # the presets first: --qlora turns checkpointing on, --hf-trainer a fused AdamW
        "--qlora": setup.qlora,
        "--trainer": setup.trainer is not None,  # model.fit is the trainer (and --trainer hf is --hf-trainer)
        "--hf-trainer": setup.hf_trainer,
        "--torch-version": setup.torch_version is not None, "--seq-lengths": setup.seq_lengths is not None,
        "--grad-accum": setup.grad_accum != 1,
        "--checkpointing": setup.checkpointing,
        "--lora": setup.lora is not None,
        "--optimizer-impl": setup.optimizer_impl != OptimizerImpl.DEFAULT,
    }
    for flag, given in unsupported.items():
        if given:
            raise SetupError(f"expected no {flag} for a Keras model on TensorFlow (model.fit has no such "
                             f"option here), got {getattr(setup, flag[2:].replace('-', '_'))}", where=flag)
    if setup.precision == Precision.FP16_MIXED:
        # compile() wraps the optimizer in a LossScaleOptimizer (keras/src/optimizers/loss_scale_optimizer.py)
        # whose update runs inside a tf.cond on finite gradients: a branch this trace does not follow
        raise SetupError("expected --precision fp32, bf16-mixed or bf16 for a Keras model on TensorFlow, got "
                         "fp16-mixed (the loss-scaled update runs inside a conditional the trace does not follow)",
                         where=setup.flag_for("precision"))
    if setup.optimizer not in _OPTIMIZERS:
        names = ", ".join(str(o) for o in _OPTIMIZERS)
        raise SetupError(f"expected an optimizer Keras ships ({names}), got {setup.optimizer}",
                         where=setup.flag_for("optimizer"))


def make_optimizer(keras: Any, setup: TrainingSetup) -> Any:
    class_name, kwargs = _OPTIMIZERS[setup.optimizer]
    if setup.max_grad_norm is not None:
        kwargs = {**kwargs, "global_clipnorm": float(setup.max_grad_norm)}  # clip by the global norm, as clip_grad_norm_
    return getattr(keras.optimizers, class_name)(**kwargs)


def make_loss(keras: Any, setup: TrainingSetup, model: Any) -> tuple[Any, Loss]:
    """The loss to compile with: --loss, else the loss the model was compiled with, else cross-entropy."""
    kind = setup.loss
    if kind is None and getattr(model, "loss", None) is not None:
        return model.loss, Loss.CROSS_ENTROPY  # the model's own; its target is made like cross-entropy's
    kind = kind or Loss.CROSS_ENTROPY
    if kind == Loss.CROSS_ENTROPY:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True), kind
    if kind == Loss.MSE:
        return keras.losses.MeanSquaredError(), kind
    return (lambda y_true, y_pred: keras.ops.sum(y_pred)), kind


@contextlib.contextmanager
def dtype_policy(keras: Any, precision: Precision) -> Iterator[str]:
    """Keras's global dtype policy for the duration of the build, restored after."""
    name = POLICIES.get(precision)
    if name is None:
        raise SetupError(f"expected a precision among {', '.join(str(p) for p in POLICIES)}, got {precision}",
                         where="--precision")
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield name
    finally:
        keras.config.set_dtype_policy(before)


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    shapes: tuple[tuple[int, ...], ...]  # per input, with the batch dimension
    dtypes: tuple[str, ...]
    target_shape: tuple[int, ...] | None  # None: no target (the "sum" loss)
    target_dtype: str


def batch_spec(setup: TrainingSetup, model: Any, output_shape: tuple, loss: Loss) -> BatchSpec:
    """x from --input-shape (else the model's declared inputs), y from the loss and the output's shape."""
    batch = setup.batch_size
    if setup.inputs:
        shapes = tuple((batch, *spec.shape) for spec in setup.inputs)
        dtypes = tuple(spec.dtype for spec in setup.inputs)
    else:
        shapes, dtypes = _declared_inputs(model, batch)
    out = tuple(output_shape)
    if loss == Loss.CROSS_ENTROPY:  # sparse integer labels: one per output position, classes on the last axis
        target = (batch, *(setup.target_shape or out[1:-1]))
        return BatchSpec(shapes, dtypes, target, "int64")
    if loss == Loss.MSE:
        return BatchSpec(shapes, dtypes, (batch, *(setup.target_shape or out[1:])), "float32")
    return BatchSpec(shapes, dtypes, None, "float32")


def _declared_inputs(model: Any, batch: int) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    try:
        inputs = list(model.inputs)
    except (AttributeError, ValueError):
        inputs = []
    shapes, dtypes = [], []
    for tensor in inputs:
        dims = tuple(tensor.shape)[1:]
        if any(d is None for d in dims):
            raise SetupError(f"expected --input-shape for a model whose input {tensor.name} has unknown "
                             f"dimensions, got shape {tuple(tensor.shape)}", where="--input-shape")
        shapes.append((batch, *dims))
        dtypes.append(str(tensor.dtype))
    if not shapes:
        raise SetupError("expected --input-shape for a Keras model that declares no inputs (a subclassed "
                         "model, or one never built), got none", where="--input-shape")
    return tuple(shapes), tuple(dtypes)
