"""The training loops people write, each as the code it stands for. Which Python names keep the batch,
the outputs and the loss alive decides the peak as much as any op does: a name keeps its tensor until
the name is rebound or goes out of scope, and rebinding happens only *after* the new value exists, so
the next batch is made while the previous one is alive, and the next forward runs while the previous
outputs are alive.

`held` below plays the loop's names: assigning `held[name] = new` drops the old tensor only after the
new one was made, exactly as `name = f()` does. Phases are announced to the observer (the recorder
labels events with them; a real run ignores them). `benchmarks/truth_loops.py` writes the same loops
as plain PyTorch, independently of this module, to check it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainmem.setup import Loop, TrainingSetup
from trainmem.trace import step as training
from trainmem.trace.events import Phase
from trainmem.trace.step import Observer, Prepared


def _forward_and_loss(prepared: Prepared, setup: TrainingSetup, observer: Observer, step: int,
                      held: dict[str, Any], batch: dict[str, Any]) -> None:
    """`with autocast(): outputs = model(inputs); loss = loss_fn(outputs, targets)`, binding
    held["output"] and held["loss"]."""
    observer.phase(Phase.FORWARD, step)
    with training.autocast_region(prepared, setup):
        held["output"] = training.forward(prepared, setup, batch)
        observer.loop_mark("output")
        observer.phase(Phase.LOSS, step)
        held["loss"] = training.compute_loss(prepared, setup, batch, held["output"])
        observer.loop_mark("loss")
    training.check_trainable(held["loss"], setup)


def _backward(prepared: Prepared, observer: Observer, step: int, loss: Any) -> None:
    observer.phase(Phase.BACKWARD, step)
    training.backward(prepared, loss)
    observer.after_backward(prepared.model)


def _optimizer_step(prepared: Prepared, setup: TrainingSetup, observer: Observer, step: int) -> None:
    observer.phase(Phase.OPTIMIZER, step)
    training.optimizer_step(prepared, setup)
    observer.after_optimizer(prepared.optimizer, prepared.scaler)


def _zero_grad(prepared: Prepared, setup: TrainingSetup, observer: Observer, step: int) -> None:
    observer.phase(Phase.ZERO_GRAD, step)
    training.zero_grad(prepared, setup)


def inline_loop(prepared: Prepared, setup: TrainingSetup, observer: Observer) -> None:
    """PyTorch's tutorials, the loop written at top level (accumulating when --grad-accum > 1):

        for i, (inputs, targets) in enumerate(loader):
            if i % accum == 0:
                optimizer.zero_grad()
            outputs = model(inputs)
            loss = loss_fn(outputs, targets) / accum
            loss.backward()
            if (i + 1) % accum == 0:
                optimizer.step()

    inputs, targets, outputs and loss stay bound through backward and the optimizer step, until the
    next iteration rebinds each name."""
    held: dict[str, Any] = {}
    for step in range(setup.steps):
        for micro in range(setup.grad_accum):
            observer.phase(Phase.INPUTS, step)
            held["batch"] = training.make_micro_batch(prepared, setup)
            if micro == 0:
                _zero_grad(prepared, setup, observer, step)
            _forward_and_loss(prepared, setup, observer, step, held, held["batch"])
            _backward(prepared, observer, step, held["loss"])
        _optimizer_step(prepared, setup, observer, step)


def step_fn_loop(prepared: Prepared, setup: TrainingSetup, observer: Observer) -> None:
    """The same inside a function:

        def train_step(inputs, targets, update):
            outputs = model(inputs)
            loss = loss_fn(outputs, targets) / accum
            loss.backward()
            if update:
                optimizer.step()
                optimizer.zero_grad()
            return loss.item()

        for i, (inputs, targets) in enumerate(loader):
            train_step(inputs, targets, (i + 1) % accum == 0)

    outputs and loss die when train_step returns; the caller's batch lives until the next one replaces it."""
    held: dict[str, Any] = {}
    for step in range(setup.steps):
        for micro in range(setup.grad_accum):
            observer.phase(Phase.INPUTS, step)
            held["batch"] = training.make_micro_batch(prepared, setup)
            local: dict[str, Any] = {}  # train_step's own names
            _forward_and_loss(prepared, setup, observer, step, local, held["batch"])
            _backward(prepared, observer, step, local["loss"])
            if micro == setup.grad_accum - 1:
                _optimizer_step(prepared, setup, observer, step)
                _zero_grad(prepared, setup, observer, step)
            local.clear()  # return


def trainer_loop(prepared: Prepared, setup: TrainingSetup, observer: Observer) -> None:
    """Hugging Face's Trainer (transformers >= 4.46, Trainer._inner_training_loop and training_step),
    and Lightning's automatic optimization, which keep the same names alive:

        for update_step in range(steps):
            batch_samples = [next(epoch_iterator) for _ in range(accum)]   # get_batch_samples
            for inputs in batch_samples:
                loss = compute_loss(model, inputs)   # outputs = model(**inputs) die inside it
                loss = loss / accum
                accelerator.backward(loss)
                tr_loss_step = loss.detach()
            clip_grad_norm_(...); optimizer.step(); model.zero_grad()

    The update's micro-batches are all made before its first forward, while the previous update's
    list is still bound; the outputs are dropped before backward."""
    held: dict[str, Any] = {}
    for step in range(setup.steps):
        observer.phase(Phase.INPUTS, step)
        held["batch_samples"] = [training.make_micro_batch(prepared, setup) for _ in range(setup.grad_accum)]
        for batch in held["batch_samples"]:
            local: dict[str, Any] = {}  # compute_loss's and training_step's names
            _forward_and_loss(prepared, setup, observer, step, local, batch)
            del local["output"]  # compute_loss returns the loss only
            _backward(prepared, observer, step, local["loss"])
            held["loss"] = local.pop("loss").detach()
        _optimizer_step(prepared, setup, observer, step)
        _zero_grad(prepared, setup, observer, step)


