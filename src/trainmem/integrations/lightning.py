"""Lightning: `MemoryCheck`, a Callback that estimates the fit as the Trainer is about to run it, logs the figures,
and stops it with one line before the first step when it does not fit; with `pick_batch_size=True` it sets the
largest batch that fits instead, as Lightning's BatchSizeFinder does, without a trial step.

`on_fit_start` runs after the strategy moved the module to its device and created the optimizers, and before the
fit loop loads its data (lightning 2.x trainer.py _run). What is read:
- the step: the LightningModule's own training_step(batch, batch_idx), traced whole (the module wrapped so that
  its forward is training_step and its output the loss), in Lightning's automatic-optimization loop
  (--loop lightning: zero_grad between forward and backward; lightning-iterable for a loader without a length);
- precision: "32-true", "bf16-mixed", "16-mixed" (a GradScaler), "bf16-true" (the module is already bf16);
- accumulate_grad_batches; gradient_clip_val with the "norm" algorithm (clip_grad_norm_; "value" clips in place
  and allocates nothing);
- the optimizer: trainer.optimizers[0], unwrapped (integrations/live.py);
- one batch: the train dataloader's first, from its dataset and collate_fn (live.first_batch). The dataloader is
  asked for as the fit loop will ask (the module's or datamodule's train_dataloader(), or the loader given to fit).
- the strategy: one device, or DDP (--strategy ddp over the Trainer's world size, its bucket_cap_mb and
  gradient_as_bucket_view); every rank checks its own device.
Refused in one line: manual optimization, several optimizers, other strategies (Lightning's FSDP is FSDP1, which
trainmem does not model), other precisions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from trainmem.errors import SetupError
from trainmem.install_hints import require

lightning = require("lightning", "lightning")
torch = require("torch", "torch")

LOG = logging.getLogger("trainmem")
_PRECISIONS = {"32-true": None, "32": None, "bf16-mixed": "bf16-mixed", "16-mixed": "fp16-mixed",
               "bf16-true": None}  # bf16-true: the plugin converted the module, so its weights say bf16


class MemoryCheck(lightning.pytorch.Callback):
    """`Trainer(callbacks=[MemoryCheck()])`. `device`: plan for another device (a catalog name such as
    "a100-80gb", whose capacity is then the room) instead of the memory free where the module is; `margin`: as
    trainmem fit's; `pick_batch_size`: set the largest batch that fits on the module, its hparams or the
    datamodule (their `batch_size`, as BatchSizeFinder); `raise_if_not_fit=False` only logs. The last Check is
    kept in `self.check`, the batch picked in `self.batch_size`."""

    def __init__(self, device: Any = None, margin: float | None = None, pick_batch_size: bool = False,
                 raise_if_not_fit: bool = True, **setup_values: Any) -> None:
        self.device, self.margin, self.pick, self.raise_if_not_fit = device, margin, pick_batch_size, raise_if_not_fit
        self.setup_values = setup_values
        self.check: Any = None
        self.batch_size: int | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        from trainmem.integrations.guard import DoesNotFit, check, find_batch_size
        from trainmem.integrations.live import first_batch

        loader = trainer.fit_loop._data_source.dataloader()  # what the fit loop's setup_data will request
        batch = first_batch(loader)
        step = TrainingStep(pl_module, batch, half_inputs=str(trainer.precision) == "bf16-true")
        options = dict(loss_fn=_output_is_loss, device=self.device, margin=self.margin,
                       **{**trainer_values(trainer, loader), **self.setup_values})
        optimizer = trainer.optimizers[0]
        if self.pick:  # no larger than the dataset, where it has a length: a larger batch is the whole dataset
            limit = len(loader.dataset) if _has_length(loader.dataset) else 1 << 24
            self.batch_size = find_batch_size(step, optimizer, batch, limit=limit, **options)
            _set_batch_size(trainer, pl_module, self.batch_size)
            options["batch_size"] = self.batch_size
        self.check = check(step, optimizer, batch, **options)
        LOG.info("trainmem: %s", self.check.reason)
        _log_figures(trainer, self.check)
        if not self.check.fits and self.raise_if_not_fit:
            raise DoesNotFit(self.check)


def trainer_values(trainer: Any, loader: Any) -> dict[str, Any]:
    """The setup values the Trainer decides (module docstring)."""
    if not trainer.lightning_module.automatic_optimization:
        raise SetupError("expected automatic optimization (manual optimization's training_step is the user's own "
                         "loop), got automatic_optimization=False", where="MemoryCheck")
    if len(trainer.optimizers) != 1:
        raise SetupError(f"expected one optimizer, got {len(trainer.optimizers)}", where="MemoryCheck")
    precision = str(trainer.precision)
    if precision not in _PRECISIONS:
        raise SetupError(f"expected precision {', '.join(_PRECISIONS)}, got {precision!r}", where="Trainer(precision)")
    values: dict[str, Any] = {"grad_accum": trainer.accumulate_grad_batches,
                              "loop": "lightning" if _has_length(loader) else "lightning-iterable"}
    if _PRECISIONS[precision]:
        values["precision"] = _PRECISIONS[precision]
    values.update(strategy_values(trainer))
    if trainer.gradient_clip_val and str(trainer.gradient_clip_algorithm) in ("norm", "GradClipAlgorithmType.NORM"):
        values["max_grad_norm"] = float(trainer.gradient_clip_val)
    return values


def strategy_values(trainer: Any) -> dict[str, Any]:
    """One device: nothing; DDP (ddp, ddp_spawn, ddp_fork …: DDPStrategy) over the Trainer's world size."""
    strategies = lightning.pytorch.strategies
    strategy = trainer.strategy
    if isinstance(strategy, strategies.SingleDeviceStrategy) and trainer.world_size == 1:
        return {}
    if not isinstance(strategy, strategies.DDPStrategy):
        raise SetupError(f"expected one device or DDP, got {type(strategy).__name__} (trainmem models FSDP2, not "
                         "Lightning's FSDP1, and not DeepSpeed yet)", where="Trainer(strategy)")
    kwargs = getattr(strategy, "_ddp_kwargs", {}) or {}
    values: dict[str, Any] = {"strategy": "ddp", "world_size": trainer.world_size}
    if kwargs.get("bucket_cap_mb"):
        values["ddp_bucket_mb"] = float(kwargs["bucket_cap_mb"])
    if kwargs.get("gradient_as_bucket_view"):
        values["gradient_as_bucket_view"] = True
    return values


