"""One rank of a real torch.distributed run over gloo, measured. Run by measure/gloo_ranks.py as
`python -P .../dist_child.py '<json request>'` with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.

Ground truth written independently of trainmem.parallel (nothing of it is imported here): the model is
wrapped as a user wraps it, with torch's own classes —
  ddp    DistributedDataParallel(model, bucket_cap_mb=…, gradient_as_bucket_view=…)
  zero1  the same DDP + ZeroRedundancyOptimizer(params, optimizer_class=<the setup's optimizer>)
  fsdp   FSDP2: model built on the meta device, fully_shard on each block (FSDP_WRAP below), then on
         the root, `to_empty(device="cpu")` and each module's reset_parameters(), as torchtitan does
  zero2  the same with fully_shard(reshard_after_forward=False)
  hsdp   the same on a 2-D mesh init_device_mesh("cpu", (replicate, shard)): shard inside, replicate across
  fsdp1  FullyShardedDataParallel as a Lightning user's model is wrapped: built for real on the
         CPU, then FSDP1 with ModuleWrapPolicy over the blocks' classes, the sharding strategy, use_orig_params,
         the prefetch knobs, device_id=cpu, MixedPrecision with the layout's param dtype (Lightning's float32
         by default) for the mixed precisions; HYBRID_SHARD on hsdp's 2-D mesh
The model, its batch and loss, and the training loop (setup.loop) are trainmem's frontends and
trace/loops.py, as measure/child.py uses them.

mode "tensors": c10's own record of every CPU allocation and free, on every thread (measure/c10_log.py),
summed in order with 64-byte rounding as measure/child.py counts: the tensor peak of the whole run (build,
wrap, steps), and the peaks before and within the loop. It includes what gloo allocates on its worker
threads (the all-gather's full-size flat buffer) and frees wherever they happen. The profiler runs too, for
comparison: it sees gloo's worker allocations (ProcessGroupGloo runs each work with the caller's
thread-local state) but misses a free made by a worker after that state is gone, so its peak is reported
beside c10's, never used as the measurement; it serves to find those late frees, which are moved back to the
end of the worker's work (c10_log.settled: `tensor_peak_bytes` settled, `raw_peak_bytes` as it happened).
mode "rss": no logging, no profiler; peak RSS (VmHWM).
Prints one JSON line.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import time

SHARDED = ("fsdp", "zero2", "hsdp")
SUPPORTED = ("ddp", "zero1", "fsdp1") + SHARDED


def run(request: dict) -> dict:
    from trainmem.measure.child import rss_now, proc_status_bytes

    after_import = rss_now()
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    layout = request["layout"]
    if layout["strategy"] not in SUPPORTED:
        raise ValueError(f"expected a strategy the real run supports ({', '.join(SUPPORTED)}), "
                         f"got {layout['strategy']!r}")
    if request.get("threads"):
        torch.set_num_threads(int(request["threads"]))
    timeout = datetime.timedelta(seconds=float(request.get("timeout", 600)))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    torch.manual_seed(request.get("seed", 0))
    result = {"rank": rank, "world_size": world, "mode": request["mode"], "torch": torch.__version__,
              "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "rss_before_torch": after_import["rss"]}
    started = time.perf_counter()
    if request["mode"] == "tensors":
        result.update(_measure_tensors(request, layout))
    else:
        prepared = _train(request, layout, lambda mark: None)  # kept alive: RSS after the steps includes the model
        result["rss_after_steps"] = rss_now()["rss"]
        result["peak_rss_bytes"] = proc_status_bytes("VmHWM")
        result["parameters"] = sum(p.numel() for p in prepared.model.parameters())
        result["steps"] = int(request["setup"].get("steps", 2))
    result["seconds"] = time.perf_counter() - started
    dist.barrier()  # every rank is past its last collective before any leaves
    return result


def _measure_tensors(request: dict, layout: dict) -> dict:
    """The run with c10's allocation log on (measure/c10_log.py) and the profiler beside it. The tensor peak
    is c10's stream with gloo workers' late frees moved back to the end of their work (`late_frees`);
    `raw_peak_bytes` is the stream as it happened (higher when a worker ran late on a busy machine)."""
    from torch.profiler import ProfilerActivity, profile

    from trainmem.measure import c10_log
    from trainmem.trace.torch_private import profiler_memory_events_threads

    log_path = os.path.join(request["log_dir"], f"{os.environ['RANK']}.c10.log")
    with c10_log.logging(log_path) as log:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _train(request, layout, log.mark)
    stream = c10_log.events(log_path)
    profiled = sorted(profiler_memory_events_threads(prof))
    main = profiled[0][2] if profiled else None  # the first allocation builds the model, on the main thread
    settled, unpaired = c10_log.settled(stream, profiled, main)
    figures = c10_log.peaks(settled)
    figures["raw_peak_bytes"] = c10_log.peaks(stream)["tensor_peak_bytes"]
    figures["late_frees"] = unpaired
    figures.update(_profiler_figures(profiled, main))
    # every free the profiler lacks was found, no other: the pairing held
    figures["pairing_exact"] = unpaired == figures["c10_frees"] - figures["profiler_frees"]
    return figures


def _train(request: dict, layout: dict, mark):
    """Build, wrap and run the steps; `mark(name)` is called as the loop starts and ends."""
    from trainmem.frontends import resolve
    from trainmem.setup import TrainingSetup
    from trainmem.trace import step as training
    from trainmem.trace.step import Observer

    setup = TrainingSetup.from_mapping(request["setup"])
    source = resolve(request["model"], setup)
    if layout["strategy"] in SHARDED:
        prepared = _prepare_sharded(source, setup, layout, training)
    elif layout["strategy"] == "fsdp1":
        prepared = _prepare_fsdp1(source, setup, layout, training)
    else:
        prepared = _prepare_replicated(source, setup, layout, training)
    mark("loop_start")
    training.run_steps(prepared, setup, Observer())
    mark("loop_end")
    return prepared


def _prepare_replicated(source, setup, layout: dict, training):
    """ddp and zero1: the model built for real, freezing and checkpointing applied (trace/step.prepare),
    then wrapped in DDP; zero1 swaps the optimizer for ZeroRedundancyOptimizer. The optimizer prepare made
    is dropped before its first step, so it never held state."""
    from torch.nn.parallel import DistributedDataParallel

    from trainmem.trace import finetune

    model, make_batch, loss_fn = training.unpack_built(source.build(), source)
    model, _ = finetune.apply(model, setup)
    prepared = training.prepare(model, make_batch, loss_fn, setup, source)
    prepared.model = DistributedDataParallel(prepared.model, bucket_cap_mb=layout["ddp_bucket_mb"],
                                             gradient_as_bucket_view=layout["gradient_as_bucket_view"])
    if layout["strategy"] == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer_class, kwargs = _optimizer_class(setup)
        trainable = [p for p in prepared.model.parameters() if p.requires_grad]
        prepared.optimizer = ZeroRedundancyOptimizer(trainable, optimizer_class=optimizer_class, **kwargs)
    return prepared


def _prepare_sharded(source, setup, layout: dict, training):
    """fsdp and zero2, as torchtitan writes it: build on meta, checkpoint the blocks, fully_shard each
    block then the root, materialize the local shards on the CPU and initialize them, then the optimizer
    over the sharded (DTensor) parameters."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from trainmem.setup import Precision
    from trainmem.trace import finetune
    from trainmem.trace.checkpointing import checkpoint_blocks

    with torch.device("meta"):
        model, make_batch, loss_fn = training.unpack_built(source.build(), source)
    model, _ = finetune.apply(model, setup)
    if setup.precision == Precision.BF16:
        model.to(torch.bfloat16)  # before sharding: the shards are made in the dtype the run uses
    checkpointed = checkpoint_blocks(model) if setup.checkpointing else []
    # as a user writes it: fully_shard's own default unless the run asks (zero2: keep the gathered parameters)
    reshard = False if layout["strategy"] == "zero2" else layout.get("reshard_after_forward")
    options = {} if reshard is None else {"reshard_after_forward": reshard}
    mesh = _hsdp_mesh(layout) if layout["strategy"] == "hsdp" else None
    for block in wrap_units(model, layout.get("fsdp_wrap", "auto")):
        fully_shard(block, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    prepared = training.prepare(model, make_batch, loss_fn, dataclasses.replace(setup, checkpointing=False), source)
    prepared.checkpointed = checkpointed
    return prepared


def _prepare_fsdp1(source, setup, layout: dict, training):
    """fsdp1: the model built on the CPU, checkpointing applied, then FullyShardedDataParallel with an auto-wrap
    policy over the classes of the blocks (wrap_units below), and the optimizer over its parameters."""
    import torch
    from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from trainmem.setup import Precision
    from trainmem.trace import finetune
    from trainmem.trace.checkpointing import checkpoint_blocks

    model, make_batch, loss_fn = training.unpack_built(source.build(), source)
    model, _ = finetune.apply(model, setup)
    if setup.precision == Precision.BF16:
        model.to(torch.bfloat16)
    checkpointed = checkpoint_blocks(model) if setup.checkpointing else []
    training.freeze_parameters(model, setup.freeze)  # before wrapping: FSDP1 flattens what it wraps
    units = wrap_units(model, layout.get("fsdp_wrap", "auto"))
    # Lightning's FSDPPrecision.mixed_precision_config: fp32 parameters, low-precision reduction and buffers
    low = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(str(setup.precision))
    sharding = layout.get("fsdp1_sharding", "full-shard")
    mesh = {"device_mesh": _hsdp_mesh(layout)} if sharding == "hybrid-shard" else {}  # HYBRID_SHARD: (replicate, shard)
    model = FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({type(unit) for unit in units}) if units else None, **mesh,
        sharding_strategy=ShardingStrategy[sharding.upper().replace("-", "_")],
        use_orig_params=bool(layout.get("fsdp1_use_orig_params", False)), device_id=torch.device("cpu"),
        backward_prefetch={"pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST,
                           "none": None}[layout.get("fsdp1_backward_prefetch", "pre")],
        forward_prefetch=bool(layout.get("fsdp1_forward_prefetch", False)),
        mixed_precision=MixedPrecision(param_dtype=getattr(torch, layout.get("fsdp1_param_dtype", "float32")),
                                       reduce_dtype=low, buffer_dtype=low) if low else None)
    prepared = training.prepare(model, make_batch, loss_fn, dataclasses.replace(setup, checkpointing=False, freeze=()),
                                source)
    prepared.checkpointed = checkpointed
    return prepared