def lean_loop(prepared: Prepared, setup: TrainingSetup, observer: Observer) -> None:
    """A loop written to keep nothing it does not need:

        for step in range(steps):
            for _ in range(accum):
                inputs, targets = next(loader)
                outputs = model(inputs)
                loss = loss_fn(outputs, targets) / accum
                del outputs
                loss.backward()
                del loss, inputs, targets
            optimizer.step()
            optimizer.zero_grad()

    The marks tell the trace where the inline loop would bind and drop the same names (trace/loop_twin.py), so
    that one trace of this loop gives both."""
    observer.loop_mark("lean")
    # what the inline loop's first zero_grad runs, with no gradients yet: its ops are counted apart, not in this trace
    _zero_grad(prepared, setup, observer, 0)
    observer.loop_mark("zero_grad probed")
    for step in range(setup.steps):
        for _ in range(setup.grad_accum):
            observer.phase(Phase.INPUTS, step)
            held = {"batch": training.make_micro_batch(prepared, setup)}
            observer.loop_mark("batch")
            _forward_and_loss(prepared, setup, observer, step, held, held["batch"])
            observer.loop_mark("dropped output", held["output"])
            del held["output"]
            _backward(prepared, observer, step, held["loss"])
            observer.loop_mark("dropped batch", held["batch"])
            observer.loop_mark("dropped loss", held["loss"])
            held.clear()
        _optimizer_step(prepared, setup, observer, step)
        observer.loop_mark("stepped")
        observer.loop_mark("dropped grads", [p.grad for p in prepared.model.parameters() if p.grad is not None])
        _zero_grad(prepared, setup, observer, step)
    observer.loop_mark("end")


def lightning_loop(prepared: Prepared, setup: TrainingSetup, observer: Observer, look_ahead: bool = False) -> None:
    """Lightning's automatic optimization (lightning 2.x: loops/training_epoch_loop.py advance,
    loops/fetchers.py _PrefetchDataFetcher, loops/optimization/automatic.py Closure), the loop a LightningModule's
    training_step runs in. Each micro-batch is one call of advance():

        def advance(i):
            batch = next(fetcher)
            def closure():            # run by optimizer.step(closure), or alone while accumulating
                loss = training_step(batch, i) / accum      # the outputs die inside training_step
                if i % accum == 0:
                    optimizer.zero_grad()                    # after the forward, before backward
                loss.backward()
                return loss.detach().clone()
            optimizer.step(closure) if (i + 1) % accum == 0 else closure()
            # returning drops `batch` and the closure's result

    The gradients of the last update live through the next forward: zero_grad runs between forward and backward,
    where the trainer loop runs it after the step. The fetcher looks one batch ahead only for a loader without a
    length (an IterableDataset, `look_ahead`: --loop lightning-iterable): it loads the next batch before it hands
    this one over, so two batches are alive through the step; a loader with a length (a Dataset) is read one batch
    at a time."""
    fetched: dict[str, Any] = {}  # the fetcher's buffer
    for step in range(setup.steps):
        for micro in range(setup.grad_accum):
            observer.phase(Phase.INPUTS, step)
            if look_ahead and "next" not in fetched:  # the first load, when the epoch's iterator starts
                fetched["next"] = training.make_micro_batch(prepared, setup)
            local = {"batch": fetched.pop("next") if look_ahead else training.make_micro_batch(prepared, setup)}
            if look_ahead:
                fetched["next"] = training.make_micro_batch(prepared, setup)
            _forward_and_loss(prepared, setup, observer, step, local, local["batch"])
            del local["output"]
            if micro == 0:
                _zero_grad(prepared, setup, observer, step)
            _backward(prepared, observer, step, local["loss"])
            local["result"] = local.pop("loss").detach().clone()
            if micro == setup.grad_accum - 1:
                _optimizer_step(prepared, setup, observer, step)
            local.clear()  # advance() returns


LOOPS: dict[Loop, Callable[[Prepared, TrainingSetup, Observer], None]] = {
    Loop.INLINE: inline_loop, Loop.STEP_FN: step_fn_loop, Loop.TRAINER: trainer_loop, Loop.LEAN: lean_loop,
    Loop.LIGHTNING: lightning_loop,
    Loop.LIGHTNING_ITERABLE: lambda prepared, setup, observer: lightning_loop(prepared, setup, observer, look_ahead=True),
}


def run_loop(prepared: Prepared, setup: TrainingSetup, observer: Observer) -> None:
    LOOPS[setup.loop](prepared, setup, observer)
