"""The pieces of a training step, one piece of code for the fake trace and the real measurement:
a micro-batch, forward, loss, backward (through GradScaler for fp16-mixed), optimizer step (after
clipping), zero_grad (set_to_none unless --zero-grad zeros). How they are put together, and which
Python names keep the batch, the outputs and the loss alive meanwhile, is the user's loop: trace/loops.py.
An observer is told of each phase so that the recorder can label events; the real run passes a no-op observer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import math
from typing import Any

import torch

from trainmem.errors import SetupError
from trainmem.frontends import ModelSource
from trainmem.setup import MAX_ELEMENTS, Loss, Optimizer, OptimizerImpl, Precision, TrainingSetup, ZeroGrad
from trainmem.trace.cast_batch import CastBatch
from trainmem.trace.checkpointing import checkpoint_blocks
from trainmem.trace.compiled import compile_forward
from trainmem.trace.events import Phase
from trainmem.trace.trainer_forward import autocast_caches, autocast_covers_loss, wrapped_forward

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8,
           "bool": torch.bool}


class Observer:
    """What the step tells whoever watches it. The recorder overrides these; a real run ignores them."""

    def phase(self, phase: Phase, step: int) -> None: ...

    def after_backward(self, model: torch.nn.Module) -> None: ...

    def after_optimizer(self, optimizer: torch.optim.Optimizer, scaler: Any) -> None: ...

    def after_keras_optimizer(self, optimizer: Any) -> None:
        """A Keras model's step (trace/keras_torch_step.py): its Keras optimizer has built or updated."""

    def loop_mark(self, kind: str, tensors: Any = None) -> None:
        """The lean loop (trace/loops.py) bound or dropped a name here: `kind`, and the tensors it dropped."""


@dataclasses.dataclass
class Prepared:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any
    make_batch: Any
    loss_fn: Any
    make_target: Any  # batch_size -> target tensor, with --target-shape and a built-in loss; else None
    checkpointed: list[str]
    device_type: str = "cpu"  # where the real run happens: autocast and GradScaler follow it
    cuda_semantics: bool = False  # a CPU trace of a CUDA run: CUDA's autocast lists, CUDA's optimizer default
    autocast: bool = True  # False where FSDP2's MixedPrecisionPolicy casts instead (torchtitan uses no autocast then)


def unpack_built(built: Any, source: ModelSource) -> tuple[torch.nn.Module, Any, Any]:
    """A factory's result: a module, (module, make_batch[, loss_fn]) or a dict with those keys."""
    make_batch, loss_fn = source.make_batch, source.loss_fn
    if isinstance(built, dict):
        built, make_batch, loss_fn = built.get("model"), built.get("make_batch", make_batch), built.get("loss_fn", loss_fn)
    elif isinstance(built, tuple) and len(built) in (2, 3):
        make_batch = built[1]
        loss_fn = built[2] if len(built) == 3 else loss_fn
        built = built[0]
    if not isinstance(built, torch.nn.Module):
        raise SetupError(f"expected the factory to return an nn.Module (or a tuple/dict with one), "
                         f"got {type(built).__name__}", where=source.ref or source.name)
    return built, make_batch, loss_fn


def default_make_batch(setup: TrainingSetup, source: ModelSource):
    specs = setup.inputs or source.default_inputs
    if not specs:
        raise SetupError("expected --input-shape (the model names no input shape of its own), got none",
                         where=source.ref or source.name)
    cast_floats = torch.bfloat16 if setup.precision == Precision.BF16 else None
    where = "--input-shape" if setup.inputs else source.ref or source.name

    def make_batch(batch_size: int) -> tuple[torch.Tensor, ...]:
        tensors = []
        for spec in specs:
            shape = (batch_size, *spec.shape)
            if math.prod(shape) > MAX_ELEMENTS:  # torch would fail unpacking the size, naming no flag
                raise SetupError(f"expected a batch within a tensor's int64 element count ({MAX_ELEMENTS:,}), got "
                                 f"--batch-size {batch_size:,} × {' × '.join(f'{d:,}' for d in spec.shape)}",
                                 where=where if math.prod(spec.shape) > MAX_ELEMENTS else "--batch-size")
            if spec.dtype == "bool":  # masks: randn has no bool kernel; a loader's bool tensor is one allocation
                tensors.append(torch.randint(0, 2, shape, dtype=torch.bool))
            elif spec.is_integer:
                tensors.append(torch.randint(0, spec.max_value, shape, dtype=_DTYPES[spec.dtype]))
            else:
                tensors.append(torch.randn(shape, dtype=cast_floats or _DTYPES[spec.dtype]))
        return tuple(tensors)

    return make_batch


