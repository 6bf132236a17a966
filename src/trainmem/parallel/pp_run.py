"""Running the pipeline schedule for one rank inside the fake trace: PipelineStage objects with their
boundary shapes, the real schedule, and the loop that announces phases to the observer.

Phases: the recorder calls a forward output an activation if it is still alive when backward starts
(trace/run.py settles that when BACKWARD is announced, over the events since the last FORWARD). A schedule
interleaves chunks, so each chunk is announced: FORWARD before a forward chunk, LOSS around the last stage's
loss, and BACKWARD right after each chunk's forward (and loss) ends, which settles that chunk's outputs
(alive now: saved for its backward or held by the schedule; dead: temporaries), and before each backward chunk.
Between a chunk's end and the next announcement the schedule only posts sends/receives into buffers it
allocated at its first step.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from trainmem.errors import SetupError
from trainmem.setup import Precision
from trainmem.parallel.apply import ParallelContext
from trainmem.trace import step as training
from trainmem.trace.cuda_composites import attention_uncounted
from trainmem.trace.events import Phase
from trainmem.trace.torch_private import FakeTensorMode, disable_current_modes, pipeline_chunks_in_flight


class _Vote:
    """The answer of torch's P2P warm-up vote (PipelineStage._warmup_forward_vote / _warmup_backward_result,
    torch/distributed/pipelining/stage.py) when every stage was given its input and output shapes: 1, static
    metadata. Under the fake process group the vote's receive delivers no data and `.item()` has no value."""

    def item(self) -> int:
        return 1


def _fake_world_stage_class():
    from torch.distributed.pipelining import PipelineStage

    class FakeWorldStage(PipelineStage):
        def _warmup_forward_vote(self, has_backward, received_acc=None):  # noqa: ARG002
            return _Vote()

        def _warmup_backward_result(self, received_result=None):  # noqa: ARG002
            return _Vote()

    return FakeWorldStage


def _meta_like(shape: torch.Size, dtype: torch.dtype, rows: int, grad: bool) -> torch.Tensor:
    meta = torch.empty((rows, *shape[1:]), dtype=dtype, device="meta")
    return meta.requires_grad_(grad and meta.is_floating_point())


