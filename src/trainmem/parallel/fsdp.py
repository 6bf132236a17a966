"""FSDP2 (`fully_shard`) and HSDP, traced for real: torch's own fully_shard runs on the meta-built model over
the fake process group's data-parallel mesh (2-D, replicate x shard, for HSDP), so sharded parameters, the
all-gather buffers and unsharded parameters, the reduce-scatter buffers and sharded gradients are made and
freed by FSDP2's own code (torch/distributed/fsdp/_fully_shard, torch 2.13).

Wrapping (`--fsdp-wrap`): `auto` shards each repeated block (in a ModuleList or Sequential, the children with
parameters whose class occurs there at least twice: transformer layers, a stack of Linear layers), else each
top-level child with parameters, then the root (torchtitan's apply_fsdp shards each
transformer block, then the model); `blocks`, `children` and `root` choose one of those alone.

Streams: FSDP2 makes the all-gather buffers under `all_gather_copy_in_stream` (forward and backward's implicit
prefetch) and the reduce-scatter output, of which the sharded gradients are views, under `reduce_scatter_stream`
(_fsdp_collectives.py foreach_all_gather / foreach_reduce); on the CPU trace those are torch.cpu streams, and the
recorder labels each storage with the stream current at its allocation, so the CUDA target replays them in pools of
their own. Their frees are where the trace drops the last reference: FSDP2 calls no record_stream, and NCCL in its
default synchronous mode runs on the caller's stream and records nothing (ProcessGroupNCCL::collective: asyncOp ?
ncclStreams_ : getCurrentCUDAStream; an async op stashes its tensors until work.wait(), which FSDP2's copy-out
calls before dropping the buffer), so no free happens later on the GPU than in the trace.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from trainmem.errors import SetupError, TorchVersionError
from trainmem.setup.layout import FsdpWrap, Offload, ParallelLayout, Strategy

SHARDED_KINDS = (Strategy.FSDP, Strategy.HSDP, Strategy.ZERO2, Strategy.ZERO3)


def on_meta(model: nn.Module, ctx: Any) -> nn.Module:
    """fully_shard each wrapping unit, then the root, with the layout's knobs (each pipeline stage of this
    rank as a root of its own, as torchtitan's apply_fsdp does per model part)."""
    layout = ctx.layout
    for root in roots(model):
        ctx.notes.extend(shard(root, ctx, reshard_after_forward=layout.reshard_after_forward,
                               prefetch=layout.fsdp_prefetch))
    if layout.pp > 1 and layout.reshard_after_forward is not False:
        asked = "as asked" if layout.reshard_after_forward else "by fully_shard's default (every unit but the root)"
        ctx.notes.append(f"FSDP with pipeline parallelism: units reshard after forward {asked}; torchtitan's default "
                         "there is False (parallelize.py: reshard_after_forward = not pp_enabled), which keeps "
                         "each stage's parameters unsharded between micro-batches")
    return model


def roots(model: nn.Module) -> list[nn.Module]:
    """The modules the schedule or loop calls: each stage of a multi-stage pipeline rank (pp.RankStages, whose
    own forward never runs), else the model."""
    stages = getattr(model, "stages", None)
    if hasattr(model, "trainmem_pipeline") and isinstance(stages, nn.ModuleDict):
        return list(stages.values())
    return [model]


def on_fake(model: nn.Module, ctx: Any):
    """Nothing to wrap after materialization; with --offload, which tensors live in host RAM."""
    from trainmem.parallel import offload
    from trainmem.parallel.apply import Parallelized

    return offload.parallelized(model, ctx) if ctx.layout.offload != Offload.NONE else Parallelized(model)


def shard(model: nn.Module, ctx: Any, *, reshard_after_forward: bool | None, prefetch: int,
          ignored_params: set[nn.Parameter] | None = None, units: list[nn.Module] | None = None) -> list[str]:
    """fully_shard the units (default: the layout's wrap policy's) and the root; returns the notes to print.
    reshard_after_forward=None passes no keyword, so the installed torch's own default is traced: in torch 2.13
    (_fully_shard.py: auto_reshard_after_forward = reshard_after_forward is None; _fsdp_state.py _lazy_init) every
    module reshards after forward except the root, which keeps its unsharded parameters into backward."""
    from torch.distributed.fsdp import fully_shard

    layout = ctx.layout
    mp_policy, mp_note = mixed_precision(ctx.setup)
    kwargs = dict(mesh=ctx.world.dp_mesh(), mp_policy=mp_policy, offload_policy=offload_policy(layout))
    if ignored_params:  # passed only when there are some: torch 2.6's fully_shard has no such keyword
        _takes_ignored_params(fully_shard)
        kwargs["ignored_params"] = ignored_params
    if reshard_after_forward is not None:
        kwargs["reshard_after_forward"] = reshard_after_forward
    units = wrap_units(model, layout.fsdp_wrap) if units is None else units
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    set_prefetch(units, prefetch)
    names = {id(m): name for name, m in model.named_modules()}
    listed = ", ".join(names[id(u)] for u in units[:3]) + (", …" if len(units) > 3 else "")
    kind = "HSDP (replicate x shard mesh)" if layout.strategy == Strategy.HSDP else "FSDP2"
    notes = [f"{kind}: fully_shard on {len(units)} unit(s) ({listed or 'none'}) then the root "
             f"(--fsdp-wrap {layout.fsdp_wrap}); {_reshard_words(reshard_after_forward)}; "
             f"prefetch {prefetch} module(s) ahead"]
    if prefetch == 0:
        notes.append("--fsdp-prefetch 0 traced as 1: FSDP2 has no public switch for its implicit backward prefetch "
                     "(_fsdp_param_group.py _backward_prefetch all-gathers the next module in each pre-backward)")
    return notes + ([mp_note] if mp_note else [])