def _has_length(loader: Any) -> bool:
    """Lightning's fetcher reads one batch ahead only when the loader has no length (fetchers.py)."""
    try:
        len(loader)
    except (TypeError, NotImplementedError):  # an IterableDataset's loader raises TypeError
        return False
    return True


class TrainingStep(torch.nn.Module):
    """The LightningModule seen as a model whose forward is its training_step and whose output is the loss: the
    batch comes back in the form the loader gives it (a tensor, a sequence, a dict)."""

    def __init__(self, module: Any, batch: Any, half_inputs: bool = False) -> None:
        super().__init__()
        self.module = module
        # bf16-true: the Trainer casts the batch's floating tensors to bfloat16 before training_step
        # (plugins/precision/half.py convert_input); the fp32 batch dies there, here it is kept: the high side
        self.half_inputs = half_inputs
        self.form = "mapping" if isinstance(batch, Mapping) else "sequence" if isinstance(batch, (tuple, list)) \
            else "tensor"

    def forward(self, *inputs: Any, **named: Any) -> Any:
        import warnings

        if self.half_inputs:
            inputs = tuple(_bf16(value) for value in inputs)
            named = {key: _bf16(value) for key, value in named.items()}
        batch = named if self.form == "mapping" else list(inputs) if self.form == "sequence" else inputs[0]
        with warnings.catch_warnings():  # self.log() on the detached copy says it does nothing: it is meant to
            warnings.filterwarnings("ignore", message=r"You are trying to `self.log\(\)`")
            output = self.module.training_step(batch, 0)
        return output["loss"] if isinstance(output, Mapping) else output

    def __deepcopy__(self, memo: dict) -> TrainingStep:
        """The meta copy (frontends/module_object.py) copies the module, not the Trainer it is attached to: every
        LightningModule in it is detached (`_trainer`, as before a Trainer exists) while it is copied. self.log()
        in the copy then does nothing, as Lightning allows for a step run without a Trainer."""
        import copy

        attached = [(module, module._trainer) for module in self.module.modules() if hasattr(module, "_trainer")]
        try:
            for module, _ in attached:
                module._trainer = None
            twin = TrainingStep.__new__(TrainingStep)
            memo[id(self)] = twin
            twin.__dict__.update(copy.deepcopy(self.__dict__, memo))
        finally:
            for module, trainer in attached:
                module._trainer = trainer
        return twin


def _log_figures(trainer: Any, verdict: Any) -> None:
    """The figures to the Trainer's loggers, as a callback logs (TensorBoard, CSV, W&B alike): at step 0."""
    figures = {"trainmem/process_bytes": verdict.estimate.process_bytes,
               "trainmem/process_bytes_high": verdict.needed_bytes, "trainmem/room_bytes": verdict.room_bytes,
               "trainmem/batch_size": verdict.batch_size}
    for logger in trainer.loggers:
        logger.log_metrics(figures, step=0)


def _bf16(value: Any) -> Any:
    return value.to(torch.bfloat16) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _output_is_loss(output: Any, inputs: Any) -> Any:
    return output


def _set_batch_size(trainer: Any, pl_module: Any, batch_size: int) -> None:
    """Where BatchSizeFinder sets it (lightning_setattr: the module, its hparams, the datamodule), and the fit
    loop's loader dropped so that it is requested again at that size (as BatchSizeFinder's reset does)."""
    from lightning.pytorch.utilities.parsing import lightning_hasattr, lightning_setattr

    if not lightning_hasattr(pl_module, "batch_size"):
        raise SetupError("expected a `batch_size` attribute on the LightningModule, its hparams or the datamodule "
                         "to set (pick_batch_size=True, as Lightning's BatchSizeFinder needs), found none",
                         where="MemoryCheck")
    lightning_setattr(pl_module, "batch_size", batch_size)
    trainer.fit_loop._combined_loader = None