def _first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if isinstance(output, dict) and output:
        return _first_tensor(next(iter(output.values())))
    raise SetupError(f"expected the model to return a tensor (or a tuple/dict starting with one), "
                     f"got {type(output).__name__}", where="model output")


def builtin_loss(loss: Loss):
    """Without --target-shape, targets are made from the output's shape in the loss phase: classes on
    the last dim for [B, C] and [B, L, V] (language models), on dim 1 for [B, C, H, W…] (segmentation).
    With it, the target comes with the batch (make_target) and is checked against the output."""
    def loss_fn(output: Any, inputs: Any, target: torch.Tensor | None = None) -> torch.Tensor:
        out = _first_tensor(output)
        if loss == Loss.SUM:
            return out.float().sum() if not out.is_floating_point() else out.sum()
        if loss == Loss.MSE:
            if target is not None and target.shape != out.shape:
                raise SetupError(f"expected --target-shape to match the output {list(out.shape[1:])}, got "
                                 f"{list(target.shape[1:])}", where="--target-shape")
            return torch.nn.functional.mse_loss(out, torch.randn_like(out) if target is None else target)
        if out.dim() < 2:
            raise SetupError(f"expected a [batch, classes, …] output for cross-entropy, got shape "
                             f"{list(out.shape)}", where="--loss cross-entropy")
        if out.dim() == 3:
            out = out.reshape(-1, out.shape[-1])
            target = target.reshape(-1) if target is not None else None
        expected_shape = (out.shape[0], *out.shape[2:])
        if target is not None and tuple(target.shape) != expected_shape:
            raise SetupError(f"expected --target-shape giving {list(expected_shape)} class ids for this output, "
                             f"got {list(target.shape)}", where="--target-shape")
        if target is None:
            target = torch.randint(0, out.shape[1], expected_shape, device=out.device)
        return torch.nn.functional.cross_entropy(out, target)
    return loss_fn


def make_target_fn(setup: TrainingSetup, loss: Loss):
    """--target-shape: the batch's targets, made with the inputs as a data loader would. Class ids are
    0 (valid for any number of classes; fake tensors carry no values anyway)."""
    if setup.target_shape is None:
        return None
    if loss == Loss.SUM:
        raise SetupError("expected no --target-shape with --loss sum (it has no target), got one", where="--target-shape")
    dtype = torch.bfloat16 if setup.precision == Precision.BF16 else torch.float32

    def make_target(batch_size: int) -> torch.Tensor:
        shape = (batch_size, *setup.target_shape)
        return torch.zeros(shape, dtype=torch.int64) if loss == Loss.CROSS_ENTROPY else torch.randn(shape, dtype=dtype)
    return make_target


def freeze_parameters(model: torch.nn.Module, patterns: tuple[str, ...]) -> None:
    """Turn off requires_grad for parameters whose name matches a pattern (fnmatch, or a module prefix)."""
    for pattern in patterns:
        matched = [(n, p) for n, p in model.named_parameters()
                   if fnmatch.fnmatchcase(n, pattern) or n.startswith(pattern.rstrip(".") + ".")]
        if not matched:
            names = ", ".join(n for n, _ in list(model.named_parameters())[:4])
            raise SetupError(f"expected --freeze {pattern!r} to match parameter names such as {names}, "
                             "it matched none", where="--freeze")
        for _, parameter in matched:
            parameter.requires_grad_(False)


