"""How a training run is laid out over ranks: the data-parallel kind (DDP, FSDP, HSDP, ZeRO 1/2/3), the degrees
of data, tensor and pipeline parallelism, offload, micro-batches and the knobs that move memory. No torch here:
the CLI, TOML files and the planner build and check this before anything is traced.

Ranks are numbered as torch's `init_device_mesh(..., (pp, dp, tp))` numbers them (torchtitan's order, tensor
parallel innermost so that a TP group stays inside a node): rank = (pp_index * dp + dp_index) * tp + tp_index.
`--batch-size` is the batch each data-parallel rank sees per optimizer micro-step (torchtitan's local batch); with
pipeline parallelism that batch is split into `microbatches` micro-batches by the schedule.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from trainmem.errors import SetupError


class Strategy(enum.StrEnum):
    NONE = "none"  # one process, no torch.distributed
    DDP = "ddp"  # DistributedDataParallel: full replica, gradients all-reduced in buckets
    FSDP = "fsdp"  # FSDP2 fully_shard over all data-parallel ranks
    FSDP1 = "fsdp1"  # FullyShardedDataParallel (FlatParameter), as Lightning's FSDP strategy wraps a model
    HSDP = "hsdp"  # FSDP2 on a 2-D mesh: shard inside a node, replicate across nodes
    ZERO1 = "zero1"  # optimizer state sharded
    ZERO2 = "zero2"  # + gradients sharded
    ZERO3 = "zero3"  # + parameters sharded
    TP = "tp"  # DTensor tensor parallelism (parallelize_module)
    PP = "pp"  # torch.distributed.pipelining


DATA_PARALLEL = (Strategy.DDP, Strategy.FSDP, Strategy.FSDP1, Strategy.HSDP, Strategy.ZERO1, Strategy.ZERO2,
                 Strategy.ZERO3)


class Offload(enum.StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"  # optimizer state (and its step) in host RAM
    PARAMS = "params"  # sharded parameters, gradients and optimizer state in host RAM (FSDP2 CPUOffloadPolicy)


class Schedule(enum.StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"


class Fsdp1Sharding(enum.StrEnum):
    """FSDP1's ShardingStrategy (torch/distributed/fsdp/api.py), spelt as flags; each member's name is its
    ShardingStrategy's (parallel/fsdp1.py looks it up by name)."""

    FULL_SHARD = "full-shard"  # parameters, gradients and optimizer state sharded; parameters freed after forward
    SHARD_GRAD_OP = "shard-grad-op"  # the same, but the gathered parameters are kept from forward into backward
    NO_SHARD = "no-shard"  # every rank a full replica (DDP by FSDP's own code: all-reduce of the flat gradient)
    HYBRID_SHARD = "hybrid-shard"  # FULL_SHARD inside a shard group (--dp-shard, default a node), replicated across


class FsdpWrap(enum.StrEnum):
    AUTO = "auto"  # each repeated block, else each top-level child with parameters; then the root
    BLOCKS = "blocks"  # each repeated block only, then the root
    CHILDREN = "children"  # each top-level child with parameters, then the root
    ROOT = "root"  # the root alone: one all-gather of everything


FSDP1_PARAM_DTYPES = ("float32", "bfloat16", "float16")
FSDP1_BACKWARD_PREFETCH = ("pre", "post", "none")
MAX_WORLD_SIZE = 1 << 20  # a million ranks: beyond any cluster; bounds the per-rank bookkeeping


