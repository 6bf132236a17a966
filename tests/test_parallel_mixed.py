"""Every parameter one tensor kind per optimizer group (parallel/tp.py replicate_rest, parallel/optimizer_groups.py):
a foreach optimizer (CUDA's default) refuses a list mixing DTensors and plain tensors, so the tensor-parallel
model's unsplit parameters are replicated DTensors (torchtitan's NoParallel) and ZeRO-3's persistent (ignored)
parameters get their own optimizer group. Checked against hand counts of local elements and Adam state."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate

from trainmem import frontends
from trainmem.parallel.apply import ParallelContext, apply_on_fake, apply_on_meta
from trainmem.parallel.optimizer_groups import by_tensor_kind
from trainmem.parallel.world import fake_world
from trainmem.setup import TrainingSetup
from trainmem.trace import step as training
from trainmem.trace.loops import run_loop
from trainmem.trace.torch_private import FakeTensorMode


def _run(ref, rank: int, setup: TrainingSetup):
    """Build on meta, apply the layout, run the steps under fake tensors: (model, prepared)."""
    source = frontends.resolve(ref, setup)
    with torch.device("meta"):
        model, make_batch, loss_fn = training.unpack_built(source.build(), source)
    with fake_world(setup.parallel, rank) as world:
        ctx = ParallelContext(setup.parallel, world, None, setup)
        model = apply_on_meta(model, ctx)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            result = apply_on_fake(model, ctx)
            # as parallel/rank_trace.py builds it: the setup's optimizer over groups by tensor kind
            grouped = lambda params, setup: training.make_optimizer(by_tensor_kind(params), setup)  # noqa: E731
            prepared = training.prepare(result.model, make_batch, loss_fn, setup, source,
                                        optimizer_factory=result.make_optimizer or grouped)
            (result.run_steps or run_loop)(prepared, setup, training.Observer())
    return model, prepared


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _state_elements(optimizer: torch.optim.Optimizer) -> int:
    return sum(_local(v).numel() for state in optimizer.state.values() for k, v in state.items() if k != "step")


def test_tp_leaves_no_plain_parameter_and_foreach_adam_runs():
    # mlp 64-256-256-10: Linear 0 column-wise, Linear 2 row-wise, the unpaired Linear 4 replicated whole as before
    setup = TrainingSetup.from_mapping({"strategy": "tp", "world_size": 2, "batch_size": 8,
                                        "optimizer_impl": "foreach"})
    model, prepared = _run("mlp:64-256-256-10", 1, setup)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert model[4].weight.placements == (Replicate(),) and model[4].weight.to_local().shape == (10, 256)
    local = (256 * 64 // 2 + 256 // 2) + (256 * 256 // 2 + 256) + (10 * 256 + 10)
    assert sum(_local(p).numel() for p in model.parameters()) == local
    assert len(prepared.optimizer.param_groups) == 1  # one kind, one mesh: nothing to separate
    assert _state_elements(prepared.optimizer) == 2 * local  # exp_avg and exp_avg_sq of every local element


def test_zero3_persistent_parameters_get_their_own_group():
    # threshold 20,000 elements: only Linear 2's weight (65,536) is sharded over dp 2; the rest stays whole
    setup = TrainingSetup.from_mapping({"strategy": "zero3", "world_size": 2, "batch_size": 8,
                                        "zero3_persistence_threshold": 20000, "optimizer_impl": "foreach"})
    _, prepared = _run("mlp:64-256-256-10", 0, setup)
    kinds = [{isinstance(p, DTensor) for p in group["params"]} for group in prepared.optimizer.param_groups]
    assert sorted(map(sorted, kinds)) == [[False], [True]]
    whole = 64 * 256 + 256 + 256 + 10 * 256 + 10
    assert _state_elements(prepared.optimizer) == 2 * (256 * 256 // 2 + whole)


def test_groups_by_kind_keep_a_single_kind_list_as_it_is():
    plain = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    assert by_tensor_kind(plain) == plain
    groups = [{"params": plain}]
    assert by_tensor_kind(groups) is not None and by_tensor_kind(groups)[0] is groups[0]


def test_qwen3_head_norms_replicated_under_sequence_parallel_tp():
    # Qwen3's plan names q_norm/k_norm "replicated_with_grad_allreduce": whole (head_dim 16) on every rank
    import pytest

    transformers = pytest.importorskip("transformers")
    from trainmem.frontends import ModelSource
    from trainmem.frontends.hf import _batch_maker, _model_loss

    def build():
        config = transformers.Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                          tie_word_embeddings=False)
        return transformers.Qwen3ForCausalLM(config)

    source = ModelSource(ref="", name="tiny qwen3", build=build, make_batch=_batch_maker("causal-lm", {"vocab_size": 128}, 16),
                         loss_fn=_model_loss)
    setup = TrainingSetup.from_mapping({"strategy": "tp", "world_size": 2, "batch_size": 2, "steps": 1,
                                        "optimizer_impl": "foreach"})
    model, _ = _run(source, 0, setup)
    norm = model.model.layers[0].self_attn.q_norm.weight
    assert norm.placements == (Replicate(),) and norm.to_local().shape == (16,)
    assert model.model.layers[0].self_attn.q_proj.weight.to_local().shape == (32, 64)