def make_optimizer(params: list[torch.nn.Parameter], setup: TrainingSetup,
                   cuda_semantics: bool = False) -> torch.optim.Optimizer:
    # torch/optim/optimizer.py _default_to_fused_or_foreach: with every parameter on CUDA the default
    # is foreach; on the CPU it is the for-loop. A CPU trace of a CUDA run asks for foreach outright.
    default = {"foreach": True} if cuda_semantics else {}
    impl = {OptimizerImpl.FOREACH: {"foreach": True}, OptimizerImpl.FOR_LOOP: {"foreach": False},
            OptimizerImpl.FUSED: {"fused": True}, OptimizerImpl.DEFAULT: default}[setup.optimizer_impl]
    kind = setup.optimizer
    if impl.get("fused") and kind in (Optimizer.RMSPROP, Optimizer.ADAFACTOR):
        raise SetupError(f"expected an optimizer with a fused implementation (sgd, momentum, adam, adamw, "
                         f"adagrad), got {kind}", where="--optimizer-impl fused")
    if kind in (Optimizer.LION, Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT, Optimizer.PAGED_ADAMW):
        if setup.optimizer_impl != OptimizerImpl.DEFAULT:
            raise SetupError(f"expected no --optimizer-impl with {kind} (it has one implementation), got "
                             f"{setup.optimizer_impl}", where="--optimizer-impl")
        from trainmem.trace import optimizers

        if kind == Optimizer.LION:
            return optimizers.Lion(params)
        return optimizers.AdamW8bit(params, paged=kind != Optimizer.ADAMW_8BIT, bits=32 if kind == Optimizer.PAGED_ADAMW else 8)
    optim = torch.optim
    table = {
        Optimizer.SGD: lambda: optim.SGD(params, lr=0.01, **impl),
        Optimizer.MOMENTUM: lambda: optim.SGD(params, lr=0.01, momentum=0.9, **impl),
        Optimizer.ADAM: lambda: optim.Adam(params, lr=1e-3, **impl),
        Optimizer.ADAMW: lambda: optim.AdamW(params, lr=1e-3, **impl),
        Optimizer.RMSPROP: lambda: optim.RMSprop(params, lr=1e-3, **impl),
        Optimizer.ADAGRAD: lambda: optim.Adagrad(params, lr=0.01, **impl),
        Optimizer.ADAFACTOR: lambda: optim.Adafactor(params, lr=0.01, **impl),
    }
    return table[kind]()


def prepare(model: torch.nn.Module, make_batch: Any, loss_fn: Any, setup: TrainingSetup,
            source: ModelSource, device_type: str = "cpu", cuda_semantics: bool = False,
            optimizer_factory: Any = None, checkpointed: list[str] | None = None) -> Prepared:
    """Freeze, wrap blocks for checkpointing, and make the optimizer and scaler for a built model. Many ranks
    (parallel/rank_trace.py) pass the strategy's `optimizer_factory(params, setup)` and the blocks already
    checkpointed on the meta model (before sharding, as torchtitan orders them)."""
    if setup.precision == Precision.BF16 and any(p.dtype != torch.bfloat16 for p in model.parameters()
                                                 if p.is_floating_point()):
        model.to(torch.bfloat16)
    model.train()
    freeze_parameters(model, setup.freeze)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        model_where = source.ref or source.name
        if not any(True for _ in model.parameters()):
            raise SetupError("expected a model with parameters to train, got one with none", where=model_where)
        if setup.freeze:
            raise SetupError(f"expected --freeze to leave a parameter to train, got {', '.join(setup.freeze)} "
                             "matching all of them", where="--freeze")
        raise SetupError("expected a parameter to train, got a model whose parameters all have requires_grad=False",
                         where=model_where)
    if checkpointed is None:
        checkpointed = checkpoint_blocks(model) if setup.checkpointing else []
    if setup.compile:
        compile_forward(model)
    scaler = torch.amp.GradScaler(device_type) if setup.precision == Precision.FP16_MIXED else None
    loss = setup.loss or source.default_loss or Loss.CROSS_ENTROPY
    if loss_fn is not None and setup.target_shape is not None:
        raise SetupError("expected --target-shape only with a built-in --loss; this model brings its own loss_fn",
                         where="--target-shape")
    optimizer = (optimizer_factory(trainable, setup) if optimizer_factory is not None
                 else make_optimizer(trainable, setup, cuda_semantics))
    if make_batch is not None and make_batch is not source.make_batch and setup.precision == Precision.BF16:
        make_batch = CastBatch(make_batch, device_type)  # a factory's batch, as model.to(bfloat16) needs it
    return Prepared(model, optimizer, scaler,
                    make_batch or default_make_batch(setup, source), loss_fn or builtin_loss(loss),
                    make_target_fn(setup, loss), checkpointed, device_type, cuda_semantics)


def autocast_region(prepared: Prepared, setup: TrainingSetup):
    """One autocast region around forward and loss, as loops write `with autocast(): out = model(x);
    loss = loss_fn(out, y)`: the cast cache (low-precision parameter copies) lives until it closes. A trainer
    that opens it around the module alone (Fabric, Accelerate) does so in its forward (trace/trainer_forward.py)."""
    return _autocast(prepared, setup) if autocast_covers_loss(setup) else contextlib.nullcontext()