class PipelineRunner:
    def __init__(self, model: nn.Module, plan: Any, ctx: ParallelContext) -> None:
        self.model, self.plan, self.ctx = model, plan, ctx
        self.schedule = None
        self.stages: list[Any] = []
        self.step_index = 0
        self.most_in_flight: dict[int, int] = {}  # stage index -> most micro-batches held at once

    # ---- stage boundaries -------------------------------------------------------------------------------
    def _boundaries(self, first_inputs: tuple[torch.Tensor, ...], prepared: Any, setup: Any) -> list[tuple]:
        """(inputs, outputs) meta tensors of one micro-batch for every stage, from a copy of the meta model run
        stage by stage outside the trace's fake mode and the recorder. The copy runs on CPU fake tensors of its
        own fake mode, not on meta: autocast casts only tensors of its device (a meta tensor never), and under
        mixed precision a stage's output has the dtype autocast gives it (bf16 out of a Linear). torch checks
        each output against its declared dtype up to 2.11 (PipeliningShapeError) and sizes the receive
        buffers by it in every release."""
        from trainmem.parallel.pp_split import split_stages

        rows = setup.batch_size // self.plan.microbatches
        dtype = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)
        # FSDP2's MixedPrecisionPolicy computes in its param_dtype, the floating inputs cast to it too
        # (cast_forward_inputs), without autocast (parallel/rank_trace.py _fsdp_casts)
        policy = None if prepared.autocast else {Precision.BF16_MIXED: torch.bfloat16}.get(setup.precision)
        dtype = policy or dtype
        metas = []  # (inputs, outputs) as (shape, dtype) pairs: the fake tensors stay inside their mode
        with disable_current_modes():
            model = copy.deepcopy(self.plan.meta_model)  # meta: no storage to copy
            model = model.to(dtype) if dtype != torch.float32 else model  # on meta: fake tensors would be swapped
            with FakeTensorMode(allow_non_fake_inputs=True):  # the model's small real buffers (meta_build.py)
                model = model.to_empty(device="cpu")
                stages = split_stages(model, self.plan.num_stages)
                inputs = tuple(torch.empty((rows, *t.shape[1:]), dtype=t.dtype) for t in first_inputs)
                declared = [(t.shape, t.dtype) for t in inputs]  # what the schedule is given, before any cast
                if policy is not None:
                    inputs = tuple(t.to(policy) if t.is_floating_point() else t for t in inputs)
                with torch.no_grad(), training.autocast_region(prepared, setup), attention_uncounted():
                    for stage in stages[:max(self.plan.stage_indices) + 1]:  # later stages' are not needed
                        out = stage(*inputs)
                        outputs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
                        metas.append((declared, [(o.shape, o.dtype) for o in outputs]))
                        inputs, declared = outputs, [(o.shape, o.dtype) for o in outputs]
            # made outside the trace's fake mode too; a later stage's inputs are the earlier stage's outputs,
            # which require grad (its backward sends them)
            return [(tuple(_meta_like(shape, kind, rows, grad=index > 0) for shape, kind in ins),
                     tuple(_meta_like(shape, kind, rows, grad=True) for shape, kind in outs))
                    for index, (ins, outs) in enumerate(metas)]

    def _stage_modules(self) -> list[nn.Module]:
        inner = getattr(self.model, "module", self.model)
        if len(self.plan.stage_indices) == 1:
            return [self.model]
        return [inner.stages[str(index)] for index in self.plan.stage_indices]

    def _build(self, first_inputs: tuple, prepared: Any, setup: Any, observer: Any) -> None:
        from trainmem.parallel.pp import schedule_class

        shapes = self._boundaries(first_inputs, prepared, setup)
        stage_class = _fake_world_stage_class()
        group = self.ctx.world.pp_group()
        for index, module in zip(self.plan.stage_indices, self._stage_modules()):
            inputs, outputs = shapes[index]
            stage = stage_class(module, index, self.plan.num_stages, torch.device("cpu"), input_args=inputs,
                                output_args=outputs, group=group)
            self._announce(stage, prepared, setup, observer)
            self.stages.append(stage)
        cls = schedule_class(self.ctx.layout.schedule)
        first = self.stages if len(self.stages) > 1 else self.stages[0]
        try:
            self.schedule = cls(first, n_microbatches=self.plan.microbatches,
                                loss_fn=self._loss_fn(prepared, setup, observer))
        except (ValueError, AssertionError) as error:  # the schedule's own checks (micro-batches vs stages)
            raise SetupError(f"expected a pipeline layout {cls.__name__} accepts, got: {error}", where="--microbatches") from None

    def communication_tensors(self) -> list[torch.Tensor]:
        """The receive buffers the stages allocated at their first step: one per input (activations from the
        previous stage) and per output (gradients from the next) for every micro-batch, kept for the run."""
        buffers = []
        for stage in self.stages:
            for table in (stage.args_recv_info, stage.grad_recv_info):
                buffers += [info.buffer for infos in table.values() for info in infos
                            if isinstance(getattr(info, "buffer", None), torch.Tensor)]
        return buffers

    # ---- what the schedule calls -------------------------------------------------------------------------
    def _loss_fn(self, prepared: Any, setup: Any, observer: Any):
        last = self._stage_modules()[-1] if self.stages[-1].is_last else None
        own = getattr(getattr(last, "module", last), "pipeline_loss", None)

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            observer.phase(Phase.LOSS, self.step_index)
            with training.autocast_region(prepared, setup):
                if own is not None:
                    loss = own(output, target)
                else:  # the built-in loss makes its own class ids when the batch carries no target
                    loss = prepared.loss_fn(output, (), *((target,) if prepared.make_target is not None else ()))
            if prepared.scaler is not None:  # fp16-mixed: backward runs on the scaled loss, as scaler.scale(loss)
                loss = prepared.scaler.scale(loss)
            observer.phase(Phase.BACKWARD, self.step_index)  # settles this chunk's forward (module docstring)
            return loss

        return loss_fn

    def _announce(self, stage: Any, prepared: Any, setup: Any, observer: Any) -> None:
        """Wrap this stage object's chunk methods (its own instance attributes) to announce phases."""
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

        def forward_one_chunk(*args: Any, **kwargs: Any) -> Any:
            observer.phase(Phase.FORWARD, self.step_index)
            with training.autocast_region(prepared, setup):
                output = forward(*args, **kwargs)
            # micro-batches whose forward ran and backward has not: the stage's forward cache holds their
            # stage outputs and inputs (and, through autograd, their saved activations)
            self.most_in_flight[stage.stage_index] = max(self.most_in_flight.get(stage.stage_index, 0),
                                                         pipeline_chunks_in_flight(stage))
            if not stage.is_last:
                observer.phase(Phase.BACKWARD, self.step_index)  # settles this chunk's forward
            return output

        def backward_one_chunk(*args: Any, **kwargs: Any) -> Any:
            observer.phase(Phase.BACKWARD, self.step_index)
            return backward(*args, **kwargs)

        stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk

    # ---- the loop -----------------------------------------------------------------------------------------
    @staticmethod
    def _split_batch(batch: dict[str, Any]) -> tuple[tuple, torch.Tensor | None]:
        """(first stage's inputs, the last stage's target) from what the loader yields."""
        inputs = batch["inputs"]
        if isinstance(inputs, dict):
            if "input_ids" not in inputs or "labels" not in inputs:
                raise SetupError(f"expected input_ids and labels in the batch of a pipelined causal LM, got "
                                 f"{', '.join(inputs)}", where="--pp")
            return (inputs["input_ids"],), inputs["labels"]
        return tuple(inputs), batch["target"][0] if batch["target"] else None

    def run_steps(self, prepared: Any, setup: Any, observer: Any) -> None:
        held: dict[str, Any] = {}
        for step in range(setup.steps):
            self.step_index = step
            observer.phase(Phase.INPUTS, step)
            held["batch"] = training.make_micro_batch(prepared, setup)  # every pp rank loads it (torchtitan)
            args, target = self._split_batch(held["batch"])
            if self.schedule is None:
                self._build(args, prepared, setup, observer)
            observer.phase(Phase.ZERO_GRAD, step)
            training.zero_grad(prepared, setup)
            self._schedule_step(args, target, setup)
            observer.after_backward(prepared.model)
            observer.phase(Phase.OPTIMIZER, step)
            training.optimizer_step(prepared, setup)
            observer.after_optimizer(prepared.optimizer, prepared.scaler)

    def _schedule_step(self, args: tuple, target: torch.Tensor | None, setup: Any) -> None:
        first = self.stages[0].is_first
        last = self.stages[-1].is_last
        if last and target is None:  # the built-in loss needs no target; the schedule still splits one
            target = torch.empty((setup.batch_size, 0))
        losses: list[torch.Tensor] = []
        if first and last:
            self.schedule.step(*args, target=target, losses=losses)
        elif first:
            self.schedule.step(*args)
        elif last:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
