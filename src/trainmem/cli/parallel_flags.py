"""The many-GPU flags of estimate, measure and fit (and plan): the layout of setup/layout.py as options.

argparse's defaults are None ("not given"), as for every other flag (parser.py): the layout's own defaults apply
when TrainingSetup builds it, and a --setup file's values are overridden only by flags the user typed.
"""

from __future__ import annotations

import argparse

from trainmem.setup.text_values import true_false


def _default(name: str) -> str:
    import dataclasses

    from trainmem.setup.layout import ParallelLayout

    field = next(f for f in dataclasses.fields(ParallelLayout) if f.name == name)
    value = field.default
    shown = ("on" if value else "off") if isinstance(value, bool) else str(value)
    return f" (default: {shown})"


def add_parallel_flags(parser: argparse.ArgumentParser) -> None:
    """--strategy, the degrees and the knobs that move per-rank memory, in a group of their own."""
    d = _default
    group = parser.add_argument_group("many GPUs (per-rank memory)")
    add = group.add_argument
    add("--strategy", metavar="KIND", help="ddp|fsdp|fsdp1|hsdp|zero1|zero2|zero3|tp|pp (fsdp is FSDP2's fully_shard, "
        "fsdp1 FullyShardedDataParallel); with --dp and no data-parallel kind named, fsdp (torchtitan's default)"
        + d("strategy"))
    add("--world-size", type=int, metavar="N", help="ranks in all; with --strategy alone it is that strategy's "
        "degree" + d("world_size"))
    add("--dp", type=int, metavar="N", help="data-parallel degree" + d("dp"))
    add("--tp", type=int, metavar="N", help="tensor-parallel degree (DTensor parallelize_module)" + d("tp"))
    add("--pp", type=int, metavar="N", help="pipeline stages (torch.distributed.pipelining)" + d("pp"))
    add("--dp-shard", type=int, metavar="N", help="hsdp, fsdp1 hybrid-shard: ranks that shard (replicated across the rest)"
        " (default: gpus-per-node / tp, at most dp)")
    add("--gpus-per-node", type=int, metavar="N", help="ranks per node: host RAM per node, HSDP's shard "
        "group" + d("gpus_per_node"))
    add("--offload", metavar="WHAT", help="optimizer|params: keep them in host RAM (reported per rank and per "
        "node); with --strategy fsdp1, params is FSDP1's CPUOffload" + d("offload"))
    add("--microbatches", type=int, metavar="N", help="pipeline micro-batches per step (default: pp)")
    add("--schedule", metavar="NAME", help="gpipe|1f1b|interleaved-1f1b" + d("schedule"))
    add("--stages-per-rank", type=int, metavar="N", help="interleaved-1f1b: virtual stages per rank"
        + d("stages_per_rank"))
    add("--ddp-bucket-mb", type=float, metavar="MB", help="DDP bucket_cap_mb" + d("ddp_bucket_mb"))
    add("--gradient-as-bucket-view", type=true_false, nargs="?", const=True, metavar="true|false",
        help="DDP: gradients are views into the buckets" + d("gradient_as_bucket_view"))
    _add_fsdp_flags(add, d)
    add("--zero3-prefetch-bucket", type=int, metavar="ELEMENTS", help="ZeRO-3 prefetch bucket size"
        + d("zero3_prefetch_bucket"))
    add("--zero3-persistence-threshold", type=int, metavar="ELEMENTS", help="ZeRO-3: parameters this small "
        "stay unsharded" + d("zero3_persistence_threshold"))


def _add_fsdp_flags(add, d) -> None:
    """FSDP2's knobs (--reshard-after-forward, --fsdp-prefetch, --fsdp-wrap) and FSDP1's (--fsdp1-*)."""
    add("--reshard-after-forward", type=true_false, metavar="true|false",
        help="FSDP: free the unsharded parameters after forward (default: fully_shard's own, which keeps the "
             "root's gathered from forward into backward and reshards every other module)")
    add("--no-reshard-after-forward", dest="reshard_after_forward", action="store_const", const=False,
        help="the same as --reshard-after-forward false (ZeRO-2-like) (default: not given)")
    add("--fsdp-prefetch", type=int, metavar="N", help="FSDP: modules all-gathered ahead" + d("fsdp_prefetch"))
    add("--fsdp-wrap", metavar="POLICY", help="auto (each repeated block, else each top-level child with "
        "parameters; then the root) | blocks | children | root" + d("fsdp_wrap"))
    add("--fsdp1-sharding", metavar="KIND", help="fsdp1: sharding_strategy full-shard|shard-grad-op|no-shard|hybrid-shard"
        + d("fsdp1_sharding"))
    add("--fsdp1-use-orig-params", type=true_false, nargs="?", const=True, metavar="true|false",
        help="fsdp1: use_orig_params (Lightning's FSDP strategy sets it)" + d("fsdp1_use_orig_params"))
    add("--fsdp1-backward-prefetch", metavar="WHEN", help="fsdp1: pre|post|none (BackwardPrefetch)"
        + d("fsdp1_backward_prefetch"))
    add("--fsdp1-forward-prefetch", type=true_false, nargs="?", const=True, metavar="true|false",
        help="fsdp1: forward_prefetch" + d("fsdp1_forward_prefetch"))
    add("--fsdp1-param-dtype", metavar="DTYPE", help="fsdp1 under a mixed precision: MixedPrecision's param_dtype, "
        "float32 (Lightning's) or the low dtype (PyTorch's FSDP tutorial)" + d("fsdp1_param_dtype"))


def measure_distributed_outcome(options, setup) -> str:
    """`trainmem measure … --strategy …`: real ranks over gloo on this machine (measure/gloo_ranks.py), each
    rank's measured peaks beside the estimate; the report text (or JSON)."""
    import importlib
    import json

    from trainmem.errors import SetupError

    if options.device != "cpu":
        raise SetupError(f"expected --device cpu for a distributed measurement here (ranks run over gloo on this "
                         f"machine), got {options.device!r}", where=options.origins.get("device", "--device"))
    try:
        module = importlib.import_module("trainmem.measure.gloo_ranks")
    except ModuleNotFoundError as error:
        if error.name != "trainmem.measure.gloo_ranks":
            raise
        raise SetupError("expected a single-process setup for measure, got --strategy: distributed measurement is "
                         "not yet supported (trainmem.measure.gloo_ranks is missing)", where="--strategy") from None
    result = module.measure_distributed(options.model, setup, runs=options.runs)
    return json.dumps(result.to_dict(), indent=2) if options.format == "json" else str(result)