def _reshard_words(reshard_after_forward: bool | None) -> str:
    if reshard_after_forward is None:
        return ("reshard_after_forward not passed (torch's default: every unit reshards after forward, the root "
                "keeps its parameters unsharded into backward)")
    return f"reshard_after_forward={reshard_after_forward}"


def wrap_units(model: nn.Module, policy: FsdpWrap | str) -> list[nn.Module]:
    """The modules fully_shard wraps before the root, in forward (registration) order."""
    policy = FsdpWrap(policy)
    if policy == FsdpWrap.ROOT:
        return []
    blocks = []
    if policy in (FsdpWrap.AUTO, FsdpWrap.BLOCKS):  # a pipeline stage of a causal LM names its own (pp_split.py)
        blocks = repeated_blocks(model) or (model.fsdp_blocks() if hasattr(model, "fsdp_blocks") else [])
    if blocks or policy == FsdpWrap.BLOCKS:
        return blocks
    children = model.fsdp_children() if hasattr(model, "fsdp_children") else list(model.children())
    return [child for child in children if _has_parameters(child)]


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """In every ModuleList/Sequential (the model itself included), the children with parameters whose class
    occurs there at least twice (a transformer's layers, an MLP's Linears; an encoder's and a decoder's
    layers both); the search does not descend into a block found."""
    found: list[nn.Module] = []

    def members(container: nn.Module) -> list[nn.Module]:
        kinds = [type(m) for m in container.children() if _has_parameters(m)]
        return [m for m in container.children() if _has_parameters(m) and kinds.count(type(m)) >= 2]

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if id(child) in taken:
                continue
            if isinstance(child, (nn.ModuleList, nn.Sequential)) and members(child):
                found.extend(members(child))
                taken.update(id(m) for m in members(child))
                continue
            visit(child)

    taken: set[int] = set()
    if isinstance(model, (nn.ModuleList, nn.Sequential)) and members(model):
        return members(model)
    visit(model)
    return found


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _takes_ignored_params(fully_shard: Any) -> None:
    """fully_shard(ignored_params=…) exists from torch 2.7 (torch/distributed/fsdp/_fully_shard/_fully_shard.py);
    on 2.6, ZeRO-3's persistent parameters cannot be left whole: refused in one line."""
    import inspect

    if "ignored_params" not in inspect.signature(fully_shard).parameters:
        raise TorchVersionError(f"--strategy zero3 with a persistence threshold needs torch >= 2.7, whose fully_shard "
                                f"takes ignored_params (this is torch {torch.__version__}); "
                                "--zero3-persistence-threshold 0 keeps no parameter whole",
                                where="--zero3-persistence-threshold")


def set_prefetch(units: list[nn.Module], count: int) -> None:
    """FSDP2 prefetches one module implicitly (the next in backward; the all-gather of the next in forward is
    issued when its forward starts). Above one, each unit all-gathers the next `count` units in forward and
    the previous `count` in backward (set_modules_to_forward_prefetch / set_modules_to_backward_prefetch,
    torchtitan's explicit prefetch pattern)."""
    if count <= 1 or len(units) < 2:
        return
    for index, unit in enumerate(units):
        unit.set_modules_to_forward_prefetch(units[index + 1:index + 1 + count])
        unit.set_modules_to_backward_prefetch(list(reversed(units[max(0, index - count):index])))