@dataclasses.dataclass(frozen=True)
class ParallelLayout:
    """The layout of one run. The default is one process without torch.distributed."""

    strategy: Strategy = Strategy.NONE  # the data-parallel kind (or tp / pp alone)
    world_size: int = 1
    dp: int = 1  # data-parallel degree (for hsdp: replicate x shard)
    tp: int = 1
    pp: int = 1
    dp_shard: int | None = None  # hsdp: ranks that shard (default: gpus_per_node / (tp), capped by dp)
    gpus_per_node: int = 8
    offload: Offload = Offload.NONE
    microbatches: int | None = None  # pipeline micro-batches per step (None: pp, the least that fills the pipe)
    schedule: Schedule = Schedule.ONE_F_ONE_B
    stages_per_rank: int = 2  # interleaved 1F1B's virtual stages per rank
    ddp_bucket_mb: float = 25.0  # DistributedDataParallel(bucket_cap_mb=25) default
    gradient_as_bucket_view: bool = False  # DDP default False: grads are copied into the buckets
    # None: fully_shard's own default, not passed (torch 2.13 _fully_shard.py: None reshards every module but the root,
    # which lazy_init keeps gathered from forward into backward; measured on an H200, benchmarks/results/
    # accuracy_distributed_gpu.md: passing True drops the root's gathered parameters from the backward peak)
    reshard_after_forward: bool | None = None
    fsdp_prefetch: int = 1  # modules all-gathered ahead (FSDP2's implicit prefetch is one)
    fsdp_wrap: FsdpWrap = FsdpWrap.AUTO
    zero3_prefetch_bucket: int = 50_000_000  # DeepSpeed stage3_prefetch_bucket_size default (elements)
    zero3_persistence_threshold: int = 100_000  # DeepSpeed stage3_param_persistence_threshold default (elements)
    fsdp1_sharding: Fsdp1Sharding = Fsdp1Sharding.FULL_SHARD  # FSDP1's sharding_strategy default
    fsdp1_use_orig_params: bool = False  # FSDP1's default; Lightning's FSDP strategy sets True (fabric/strategies/fsdp.py)
    # MixedPrecision's param_dtype under a mixed precision: float32 as Lightning sets it (under autocast), or the low
    # dtype itself as PyTorch's FSDP tutorial and llama-recipes set it (bfSixteen), which gathers 16-bit parameters
    fsdp1_param_dtype: str = "float32"
    fsdp1_backward_prefetch: str = "pre"  # BACKWARD_PRE (FSDP1's default) | post (BACKWARD_POST) | none
    fsdp1_forward_prefetch: bool = False  # FSDP1's default

    def __post_init__(self) -> None:
        for name, enum_type in (("strategy", Strategy), ("offload", Offload), ("schedule", Schedule),
                                ("fsdp_wrap", FsdpWrap), ("fsdp1_sharding", Fsdp1Sharding)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, enum_type(value))
            except ValueError:
                choices = ", ".join(item.value for item in enum_type)
                raise SetupError(f"expected one of {choices}, got {value!r}", where=f"--{name.replace('_', '-')}") from None
        for name in ("world_size", "dp", "tp", "pp", "gpus_per_node", "stages_per_rank", "fsdp_prefetch"):
            _positive_int(getattr(self, name), f"--{name.replace('_', '-')}", allow_zero=name == "fsdp_prefetch")
        for name in ("zero3_prefetch_bucket", "zero3_persistence_threshold"):
            _positive_int(getattr(self, name), f"--{name.replace('_', '-')}", allow_zero=True)
        if self.microbatches is not None:
            _positive_int(self.microbatches, "--microbatches")
        if self.dp_shard is not None:
            _positive_int(self.dp_shard, "--dp-shard")
        if isinstance(self.ddp_bucket_mb, bool) or not isinstance(self.ddp_bucket_mb, (int, float)) \
                or not 0 < self.ddp_bucket_mb < 1 << 20:
            raise SetupError(f"expected a bucket size in MB above 0, got {self.ddp_bucket_mb!r}", where="--ddp-bucket-mb")
        if self.fsdp1_backward_prefetch not in FSDP1_BACKWARD_PREFETCH:
            raise SetupError(f"expected one of {', '.join(FSDP1_BACKWARD_PREFETCH)}, got {self.fsdp1_backward_prefetch!r}",
                             where="--fsdp1-backward-prefetch")
        if self.fsdp1_param_dtype not in FSDP1_PARAM_DTYPES:
            raise SetupError(f"expected one of {', '.join(FSDP1_PARAM_DTYPES)}, got {self.fsdp1_param_dtype!r}",
                             where="--fsdp1-param-dtype")
        for name in ("gradient_as_bucket_view", "reshard_after_forward", "fsdp1_use_orig_params",
                     "fsdp1_forward_prefetch"):
            if not isinstance(getattr(self, name), bool) and not (name == "reshard_after_forward" and getattr(self, name) is None):
                raise SetupError(f"expected true or false, got {getattr(self, name)!r}", where=f"--{name.replace('_', '-')}")
        if self.world_size > MAX_WORLD_SIZE:
            raise SetupError(f"expected a world size of at most {MAX_WORLD_SIZE:,}, got {self.world_size:,}",
                             where="--world-size")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or self.strategy != Strategy.NONE

    @property
    def data_parallel(self) -> Strategy | None:
        """The data-parallel kind over the dp dimension, None when dp is 1 and no such kind was named."""
        return self.strategy if self.strategy in DATA_PARALLEL else None

    @property
    def replicate_x_shard(self) -> bool:
        """Whether the data-parallel ranks form a 2-D (replicate, shard) mesh: HSDP, or FSDP1's HYBRID_SHARD."""
        return self.strategy == Strategy.HSDP or (self.strategy == Strategy.FSDP1
                                                  and self.fsdp1_sharding == Fsdp1Sharding.HYBRID_SHARD)

    @property
    def hsdp_shard(self) -> int:
        """HSDP's shard degree: --dp-shard, else the data-parallel ranks of one node (gpus_per_node / tp)
        capped by dp; the replicate degree is dp / this."""
        if self.dp_shard is not None:
            return self.dp_shard
        return max(1, min(self.dp, self.gpus_per_node // self.tp))

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp index, dp index, tp index) of a rank, in init_device_mesh's row-major order (module docstring)."""
        tp_index = rank % self.tp
        dp_index = (rank // self.tp) % self.dp
        return rank // (self.tp * self.dp), dp_index, tp_index

    def rank_of(self, pp_index: int, dp_index: int, tp_index: int) -> int:
        return (pp_index * self.dp + dp_index) * self.tp + tp_index

    def resolve(self) -> ParallelLayout:
        """The layout with dp, tp, pp and world_size made consistent (see _resolved). Idempotent."""
        return _resolved(self)

    def to_dict(self) -> dict[str, Any]:
        """Every field; FSDP1's knobs only where the strategy is fsdp1 (the other layouts' keys stay as they were)."""
        return {f.name: (str(v) if isinstance(v, enum.Enum) else v)
                for f in dataclasses.fields(self) for v in [getattr(self, f.name)]
                if self.strategy == Strategy.FSDP1 or not f.name.startswith("fsdp1_")}


def _positive_int(value: Any, where: str, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SetupError(f"expected a whole number of at least {low}, got {value!r}", where=where)


# Which degree --world-size fills when only the strategy names it: the dimension that strategy splits.
_FREE_DIMENSION = {**{kind: "dp" for kind in DATA_PARALLEL}, Strategy.TP: "tp", Strategy.PP: "pp"}
# Sharded data-parallel kinds: what an offload moves to host RAM exists per rank only there (FSDP2's
# CPUOffloadPolicy, DeepSpeed's offload_optimizer / offload_param); DDP keeps full replicas on the device.
OFFLOAD_KINDS = (Strategy.FSDP, Strategy.HSDP, Strategy.FSDP1, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3)
# Those that can move parameters too: FSDP2's CPUOffloadPolicy, FSDP1's CPUOffload(offload_params=True), and ZeRO
# stage 3 only ("offload_param ... available only with ZeRO stage 3", DeepSpeed's docs/_pages/config-json.md; its
# stage 1 and 2 offload the optimizer state, deepspeed/runtime/zero/config.py). ZeRO-1 is DDP's full replicas.
PARAMS_OFFLOAD_KINDS = (Strategy.FSDP, Strategy.HSDP, Strategy.FSDP1, Strategy.ZERO3)


def offload_allowed(strategy: Strategy, offload: Offload) -> bool:
    """Whether `strategy` can run with `offload` (the planner enumerates only these)."""
    kinds = {Offload.NONE: None, Offload.OPTIMIZER: OFFLOAD_KINDS, Offload.PARAMS: PARAMS_OFFLOAD_KINDS}[offload]
    return kinds is None or strategy in kinds


def _resolved(layout: ParallelLayout) -> ParallelLayout:
    """`--strategy fsdp --world-size 8` -> dp 8; `--strategy tp --world-size 8` -> tp 8; `--dp 16 --tp 8 --pp 4`
    -> world 512 with FSDP over dp (torchtitan's default data parallelism); then every check that needs
    the degrees together. A degree of 1 counts as not given."""
    degrees = {"dp": layout.dp, "tp": layout.tp, "pp": layout.pp}
    product = layout.dp * layout.tp * layout.pp
    free = _FREE_DIMENSION.get(layout.strategy)
    if layout.world_size > 1 and product == 1 and free is None:
        raise SetupError(f"expected --strategy (ddp|fsdp|fsdp1|hsdp|zero1|zero2|zero3|tp|pp) or --dp/--tp/--pp with "
                         f"--world-size {layout.world_size}, got neither", where="--world-size")
    if layout.world_size > 1 and product != layout.world_size:
        if free is None or degrees[free] != 1 or layout.world_size % product:
            raise SetupError(f"expected --world-size = dp x tp x pp = {product:,}, got {layout.world_size:,}",
                             where="--world-size")
        degrees[free] = layout.world_size // product
    world = degrees["dp"] * degrees["tp"] * degrees["pp"]
    if world > MAX_WORLD_SIZE:
        raise SetupError(f"expected at most {MAX_WORLD_SIZE:,} ranks, got dp x tp x pp = {world:,}", where="--dp")
    strategy = layout.strategy
    if degrees["dp"] > 1 and strategy not in DATA_PARALLEL:
        strategy = Strategy.FSDP  # torchtitan shards the dp dimension with FSDP2 unless told otherwise
    elif strategy == Strategy.NONE and world > 1:
        strategy = Strategy.TP if degrees["tp"] > 1 else Strategy.PP
    resolved = dataclasses.replace(layout, strategy=strategy, world_size=world, **degrees)
    _check_together(resolved, layout.strategy)
    if resolved.pp > 1 and resolved.microbatches is None:
        resolved = dataclasses.replace(resolved, microbatches=resolved.pp)  # the least that fills the pipe
    return resolved


def _strategy_given(layout: ParallelLayout, given: Strategy) -> str:
    """The resolved strategy as the user came by it: typed, the default, or chosen from the degrees they gave."""
    if layout.strategy == given:
        return f"--strategy {given}" + (" (the default)" if given == Strategy.NONE else "")
    degree = "dp" if layout.strategy in DATA_PARALLEL else str(layout.strategy)
    return f"--strategy {layout.strategy} (implied by --{degree} {getattr(layout, degree)})"


def _check_together(layout: ParallelLayout, given: Strategy) -> None:
    """What the degrees, strategy and knobs must agree on; each refusal names the flag to change. `given`: the
    strategy before it was resolved, so that a message names the flag the user typed or says it was implied."""
    if layout.strategy == Strategy.TP and layout.tp == 1:
        raise SetupError("expected --tp or --world-size above 1 with --strategy tp, got 1 rank", where="--strategy")
    if layout.strategy == Strategy.PP and layout.pp == 1:
        raise SetupError("expected --pp or --world-size above 1 with --strategy pp, got 1 rank", where="--strategy")
    if layout.microbatches is not None and layout.pp == 1:
        raise SetupError(f"expected --pp above 1 with --microbatches (micro-batches are a pipeline schedule's), "
                         f"got --microbatches {layout.microbatches} without a pipeline", where="--microbatches")
    if layout.pp > 1 and layout.microbatches is not None and layout.microbatches < layout.pp:
        raise SetupError(f"expected at least --pp ({layout.pp}) micro-batches so that every stage has work, got "
                         f"{layout.microbatches}", where="--microbatches")
    _check_fsdp1(layout, given)
    if layout.offload != Offload.NONE and layout.strategy not in OFFLOAD_KINDS:
        raise SetupError(f"expected a sharded data-parallel strategy (fsdp|hsdp|fsdp1|zero1|zero2|zero3) with --offload, "
                         f"got {_strategy_given(layout, given)}", where="--offload")
    if not offload_allowed(layout.strategy, layout.offload):
        raise SetupError(f"expected --offload optimizer with {layout.strategy} (DeepSpeed offloads parameters with ZeRO "
                         f"stage 3 only: --strategy zero3, fsdp, hsdp or fsdp1), got --offload params",
                         where="--offload")
    if layout.replicate_x_shard:
        shard = layout.hsdp_shard
        if shard > layout.dp or layout.dp % shard:
            raise SetupError(f"expected --dp-shard dividing the data-parallel degree {layout.dp}, got {shard}",
                             where="--dp-shard")
    elif layout.dp_shard is not None:
        raise SetupError(f"expected --strategy hsdp (or fsdp1 with --fsdp1-sharding hybrid-shard) with --dp-shard, "
                         f"got {_strategy_given(layout, given)}",
                         where="--dp-shard")


def _check_fsdp1(layout: ParallelLayout, given: Strategy) -> None:
    """FSDP1's knobs belong to --strategy fsdp1, and FSDP2's to the others; what FSDP1 is not traced with is refused."""
    if layout.strategy != Strategy.FSDP1:
        defaults = (("fsdp1_sharding", Fsdp1Sharding.FULL_SHARD), ("fsdp1_use_orig_params", False),
                    ("fsdp1_param_dtype", "float32"), ("fsdp1_backward_prefetch", "pre"),
                    ("fsdp1_forward_prefetch", False))
        knobs = [(name, value) for name, value in defaults if getattr(layout, name) != value]
        if knobs:
            flag = f"--{knobs[0][0].replace('_', '-')}"
            raise SetupError(f"expected --strategy fsdp1 with {flag}, got {_strategy_given(layout, given)}", where=flag)
        return
    if layout.offload == Offload.OPTIMIZER:
        raise SetupError("expected --offload params with --strategy fsdp1 (FSDP1's CPUOffload(offload_params=True) "
                         "keeps parameters, gradients and the optimizer step on the host together), got --offload "
                         "optimizer", where="--offload")
    if layout.reshard_after_forward is not None:
        raise SetupError("expected --fsdp1-sharding shard-grad-op (keep the gathered parameters into backward) with "
                         "--strategy fsdp1, got --reshard-after-forward, which is FSDP2's", where="--reshard-after-forward")
    if layout.fsdp_prefetch != 1:
        raise SetupError(f"expected --fsdp-prefetch 1 with --strategy fsdp1 (FSDP1's own prefetch is traced: "
                         f"backward_prefetch=BACKWARD_PRE, forward_prefetch=False), got {layout.fsdp_prefetch}",
                         where="--fsdp-prefetch")
    if layout.tp > 1 or layout.pp > 1:
        raise SetupError(f"expected --strategy fsdp1 alone (dp ranks only), got tp {layout.tp} and pp {layout.pp}: "
                         "FSDP1 with tensor or pipeline parallelism is not traced; --strategy fsdp is FSDP2, which is",
                         where="--strategy")