def _hsdp_mesh(layout: dict):
    """HSDP's 2-D mesh as torchtitan makes it: (replicate, shard), shard innermost."""
    from torch.distributed.device_mesh import init_device_mesh

    shard = layout["hsdp_shard"]
    return init_device_mesh("cpu", (layout["world_size"] // shard, shard), mesh_dim_names=("dp_replicate", "dp_shard"))


def wrap_units(model, policy: str) -> list:
    """The modules fully_shard is applied to before the root. "auto": each repeated block (the children of
    the first ModuleList/Sequential, in module order, holding two or more children of one class with
    parameters: a transformer's layers, an MLP's Linears), else each top-level child with parameters;
    "blocks": repeated blocks only; "children": top-level children with parameters; "root": none."""
    import torch

    def has_params(module) -> bool:
        return any(True for _ in module.parameters())

    blocks: list = []
    if policy in ("auto", "blocks"):
        for module in model.modules():
            if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
                kinds = [type(child) for child in module.children() if has_params(child)]
                repeated = {kind for kind in kinds if kinds.count(kind) >= 2}
                if repeated:
                    blocks = [child for child in module.children() if type(child) in repeated]
                    break
    if blocks or policy in ("blocks", "root"):
        return blocks
    return [child for child in model.children() if has_params(child)]


def _optimizer_class(setup) -> tuple[type, dict]:
    """The torch optimizer class and keywords the setup names (the same hyper-parameters as
    trace/step.make_optimizer), for ZeroRedundancyOptimizer's optimizer_class."""
    import torch

    from trainmem.setup import OptimizerImpl

    impl = {OptimizerImpl.FOREACH: {"foreach": True}, OptimizerImpl.FOR_LOOP: {"foreach": False},
            OptimizerImpl.FUSED: {"fused": True}}.get(setup.optimizer_impl, {})
    table = {"sgd": (torch.optim.SGD, {"lr": 0.01}), "momentum": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
             "adam": (torch.optim.Adam, {"lr": 1e-3}), "adamw": (torch.optim.AdamW, {"lr": 1e-3}),
             "rmsprop": (torch.optim.RMSprop, {"lr": 1e-3}), "adagrad": (torch.optim.Adagrad, {"lr": 0.01})}
    if str(setup.optimizer) not in table:
        raise ValueError(f"expected an optimizer ZeroRedundancyOptimizer can wrap ({', '.join(table)}), "
                         f"got {setup.optimizer}")
    cls, kwargs = table[str(setup.optimizer)]
    return cls, {**kwargs, **impl}


def _profiler_figures(events: list[tuple[int, int, int]], main: int | None) -> dict:
    """The profiler's view of the same run, beside c10's: its peak (running sum of its memory events over
    all threads, 64-byte rounded), the bytes it saw allocated on threads other than the main one (gloo's
    workers), and how many threads it saw allocate. It misses frees made on a thread without the
    profiler's state, so its peak can only be higher than c10's."""
    current = peak = other = 0
    for _, size, thread in events:
        rounded = (abs(size) + 63) // 64 * 64
        current += rounded if size > 0 else -rounded
        peak = max(peak, current)
        if size > 0 and thread != main:
            other += rounded
    return {"profiler_peak_bytes": peak, "other_thread_bytes": other, "threads_seen": len({e[2] for e in events}),
            "profiler_allocs": sum(e[1] > 0 for e in events), "profiler_frees": sum(e[1] < 0 for e in events)}


def main() -> None:
    request = json.loads(sys.argv[1])
    try:
        result = run(request)
    except Exception as error:  # noqa: BLE001 - reported to the parent as one JSON line
        result = {"error": f"{type(error).__name__}: {error}".splitlines()[0]}
    result["parallel_modules"] = sorted(name for name in sys.modules if name.startswith("trainmem.parallel"))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip teardown: nothing after the measurement should touch the figures


if __name__ == "__main__":
    main()