def _autocast(prepared: Prepared, setup: TrainingSetup):
    dtype = {Precision.FP16_MIXED: torch.float16, Precision.BF16_MIXED: torch.bfloat16}.get(setup.precision)
    if dtype is None or not prepared.autocast:
        return contextlib.nullcontext()
    cache = autocast_caches(setup)
    if prepared.cuda_semantics:
        from trainmem.trace.cuda_autocast import cuda_autocast_region

        return cuda_autocast_region(dtype, cache)
    return torch.autocast(prepared.device_type, dtype=dtype, cache_enabled=cache)


def clip_gradients(prepared: Prepared, max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_, after GradScaler.unscale_ as the Trainer does; foreach on CUDA
    (its default there), per tensor on the CPU."""
    if prepared.scaler is not None:
        prepared.scaler.unscale_(prepared.optimizer)
    params = [p for p in prepared.model.parameters() if p.grad is not None]
    torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True if prepared.cuda_semantics else None)


def _nothing_to_train(setup: TrainingSetup) -> SetupError:
    """The loss reaches no trainable parameter, so there is no backward to estimate. With --lora this
    happens when the model reads its target modules' weights directly instead of calling them, as
    nn.MultiheadAttention does with out_proj (F.multi_head_attention_forward) and torchvision's Swin
    with qkv: peft's adapter wraps the module's forward, which is never called."""
    if setup.lora_spec() is not None:
        return SetupError(f"expected --lora targets whose forward the model calls, got {setup.lora or 'peft defaults'}: "
                          "the loss reaches none of the adapters (the model reads those modules' weights directly, "
                          "as nn.MultiheadAttention does with out_proj); choose other target modules", where="--lora")
    return SetupError("expected at least one trainable parameter that the loss depends on, found none "
                      f"(--freeze {','.join(setup.freeze) or '(none)'})", where="training setup")


def make_micro_batch(prepared: Prepared, setup: TrainingSetup) -> dict[str, Any]:
    """One micro-batch as the data loader yields it: the inputs and, with --target-shape, the targets."""
    batch = prepared.make_batch(setup.batch_size)
    if not isinstance(batch, (torch.Tensor, tuple, list, dict)):
        raise SetupError(f"expected make_batch({setup.batch_size}) to return a tensor, a tuple of tensors or a dict, "
                         f"got {type(batch).__name__}", where="make_batch")
    inputs = batch if isinstance(batch, (tuple, dict)) else (batch,)
    target = () if prepared.make_target is None else (prepared.make_target(setup.batch_size),)
    return {"inputs": inputs, "target": target}


def forward(prepared: Prepared, setup: TrainingSetup, batch: dict[str, Any]) -> Any:
    def call(inputs: Any) -> Any:
        return prepared.model(**inputs) if isinstance(inputs, dict) else prepared.model(*inputs)

    return wrapped_forward(call, setup, lambda: _autocast(prepared, setup), batch["inputs"])


def compute_loss(prepared: Prepared, setup: TrainingSetup, batch: dict[str, Any], output: Any) -> torch.Tensor:
    """The loss, divided by the accumulation steps as an accumulating loop does."""
    loss = prepared.loss_fn(output, batch["inputs"], *batch["target"])
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        # backward() would fail with "grad can be implicitly created only for scalar outputs"
        got = f"shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise SetupError(f"expected the loss to be a scalar tensor, got {got}", where="loss_fn")
    return loss / setup.grad_accum if setup.grad_accum > 1 else loss


def check_trainable(loss: torch.Tensor, setup: TrainingSetup) -> None:
    if not loss.requires_grad:
        raise _nothing_to_train(setup)


def backward(prepared: Prepared, loss: torch.Tensor) -> None:
    (prepared.scaler.scale(loss) if prepared.scaler is not None else loss).backward()


def optimizer_step(prepared: Prepared, setup: TrainingSetup) -> None:
    if setup.max_grad_norm is not None:
        clip_gradients(prepared, setup.max_grad_norm)
    if prepared.scaler is not None:
        prepared.scaler.step(prepared.optimizer)
        prepared.scaler.update()
    else:
        prepared.optimizer.step()


def zero_grad(prepared: Prepared, setup: TrainingSetup) -> None:
    prepared.optimizer.zero_grad(set_to_none=setup.zero_grad == ZeroGrad.NONE)


def run_steps(prepared: Prepared, setup: TrainingSetup, observer: Observer) -> None:
    """The steps as the user's loop (setup.loop) writes them: trace/loops.py."""
    from trainmem.trace.loops import run_loop

    run_loop(prepared, setup, observer)
