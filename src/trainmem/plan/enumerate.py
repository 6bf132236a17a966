"""Every layout the planner considers for COUNT GPUs: the data-parallel kind × the degrees dp·tp·pp = COUNT ×
micro-batch size × activation checkpointing × precision × offload. No torch.

Rules (each the reason a combination is left out, not a guess about what fits):
- tp divides the GPUs of one node (a TP group's all-reduces stay on NVLink, torchtitan's advice) and the count;
  pp is at most the model's number of repeated blocks (a stage with no block holds nothing to pipeline).
- DDP and ZeRO-1 (DDP with a sharded optimizer) never go with tp > 1: DDP replicates plain tensors, not DTensor
  shards (parallel/ddp.py refuses the layout, as torchtitan does).
- dp = 1 has no data-parallel kind (and nothing to offload: offload is a sharded kind's, layout.py).
- HSDP differs from FSDP only where the data-parallel ranks span nodes (shard degree < dp).
- offload optimizer only with the sharded kinds, params only with those that can move parameters
  (layout.offload_allowed: not ZeRO-1 or ZeRO-2, as DeepSpeed).
- with pp > 1 the micro-batch is the pipeline's: each data-parallel rank's batch is micro-batch × microbatches
  (microbatches = pp, the least that fills the pipe; layout.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

from trainmem.setup.layout import Offload, ParallelLayout, Strategy, offload_allowed
from trainmem.setup import Precision

DEFAULT_KINDS = (Strategy.DDP, Strategy.FSDP, Strategy.HSDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3)
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_PRECISIONS = (Precision.BF16_MIXED, Precision.FP32)
DEFAULT_OFFLOADS = (Offload.NONE, Offload.OPTIMIZER, Offload.PARAMS)


@dataclasses.dataclass(frozen=True, order=True)
class Candidate:
    """One layout with its run settings."""

    kind: Strategy  # the data-parallel kind (NONE with dp 1)
    dp: int
    tp: int
    pp: int
    micro_batch: int
    checkpointing: bool
    precision: Precision
    offload: Offload

    def layout(self, gpus_per_node: int, base: ParallelLayout | None = None) -> ParallelLayout:
        """The layout, with the knobs of `base` (the user's schedule, bucket size, …) kept."""
        strategy = self.kind
        if strategy == Strategy.NONE and self.tp * self.pp > 1:
            strategy = Strategy.TP if self.tp > 1 else Strategy.PP
        return dataclasses.replace(base or ParallelLayout(), strategy=strategy, world_size=self.dp * self.tp * self.pp,
                                   dp=self.dp, tp=self.tp, pp=self.pp, gpus_per_node=gpus_per_node,
                                   offload=self.offload, microbatches=None, dp_shard=None).resolve()

    @property
    def batch_size(self) -> int:
        """The setup's batch size: per data-parallel rank, split into pp micro-batches by a pipeline."""
        return self.micro_batch * (self.pp if self.pp > 1 else 1)

    def structure(self) -> tuple:
        """What a trace depends on besides the micro-batch and the data-parallel degree (which reuse.py
        handles without tracing every value)."""
        return (self.kind, self.tp, self.pp, self.checkpointing, self.precision, self.offload)

    def label(self) -> str:
        parts = [str(self.kind) if self.kind != Strategy.NONE else "no data parallelism"]
        parts += [f"dp{self.dp}"] if self.dp > 1 else []
        parts += [f"tp{self.tp}"] if self.tp > 1 else []
        parts += [f"pp{self.pp}"] if self.pp > 1 else []
        parts += [f"mb{self.micro_batch}", str(self.precision)]
        parts += ["ckpt"] if self.checkpointing else []
        parts += [f"offload-{self.offload}"] if self.offload != Offload.NONE else []
        return " ".join(parts)

    def to_dict(self) -> dict:
        return {"strategy": str(self.kind), "dp": self.dp, "tp": self.tp, "pp": self.pp,
                "micro_batch": self.micro_batch, "batch_size": self.batch_size, "checkpointing": self.checkpointing,
                "precision": str(self.precision), "offload": str(self.offload)}


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def degrees(count: int, gpus_per_node: int, blocks: int, tps=None, pps=None) -> Iterator[tuple[int, int, int]]:
    """(dp, tp, pp) with dp·tp·pp = count, tp dividing a node's GPUs, pp at most the blocks; only the tp and pp
    degrees listed in `tps` / `pps` when given."""
    for tp in divisors(count):
        if tp > gpus_per_node or gpus_per_node % tp or (tps and tp not in tps):
            continue
        for pp in divisors(count // tp):
            if pp <= max(blocks, 1) and not (pps and pp not in pps):
                yield count // (tp * pp), tp, pp


REPLICATING_KINDS = (Strategy.DDP, Strategy.ZERO1)  # DDP's replicas: no tensor parallelism under them


def kinds_for(dp: int, tp: int, gpus_per_node: int, kinds: Iterable[Strategy]) -> list[Strategy]:
    if dp == 1:
        return [Strategy.NONE]
    shard = max(1, min(dp, gpus_per_node // tp))  # layout.hsdp_shard's default
    return [k for k in kinds if (k != Strategy.HSDP or (shard < dp and dp % shard == 0))
            and not (tp > 1 and k in REPLICATING_KINDS)]


def candidates(count: int, gpus_per_node: int, blocks: int, *, kinds=DEFAULT_KINDS,
               micro_batches=DEFAULT_MICRO_BATCHES, checkpointing=(False, True), precisions=DEFAULT_PRECISIONS,
               offloads=DEFAULT_OFFLOADS, tps=None, pps=None) -> list[Candidate]:
    out = []
    for dp, tp, pp in degrees(count, gpus_per_node, blocks, tps, pps):
        for kind in kinds_for(dp, tp, gpus_per_node, kinds):
            for offload in offloads:
                if not offload_allowed(kind, Offload(offload)):
                    continue
                for precision in precisions:
                    for ckpt in checkpointing:
                        for mb in micro_batches:
                            out.append(Candidate(kind, dp, tp, pp, mb, ckpt, Precision(precision), Offload(offload)))
    return out