def mixed_precision(setup: Any) -> tuple[Any, str]:
    """FSDP2's MixedPrecisionPolicy for the setup's precision: bf16-mixed is torchtitan's default
    (param_dtype=bfloat16 all-gathered and computed in, reduce_dtype=float32 for the reduce-scatter)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from trainmem.setup import Precision

    precision = getattr(setup, "precision", Precision.FP32)
    if precision == Precision.BF16_MIXED:
        return (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
                "FSDP2 mixed precision: MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), "
                "torchtitan's default: fp32 sharded parameters, bf16 unsharded parameters")
    if precision == Precision.FP16_MIXED:
        return (MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32),
                "FSDP2 mixed precision: MixedPrecisionPolicy(param_dtype=float16, reduce_dtype=float32)")
    return MixedPrecisionPolicy(), ""


def offload_policy(layout: ParallelLayout) -> Any:
    """CPUOffloadPolicy for --offload params. pin_memory=False: a fake tensor cannot be pinned
    (aten._pin_memory has no fake kernel); pinning copies each shard once at construction, the same bytes
    in host RAM afterwards."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    return CPUOffloadPolicy(pin_memory=False) if layout.offload == Offload.PARAMS else OffloadPolicy()


# ---- which data-parallel indices hold the same sizes ---------------------------------------------------
def chunk_rows(rows: int, ranks: int) -> list[int]:
    """Rows of dim 0 each rank holds under torch.chunk(rows, ranks) padded with empty chunks
    (_fsdp_common._chunk_with_empty): ceil(rows / ranks) each until the rows run out."""
    size = math.ceil(rows / ranks) if rows else 0
    return [max(0, min(size, rows - index * size)) for index in range(ranks)]


def local_numels(shape: tuple[int, ...], ranks: int) -> list[int]:
    """Elements of a parameter's local (unpadded) shard on each shard index. FSDP2 pads every rank's sharded
    parameter storage to chunk 0's size (_fsdp_param.py: padded_sharded_param = new_zeros(chunks[0].size())),
    and the sharded gradient is a view of the padded reduce-scatter output: those are equal on every rank;
    the optimizer state (zeros_like of the unpadded local view) is what differs."""
    if not shape:
        return [1] + [0] * (ranks - 1)
    inner = math.prod(shape[1:])
    return [rows * inner for rows in chunk_rows(shape[0], ranks)]


def dp_index_classes(model_on_meta: nn.Module, layout: ParallelLayout) -> list[tuple[int, ...]]:
    """Groups of data-parallel indices whose local shards (or ZeRO-1 partitions) have the same sizes."""
    layout = layout.resolve()
    kind = layout.data_parallel
    if kind is None or layout.dp == 1 or kind == Strategy.DDP:
        return [tuple(range(layout.dp))]
    if kind == Strategy.FSDP1:
        from trainmem.parallel.fsdp1 import dp_index_classes as fsdp1_classes

        return fsdp1_classes(layout)
    if kind == Strategy.ZERO1:
        from trainmem.parallel.zero import zero1_classes

        return zero1_classes(model_on_meta, layout)
    if kind not in SHARDED_KINDS:
        raise SetupError(f"expected a data-parallel strategy, got {kind}", where="--strategy")
    shard = layout.hsdp_shard if kind == Strategy.HSDP else layout.dp
    cuts = sorted({0, shard} | {b for shape in set(_shard_shapes(model_on_meta, layout.tp))
                                for b in chunk_boundaries(shape, shard)})
    # mesh (dp_replicate, dp_shard) in row-major order: a dp index's shard index is the inner one
    return [tuple(i for i in range(layout.dp) if low <= i % shard < high) for low, high in zip(cuts, cuts[1:])]


def chunk_boundaries(shape: tuple[int, ...], ranks: int) -> set[int]:
    """Shard indices where a parameter's local size changes: ranks below d0 // c hold c rows (c = ceil(d0 /
    ranks)), one may hold the remainder, the rest none (chunk_rows). Sizes only fall along the indices, so the
    ranks between two consecutive boundaries of all parameters hold equal sizes of every one, and ranks on
    either side of a boundary differ: the classes are those intervals (O(parameters + ranks), not their
    product: 1,024 ranks of a 70B model)."""
    rows = shape[0] if shape else 1
    if rows == 0 or math.prod(shape[1:]) == 0:
        return set()
    size = math.ceil(rows / ranks)
    return {b for b in (rows // size, math.ceil(rows / size)) if 0 < b < ranks}


def _shard_shapes(model: nn.Module, tp: int) -> list[tuple[int, ...]]:
    """Each distinct parameter's shape; with tensor parallelism also the shape with dim 0 split tp ways
    (a column-wise TP shard, which FSDP2 then chunks): a class that holds for both holds for either."""
    unique = {id(p): p for p in model.parameters()}.values()
    shapes = [tuple(p.shape) for p in unique]
    if tp > 1:
        shapes += [(s[0] // tp, *s[1:]) for s in shapes if s and s[0] % tp == 0]
    return shapes
