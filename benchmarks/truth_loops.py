"""Ground truth for trainmem's CPU estimates: real training loops written as people write them, with no
trainmem code at all (not imported, not shared), so that a wrong assumption in trainmem's own step
cannot hide here. One fresh process per measurement; prints one JSON line.

    python benchmarks/truth_loops.py MODEL --batch-size N [--optimizer adam] [--loop inline]
                                     [--steps 2] [--mode tensors|rss] [--load CKPT]
    python benchmarks/truth_loops.py MODEL --write-checkpoint CKPT [--resume] [--checkpoint-dtype bf16]

MODEL: `mlp:1000-100-10` (Linear + ReLU, none after the last) or `path/models.py:factory` returning
(model, make_batch[, loss_fn]) as tests/models.py does; make_batch(n) gives the input tuple, called as
model(*inputs). Targets are made with the batch, as a data loader yields them: class ids for
cross-entropy (one per row, or one per position for [B, L, V] and [B, C, H, W] outputs); a factory's
own loss_fn(outputs, inputs) gets the inputs as its targets.

mode tensors: torch.profiler's CPU memory events (they include buffers kernels allocate internally),
              summed in time order with each size rounded to 64 B as c10's CPU allocator does.
mode rss:     no profiler; VmHWM (peak resident set) of this process after the loop.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- the loops, as written in tutorials, functions, and trainers ----------------------------------

def loop_inline(model, optimizer, loss_fn, loader, accum):
    # PyTorch's tutorial loop; accumulation as its docs show it
    for i, (inputs, targets) in enumerate(loader):
        if i % accum == 0:
            optimizer.zero_grad()
        with autocast():  # PyTorch's AMP recipe under --precision bf16-mixed: forward and loss
            outputs = model(*inputs)
            loss = loss_fn(outputs, targets) / accum if accum > 1 else loss_fn(outputs, targets)
        loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()


def autocast():
    if PRECISION == "bf16-mixed":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loop_step_fn(model, optimizer, loss_fn, loader, accum):
    def train_step(inputs, targets, update):
        outputs = model(*inputs)
        loss = loss_fn(outputs, targets) / accum if accum > 1 else loss_fn(outputs, targets)
        loss.backward()
        if update:
            optimizer.step()
            optimizer.zero_grad()
        return loss.item()

    for i, (inputs, targets) in enumerate(loader):
        train_step(inputs, targets, (i + 1) % accum == 0)


def loop_trainer(model, optimizer, loss_fn, loader, accum):
    # the shape of transformers' Trainer._inner_training_loop / training_step (>= 4.46)
    def compute_loss(inputs, targets):
        outputs = model(*inputs)
        return loss_fn(outputs, targets)

    def training_step(inputs, targets):
        loss = compute_loss(inputs, targets)
        if accum > 1:
            loss = loss / accum
        loss.backward()
        return loss.detach()

    iterator = iter(loader)
    while True:
        batch_samples = []
        for _ in range(accum):
            sample = next(iterator, None)
            if sample is None:
                return
            batch_samples.append(sample)
        tr_loss = 0.0
        for inputs, targets in batch_samples:
            tr_loss_step = training_step(inputs, targets)
            tr_loss = tr_loss + tr_loss_step
        optimizer.step()
        model.zero_grad()


def loop_lean(model, optimizer, loss_fn, loader, accum):
    iterator = iter(loader)
    while True:
        for _ in range(accum):
            sample = next(iterator, None)
            if sample is None:
                return
            inputs, targets = sample
            del sample
            outputs = model(*inputs)
            loss = loss_fn(outputs, targets) / accum if accum > 1 else loss_fn(outputs, targets)
            del outputs
            loss.backward()
            del loss, inputs, targets
        optimizer.step()
        optimizer.zero_grad()


def lightning_run(model, optimizer, loss_fn, loader, accum, sized):
    # a real lightning.Trainer (automatic optimization) on the CPU: a LightningModule around the model, the
    # loader's batches handed over as they are (batch_size=None), nothing logged, saved or printed. sized: a
    # Dataset with a length, read one batch at a time; else an IterableDataset, which Lightning's fetcher reads
    # one batch ahead: it is given one batch more than the steps take, as a dataset longer than the run would be
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            outputs = self.model(*inputs)
            return loss_fn(outputs, targets)

        def configure_optimizers(self):
            return optimizer

    steps = loader.left // accum

    class Indexed(torch.utils.data.Dataset):
        def __len__(self):
            return steps * accum

        def __getitem__(self, index):
            return next(loader)

    class Streamed(torch.utils.data.IterableDataset):
        def __iter__(self):
            loader.left += 1
            return iter(loader)

    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=accum,
                        precision=FABRIC_PRECISION[PRECISION],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    data = Indexed() if sized else Streamed()
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=None))


def loop_lightning(model, optimizer, loss_fn, loader, accum):
    lightning_run(model, optimizer, loss_fn, loader, accum, sized=True)


def loop_lightning_iterable(model, optimizer, loss_fn, loader, accum):
    lightning_run(model, optimizer, loss_fn, loader, accum, sized=False)


def loop_fabric(model, optimizer, loss_fn, loader, accum):
    # Lightning Fabric's own loop (its README and "Convert to Fabric" guide): fabric.setup, fabric.backward.
    # PRECISION is Fabric's precision argument ("32-true", "bf16-mixed")
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=1, precision=FABRIC_PRECISION[PRECISION])
    model, optimizer = fabric.setup(model, optimizer)
    for i, (inputs, targets) in enumerate(loader):
        if i % accum == 0:
            optimizer.zero_grad()
        outputs = model(*inputs)
        loss = loss_fn(outputs, targets) / accum if accum > 1 else loss_fn(outputs, targets)
        fabric.backward(loss)
        if (i + 1) % accum == 0:
            optimizer.step()


def loop_accelerate(model, optimizer, loss_fn, loader, accum):
    # Hugging Face Accelerate's loop (its README): accelerator.prepare, accelerator.backward; accumulation as its
    # guide writes it (accelerator.accumulate, the prepared optimizer steps and zeroes only at an update)
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, mixed_precision=ACCELERATE_PRECISION[PRECISION],
                              gradient_accumulation_steps=accum)
    model, optimizer = accelerator.prepare(model, optimizer)
    for inputs, targets in loader:
        with accelerator.accumulate(model):
            optimizer.zero_grad()
            outputs = model(*inputs)
            loss = loss_fn(outputs, targets)
            accelerator.backward(loss)
            optimizer.step()


LOOPS = {"inline": loop_inline, "step-fn": loop_step_fn, "trainer": loop_trainer, "lean": loop_lean,
         "lightning": loop_lightning, "lightning-iterable": loop_lightning_iterable, "fabric": loop_fabric,
         "accelerate": loop_accelerate}
# --precision: fp32, or bf16-mixed (the plain loops wrap forward and loss in torch.autocast as PyTorch's AMP recipe
# does; Lightning and Fabric take their precision argument, Accelerate its mixed_precision)
PRECISION = "fp32"
FABRIC_PRECISION = {"fp32": "32-true", "bf16-mixed": "bf16-mixed"}
ACCELERATE_PRECISION = {"fp32": "no", "bf16-mixed": "bf16"}


# ---- models, data and losses, written out plainly -------------------------------------------------

def build(reference):
    if reference.startswith("mlp:"):
        widths = [int(w) for w in reference[4:].split("-")]
        layers = []
        for index, (a, b) in enumerate(zip(widths, widths[1:])):
            layers.append(nn.Linear(a, b))
            if index < len(widths) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers), (lambda batch: (torch.randn(batch, widths[0]),)), None
    path, _, name = reference.rpartition(":")
    spec = importlib.util.spec_from_file_location("zoo_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built = getattr(module, name)()
    return built[0], built[1], (built[2] if len(built) > 2 else None)


def cross_entropy(outputs, targets):
    if outputs.dim() == 3:  # a language model's [B, L, V]
        return F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))
    return F.cross_entropy(outputs, targets)


def target_maker(model, make_batch):
    """Class ids of the shape the model's output asks for. The shape comes from one forward on the meta
    device (parameters and inputs as meta tensors: nothing allocated, nothing computed)."""
    meta = {name: torch.empty_like(t, device="meta") for name, t in [*model.named_parameters(), *model.named_buffers()]}
    example = tuple(torch.empty_like(t, device="meta") for t in make_batch(1))
    with torch.no_grad():
        shape = torch.func.functional_call(model, meta, example).shape
    if len(shape) == 2:
        return lambda batch: torch.randint(0, shape[1], (batch,))
    if len(shape) == 3:
        return lambda batch: torch.randint(0, shape[2], (batch, shape[1]))
    return lambda batch: torch.randint(0, shape[1], (batch, *shape[2:]))


def checkpoint_each(blocks):
    """What a user writes to checkpoint a stack of blocks: each block's forward recomputed in backward
    (non-reentrant, PyTorch's recommended mode)."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        plain = block.forward
        block.forward = lambda *xs, plain=plain: checkpoint(plain, *xs, use_reentrant=False)


def make_optimizer(name, params):
    return {"sgd": lambda: torch.optim.SGD(params, lr=0.01),
            "momentum": lambda: torch.optim.SGD(params, lr=0.01, momentum=0.9),
            "adam": lambda: torch.optim.Adam(params, lr=1e-3),
            "adamw": lambda: torch.optim.AdamW(params, lr=1e-3)}[name]()


class Loader:
    """What a DataLoader's iterator does for these loops: each `next` makes a new (inputs, targets) pair
    and keeps no reference to it."""

    def __init__(self, make_batch, make_target, batch, steps):
        self.make_batch, self.make_target, self.batch, self.left = make_batch, make_target, batch, steps

    def __iter__(self):
        return self

    def __next__(self):
        if self.left == 0:
            raise StopIteration
        self.left -= 1
        inputs = self.make_batch(self.batch)
        return inputs, (inputs if self.make_target is None else self.make_target(self.batch))


# ---- measurement ---------------------------------------------------------------------------------

def status_bytes(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def profiled_peak(prof):
    """Peak of the running sum of the profiler's CPU memory events (kineto results: not a public API;
    the events include allocations made inside kernels)."""
    events = sorted(((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")), key=lambda e: e[0])
    current = peak = 0
    for _, size in events:
        rounded = (abs(size) + 63) // 64 * 64
        current += rounded if size > 0 else -rounded
        peak = max(peak, current)
    return peak


CHECKPOINT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def write_checkpoint(args):
    """--write-checkpoint PATH: what an earlier run saved, made in a process of its own (its memory is not measured):
    the model's state dict (floating tensors in --checkpoint-dtype) and, with --resume, the optimizer's state after
    one step."""
    model, make_batch, own_loss = build(args.model)
    freeze(model, args.freeze or [])
    optimizer = make_optimizer(args.optimizer, [p for p in model.parameters() if p.requires_grad])
    if args.resume:
        for param in model.parameters():
            if param.requires_grad:
                param.grad = torch.zeros_like(param)
        optimizer.step()
    dtype = CHECKPOINT_DTYPES.get(args.checkpoint_dtype)
    state = {name: t.to(dtype) if dtype is not None and t.is_floating_point() else t
             for name, t in model.state_dict().items()}
    torch.save({"model": state, **({"optimizer": optimizer.state_dict()} if args.resume else {})}, args.write_checkpoint)


def load_checkpoint(model, optimizer, path):
    """The load as a user writes it (the model trains on the CPU: map_location="cpu")."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["model"])
    if "optimizer" in checkpoint:
        optimizer.load_state_dict(checkpoint["optimizer"])
    del checkpoint


def freeze(model, patterns):
    """--freeze PATTERN: parameters whose names match (fnmatch) are not trained, as a fine-tuning script sets them."""
    import fnmatch

    for name, param in model.named_parameters():
        if any(fnmatch.fnmatch(name, pattern) for pattern in patterns):
            param.requires_grad_(False)


def build_and_train(args):
    model, make_batch, own_loss = build(args.model)
    model.train()
    freeze(model, args.freeze or [])
    if args.checkpoint_blocks:
        checkpoint_each(getattr(model, args.checkpoint_blocks))
    make_target = None if own_loss is not None else target_maker(model, make_batch)
    if args.compile:  # as PyTorch's torch.compile tutorial writes it: Inductor, the default backend
        model = torch.compile(model)
    loss_fn = own_loss or cross_entropy
    optimizer = make_optimizer(args.optimizer, [p for p in model.parameters() if p.requires_grad])
    if args.load:
        load_checkpoint(model, optimizer, args.load)
    LOOPS[args.loop](model, optimizer, loss_fn, Loader(make_batch, make_target, args.batch_size,
                                                       args.steps * args.grad_accum), args.grad_accum)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--loop", default="inline", choices=sorted(LOOPS))
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--checkpoint-blocks", metavar="ATTR",
                        help="wrap each block of model.ATTR (a ModuleList) in torch.utils.checkpoint")
    parser.add_argument("--compile", action="store_true", help="train torch.compile(model) (Inductor)")
    parser.add_argument("--mode", default="tensors", choices=["tensors", "rss"])
    parser.add_argument("--precision", default="fp32", choices=sorted(FABRIC_PRECISION))
    parser.add_argument("--freeze", action="append", metavar="PATTERN", help="parameters not trained (fnmatch)")
    parser.add_argument("--write-checkpoint", metavar="PATH", help="save the checkpoint a later run --load's, and exit")
    parser.add_argument("--load", metavar="PATH", help="torch.load PATH and load_state_dict it before training")
    parser.add_argument("--resume", action="store_true", help="--write-checkpoint: the optimizer's state too")
    parser.add_argument("--checkpoint-dtype", choices=sorted(CHECKPOINT_DTYPES), help="--write-checkpoint: the "
                        "dtype of its floating tensors (default: the model's)")
    args = parser.parse_args()
    if args.write_checkpoint:
        torch.manual_seed(0)
        write_checkpoint(args)
        return
    if args.precision != "fp32" and args.loop not in ("inline", "lightning", "fabric", "accelerate"):
        parser.error(f"--precision {args.precision} is written for the inline, lightning, fabric and accelerate loops")
    global PRECISION
    PRECISION = args.precision
    torch.manual_seed(0)
    result = {"model": args.model, "batch_size": args.batch_size, "compile": args.compile, "optimizer": args.optimizer, "loop": args.loop,
              "precision": args.precision,
              "torch": torch.__version__, "threads": torch.get_num_threads(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    started = time.perf_counter()
    if args.mode == "tensors":  # the model is built inside the profile: its parameters count too
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            build_and_train(args)
        result["tensor_peak_bytes"] = profiled_peak(prof)
    else:
        build_and_train(args)
        result["peak_rss_bytes"] = status_bytes("VmHWM")
    result["seconds"] = time.perf_counter() - started
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
