"""Keras: `check(model, x, batch_size=…)` before `model.fit(x, …)`, and `MemoryCheck`, a keras Callback that does the
same at on_train_begin and stops the fit with one line when it does not fit.

What is read off the compiled model: its optimizer (class → trainmem's optimizer: Adam, AdamW, SGD with or without
momentum, RMSprop, Adagrad, Adafactor, Lion; options that add state trainmem does not model, such as amsgrad,
RMSprop's momentum or centered, are refused in one line), its loss (the trace compiles the model's own loss:
trace/tf/fit_setup.py make_loss), gradient clipping by global norm (`global_clipnorm`), and Keras's global dtype
policy (mixed_float16, mixed_bfloat16, bfloat16). The batch: `x`'s shape and dtype per sample (an array, or a
list or dict of arrays as fit takes them) or, without `x`, the model's own inputs. Keras's fit takes batch_size 32
when none is given, and so does check.

The room is the CPU's (integrations/guard.py: MemAvailable plus this process's resident set). A Keras run on a
GPU is checked against the GPU named by `device=` ("a100-80gb": its capacity): TensorFlow does not say how much a
GPU has free the way torch.cuda.mem_get_info does.
"""

from __future__ import annotations

import logging
from typing import Any

from trainmem.errors import SetupError
from trainmem.install_hints import require

keras = require("keras", "tensorflow")

LOG = logging.getLogger("trainmem")
KERAS_DEFAULT_BATCH = 32  # keras.Model.fit's batch_size when none is given
_OPTIMIZERS = {"Adam": "adam", "AdamW": "adamw", "SGD": "sgd", "RMSprop": "rmsprop", "Adagrad": "adagrad",
               "Adafactor": "adafactor", "Lion": "lion"}
_POLICIES = {"mixed_float16": "fp16-mixed", "mixed_bfloat16": "bf16-mixed", "bfloat16": "bf16", "float32": None}


def check(model: Any, x: Any = None, batch_size: int | None = None, *, device: Any = "cpu",
          margin: float | None = None, **setup_values: Any) -> Any:
    """A Check (integrations/guard.py) of `model.fit(x, batch_size=batch_size)` on `device` (this machine's CPU,
    or a catalog GPU by name); `setup_values` are estimate()'s (they win over what is read off the model)."""
    from trainmem.estimate import estimate
    from trainmem.integrations.guard import verdict_of

    values = {**compiled_values(model), **input_values(x), **setup_values}
    values["batch_size"] = batch_size or values.get("batch_size") or KERAS_DEFAULT_BATCH
    where = str(device)
    if where.split(":")[0] == "cuda":
        raise SetupError("expected the GPU's name from `trainmem devices` (e.g. a100-80gb) for a Keras run, got "
                         f"{where!r}: TensorFlow does not say how much of a GPU is free", where="device")
    return verdict_of(estimate(model, device=where, **values), values["batch_size"], where, margin)


class MemoryCheck(keras.callbacks.Callback):
    """`model.fit(x, y, batch_size=64, callbacks=[MemoryCheck(batch_size=64)])`: Keras does not tell a callback the
    batch size, so it is given here (default 32, as fit's). `x`: a sample of the inputs for a model without
    declared inputs. The last Check is kept in `self.check`."""

    def __init__(self, batch_size: int = KERAS_DEFAULT_BATCH, x: Any = None, device: Any = "cpu",
                 margin: float | None = None, raise_if_not_fit: bool = True, **setup_values: Any) -> None:
        super().__init__()
        self.batch_size, self.x, self.device, self.margin = batch_size, x, device, margin
        self.raise_if_not_fit, self.setup_values = raise_if_not_fit, setup_values
        self.check: Any = None

    def on_train_begin(self, logs: Any = None) -> None:
        from trainmem.integrations.guard import DoesNotFit

        self.check = check(self.model, self.x, self.batch_size, device=self.device, margin=self.margin,
                           **self.setup_values)
        LOG.info("trainmem: %s", self.check.reason)
        if not self.check.fits and self.raise_if_not_fit:
            raise DoesNotFit(self.check)


def compiled_values(model: Any) -> dict[str, Any]:
    """The setup values of a compiled model's optimizer and of Keras's dtype policy (module docstring)."""
    values: dict[str, Any] = {}
    policy = keras.config.dtype_policy().name
    if policy not in _POLICIES:
        raise SetupError(f"expected a Keras dtype policy among {', '.join(_POLICIES)}, got {policy!r}",
                         where="keras.config.dtype_policy()")
    if _POLICIES[policy]:
        values["precision"] = _POLICIES[policy]
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return values
    name = type(optimizer).__name__
    if name == "LossScaleOptimizer":  # mixed_float16's wrapper: the optimizer inside decides the state
        optimizer, name = optimizer.inner_optimizer, type(optimizer.inner_optimizer).__name__
    if name not in _OPTIMIZERS:
        raise SetupError(f"expected a Keras optimizer trainmem models ({', '.join(_OPTIMIZERS)}), got {name}",
                         where="model.optimizer")
    unmodelled = [option for option in ("amsgrad", "centered") if getattr(optimizer, option, False)]
    if name == "RMSprop" and getattr(optimizer, "momentum", 0):
        unmodelled.append("momentum")
    if unmodelled:
        raise SetupError(f"expected {name} without {', '.join(unmodelled)} (state trainmem does not model yet)",
                         where="model.optimizer")
    kind = "momentum" if name == "SGD" and getattr(optimizer, "momentum", 0) else _OPTIMIZERS[name]
    values["optimizer"] = kind
    if getattr(optimizer, "global_clipnorm", None):
        values["max_grad_norm"] = float(optimizer.global_clipnorm)
    return values


def input_values(x: Any) -> dict[str, Any]:
    """input_shape / input_dtype per sample of `x` (an array, or a list or dict of arrays); {} without x."""
    if x is None:
        return {}
    arrays = list(x.values()) if isinstance(x, dict) else list(x) if isinstance(x, (list, tuple)) else [x]
    if not arrays or any(not hasattr(a, "shape") or len(a.shape) < 1 for a in arrays):
        raise SetupError("expected x as fit takes it: an array, or a list or dict of arrays, with the samples first",
                         where="x")
    shapes = [",".join(str(int(d)) for d in a.shape[1:]) or "scalar" for a in arrays]
    dtypes = [str(getattr(a.dtype, "name", a.dtype)) for a in arrays]
    return {"input_shape": shapes if len(shapes) > 1 else shapes[0],
            "input_dtype": dtypes if len(dtypes) > 1 else dtypes[0]}
