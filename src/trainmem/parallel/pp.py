"""Pipeline parallelism with torch.distributed.pipelining: the model is split into stages on meta
(pp_split.py), this rank keeps its own stage(s), and the real schedule (ScheduleGPipe, Schedule1F1B,
ScheduleInterleaved1F1B) drives forward and backward of every micro-batch, so the activations of in-flight
micro-batches stay alive exactly as long as the schedule keeps them (its forward cache), and its receive buffers
are the ones it allocates.

The loop is torchtitan's train_step (torchtitan/train.py): every pipeline rank takes the batch from its loader,
zero_grad, `schedule.step(inputs)` on the first stage, `step(target=labels, losses=…)` on the last, `step()`
between, then the optimizer step. Under the fake process group a send or receive completes without data.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from torch import nn

from trainmem.errors import SetupError
from trainmem.parallel.apply import ParallelContext, Parallelized
from trainmem.setup.layout import Schedule
from trainmem.setup import Precision
from trainmem.parallel.pp_split import split_stages, stage_parameter_counts, total_stages  # noqa: F401 - re-exported


@dataclasses.dataclass
class PipelinePlan:
    stage_indices: tuple[int, ...]  # the stages this rank runs, in order
    num_stages: int
    meta_model: nn.Module  # an untouched meta copy of the whole model, for the stage boundaries' shapes
    microbatches: int


class RankStages(nn.Module):
    """This rank's stages (interleaved 1F1B: `stages_per_rank` of them), one module for the optimizer."""

    def __init__(self, stages: dict[int, nn.Module]) -> None:
        super().__init__()
        self.stages = nn.ModuleDict({str(index): stage for index, stage in stages.items()})
        self.tp_plan = {f"stages.{index}.{key}": style for index, stage in stages.items()
                        for key, style in (getattr(stage, "tp_plan", None) or {}).items()}

    def forward(self, *args: Any) -> Any:
        raise SetupError("expected the pipeline schedule to call each stage, got a direct call", where="--pp")


def rank_stage_indices(pp_rank: int, pp: int, num_stages: int) -> tuple[int, ...]:
    """Stages on a rank, looping as torch's multi-stage schedules place them (stage s on rank s % pp)."""
    return tuple(range(pp_rank, num_stages, pp))


def _microbatches(ctx: ParallelContext) -> int:
    layout, setup = ctx.layout, ctx.setup
    count = layout.microbatches or layout.pp
    if setup.batch_size % count:
        # the layout fills microbatches with pp when it is not given: say so, since the user may have typed neither
        raise SetupError(f"expected --batch-size ({setup.batch_size}) to divide into --microbatches {count} (the "
                         f"pipeline's micro-batches; default: --pp), got a remainder of {setup.batch_size % count}: "
                         f"--batch-size {count * max(1, setup.batch_size // count)} would", where="--batch-size")
    if getattr(setup, "grad_accum", 1) != 1:
        raise SetupError(f"expected --grad-accum 1 with pipeline parallelism (the schedule's micro-batches are the "
                         f"accumulation), got {setup.grad_accum}", where="--grad-accum")
    if getattr(setup, "precision", None) == Precision.FP16_MIXED:
        # GradScaler.scale(loss) runs where the loss is, the last stage; every other stage's scaler.step then
        # finds no scale ("Attempted step but _scale is None"), in the trace as in the real run
        raise SetupError("expected bf16-mixed, bf16 or fp32 with pipeline parallelism, got fp16-mixed: its "
                         "GradScaler scales the loss, which only the last stage computes (torchtitan trains "
                         "pipelines in bf16)", where="--precision")
    return count


def on_meta(model: nn.Module, ctx: ParallelContext) -> nn.Module:
    """Split the meta-built model; return this rank's stage (or its stages, for interleaved 1F1B)."""
    # imported here, before the steps are recorded: its import makes a tensor (microbatch.py sum_reducer, torch 2.13),
    # which the first pipeline trace of a process would otherwise record as an allocation of its own
    import torch.distributed.pipelining  # noqa: F401

    layout = ctx.layout
    count = _microbatches(ctx)
    num_stages = total_stages(layout)
    meta_model = copy.deepcopy(model)  # meta: no storage; kept to infer the stage boundaries' shapes
    stages = split_stages(model, num_stages)
    indices = rank_stage_indices(ctx.world.pp_rank, layout.pp, num_stages)
    mine = stages[indices[0]] if len(indices) == 1 else RankStages({i: stages[i] for i in indices})
    mine.trainmem_pipeline = PipelinePlan(indices, num_stages, meta_model, count)
    counts = [sum(p.numel() for p in {id(p): p for p in stage.parameters()}.values()) for stage in stages]
    ctx.notes.append(f"pipeline: {num_stages} stages over {layout.pp} ranks ({layout.schedule}, {count} micro-batches "
                     f"of {ctx.setup.batch_size // count}); parameters per stage {', '.join(f'{c:,}' for c in counts)}; "
                     f"this rank runs stage{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}")
    return mine


def _plan_of(model: nn.Module) -> PipelinePlan:
    inner = getattr(model, "module", model)  # a DDP wrapper keeps the stage as .module
    plan = getattr(inner, "trainmem_pipeline", None)
    if plan is None:
        raise SetupError("expected pp.on_meta to have split the model before pp.on_fake, got an unsplit model",
                         where="--pp")
    return plan


def on_fake(model: nn.Module, ctx: ParallelContext) -> Parallelized:
    """The schedule is built at the first step, once the batch's shapes are known (pp_run.py)."""
    from trainmem.parallel import pp_run

    plan = _plan_of(model)
    if len(plan.stage_indices) > 1 and getattr(model, "module", None) is not None:
        raise SetupError("expected a data-parallel kind that keeps stage modules apart (fsdp, hsdp, zero2, zero3) "
                         "with interleaved 1F1B, got a DDP wrapper around this rank's stages", where="--schedule")
    runner = pp_run.PipelineRunner(model, plan, ctx)
    loop = getattr(ctx.setup, "loop", None)
    notes = [f"pipeline: the loop is torchtitan's train_step (zero_grad, schedule.step, optimizer step; the batch "
             f"bound until the next one), not --loop {loop}" if loop is not None and str(loop) != "inline" else
             "pipeline: the loop is torchtitan's train_step (zero_grad, schedule.step, optimizer step; the batch "
             "bound until the next one)",
             "pipeline: schedule.step() with torch's default return_outputs=True, so the last stage keeps every "
             "micro-batch's output and concatenates them, as a plain call does",
             "pipeline: the P2P warm-up vote (4-byte tensors) is answered locally: every stage is built with its "
             "input/output shapes, so the vote's answer is torch's static mode"]
    return Parallelized(model, run_steps=runner.run_steps, communication_tensors=runner.communication_tensors,
                        notes=notes)


def schedule_class(schedule: Schedule) -> type:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    return {Schedule.GPIPE: ScheduleGPipe, Schedule.ONE_F_ONE_B: Schedule1F1B,
            Schedule.INTERLEAVED_1F1B: ScheduleInterleaved1F1B}[Schedule(schedule)]

