"""A trace composed from a few repeated blocks (trace/block_reuse.py, block_compose.py) is the whole model's trace,
event for event, on every loop style, optimizer and target the composition is used with; and a model whose
blocks are not interchangeable is traced whole, with the reason in its notes."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import zoo
from trainmem.frontends import resolve
from trainmem.setup import TrainingSetup
from trainmem.targets import cpu_kernels
from trainmem.trace import block_reuse, run
from trainmem.trace.block_check import first_difference
from trainmem.trace.block_compose import NotComposable
from trainmem.trace.block_reuse import extrapolated_notes
from trainmem.trace.cache_store import switched

CASES = {
    "inline adamw": {"optimizer": "adamw"},
    "lean momentum": {"optimizer": "momentum", "loop": "lean"},
    "lean adam checkpointing": {"optimizer": "adam", "loop": "lean", "checkpointing": True},
    "inline bf16-mixed accumulation": {"optimizer": "adamw", "precision": "bf16-mixed", "grad_accum": 2},
    "lean foreach adamw": {"optimizer": "adamw", "loop": "lean", "optimizer_impl": "foreach"},
    "lean LoRA foreach": {"optimizer": "adamw", "loop": "lean", "lora": "r=4,targets=qkv", "optimizer_impl": "foreach"},
}


def _traced(model: str, values: dict, cuda: bool = False):
    setup = TrainingSetup.from_mapping({"batch_size": 2, **values}, "test")
    if cuda:
        from trainmem.targets import cuda_target
        from trainmem.trace.cuda_composites import CudaFacts

        return run.trace_training(resolve(model, setup), setup, cuda_target.kernel_ops(), CudaFacts((8, 0)))
    return run.trace_training(resolve(model, setup), setup, cpu_kernels.kernel_ops())


def _both(monkeypatch, model: str, values: dict, cuda: bool = False):
    monkeypatch.setattr(block_reuse, "MIN_BLOCKS", 5)
    with switched(False):
        composed = _traced(model, values, cuda)
        with block_reuse.whole_models():
            whole = _traced(model, values, cuda)
    return composed, whole


def _same_result(composed, whole) -> None:
    assert first_difference(composed.trace, whole.trace) is None
    assert composed.trace.loop_marks == whole.trace.loop_marks  # op counts of the lean loop's marks included
    for field in dataclasses.fields(whole):
        if field.name not in ("trace", "cache_use", "warnings"):
            assert getattr(composed, field.name) == getattr(whole, field.name), field.name
    notes = [w for w in composed.warnings if "the model traced with" not in w]
    assert notes == whole.warnings


@pytest.mark.heavy
@pytest.mark.parametrize("case", list(CASES))
def test_composed_trace_is_the_whole_trace(monkeypatch, case):
    composed, whole = _both(monkeypatch, zoo("gpt_deep"), CASES[case])
    assert any(w.startswith("6 blocks of ") and "the model traced with 3 and 4" in w for w in composed.warnings)
    _same_result(composed, whole)


@pytest.mark.heavy
@pytest.mark.parametrize("model", ["tied_lm_deep", "transformer_encoder_deep"])
@pytest.mark.parametrize("loop", ["inline", "lean"])
def test_zoo_stacks_compose(monkeypatch, model, loop):
    """The zoo's other stacks of blocks (a tied LM with a custom loss, nn.TransformerEncoder), grown to 6 blocks."""
    composed, whole = _both(monkeypatch, zoo(model), {"optimizer": "adam", "loop": loop})
    assert any("the model traced with 3 and 4" in w for w in composed.warnings)
    _same_result(composed, whole)


@pytest.mark.heavy
@pytest.mark.parametrize("loop", ["inline", "lean"])
def test_per_layer_storages_outside_the_blocks_compose(monkeypatch, loop):
    """transformers' Mistral makes one sliding-window tensor per layer before the first layer runs (its cache):
    composed as the layer's own (block_compose.py, 5.), the trace is the whole one."""
    pytest.importorskip("transformers")
    composed, whole = _both(monkeypatch, zoo("mistral_deep"), {"optimizer": "adamw", "loop": loop})
    assert any("the model traced with 3 and 4" in w for w in composed.warnings)
    _same_result(composed, whole)
    sliding = [e for e in whole.trace.events if e.op == "lift_fresh" and e.nbytes == 8 and e.action == "alloc"]
    assert len(sliding) == 2 * 6  # one per layer and step: what the composition had to repeat


@pytest.mark.heavy
@pytest.mark.parametrize("case", ["inline adamw", "lean foreach adamw"])
def test_alternating_blocks_compose_in_runs(monkeypatch, case):
    """Gemma-2's sliding and global layers alternate: composed in runs of 2 blocks (6 and 8 traced), the trace is the
    whole one; its cache's sliding-window tensors are one per run (block_compose.py, 5.)."""
    pytest.importorskip("transformers")
    composed, whole = _both(monkeypatch, zoo("gemma2_deep"), CASES[case])
    assert any(w.startswith("10 blocks of model.layers, alike every 2: the model traced with 6 and 8 of them")
               for w in composed.warnings)
    _same_result(composed, whole)


@pytest.mark.heavy
def test_a_mixture_of_experts_composes_on_the_cuda_target(monkeypatch):
    """Mixtral's router gradient is summed in backward by no module, inside its layer's run: that layer's (block_compose.py,
    5.); and its routing notes count modules in a form that grows with the blocks (trace/rules.py)."""
    pytest.importorskip("transformers")
    composed, whole = _both(monkeypatch, zoo("mixtral_deep"), {"optimizer": "adamw"}, cuda=True)
    assert any("the model traced with 3 and 4" in w for w in composed.warnings)
    _same_result(composed, whole)


def test_alternating_blocks_are_traced_whole(monkeypatch):
    composed, whole = _both(monkeypatch, zoo("einsum_attention_deep"), {"optimizer": "sgd"})
    assert any("traced whole: block 1 differs from block 0" in w for w in composed.warnings)


def test_a_recomputed_block_is_attributed_to_itself():
    """checkpoint() recomputes a block with its forward, not its call, and stops once backward has what it needs:
    the recomputed ops are the block's (trace/checkpointing.py), and no module it was in stays current after it
    (the next step's backward starts in the loss and the head, not in a block)."""
    with switched(False):
        traced = _traced(zoo("gpt_deep"), {"optimizer": "adam", "checkpointing": True})
    events = traced.trace.events
    recomputed = [e for e in events if e.phase.value == "backward" and e.op == "scaled_dot_product_attention"
                  or e.phase.value == "backward" and e.op.startswith("_scaled_dot_product_flash_attention")]
    assert recomputed and all(e.module.startswith("blocks.") for e in recomputed)
    for step in (0, 1):
        first = next(e for e in events if e.phase.value == "backward" and e.step == step and e.module)
        assert not first.module.startswith("blocks."), first


@pytest.mark.heavy
def test_composed_trace_is_the_whole_trace_on_the_cuda_target(monkeypatch):
    """CUDA semantics: foreach optimizer by default, autocast lists, the SDPA note's count (2 steps × 6 blocks) grown per block."""
    composed, whole = _both(monkeypatch, zoo("gpt_deep"), {"optimizer": "adamw", "precision": "bf16-mixed"},
                            cuda=True)
    assert any("scaled_dot_product_attention ×12" in w for w in composed.warnings)
    _same_result(composed, whole)


@pytest.mark.heavy
def test_blocks_that_behave_by_index_are_traced_whole(monkeypatch):
    """Block 3 keeps more than block 1: the 3-block trace composed to 4 differs from the 4-block trace. (A block
    that differs only from the fifth on is not seen by this check: block_reuse.py says so.)"""
    composed, whole = _both(monkeypatch, zoo("index_dependent_stack"), {"optimizer": "adam"})
    assert any("traced whole: 3 blocks composed to 4 differ from 4 traced" in w for w in composed.warnings)
    assert first_difference(composed.trace, whole.trace) is None


def test_blocks_with_differing_settings_are_traced_whole(monkeypatch):
    composed, _ = _both(monkeypatch, zoo("windowed_stack"), {"optimizer": "sgd"})
    assert any("traced whole: block 1 differs from block 0 in window = 8" in w for w in composed.warnings)


def test_too_few_blocks_trace_whole_without_a_note():
    with switched(False):
        traced = _traced(zoo("gpt_deep"), {"optimizer": "sgd"})
    assert not any("blocks of" in w for w in traced.warnings)


def test_notes_that_count_per_block_are_extrapolated():
    assert extrapolated_notes(["attention ×3 (cc 8.0)", "kept"], ["attention ×4 (cc 8.0)", "kept"], 76) == \
        ["attention ×80 (cc 8.0)", "kept"]
    assert extrapolated_notes(["1,000 objects"], ["1,500 objects"], 2) == ["2,500 objects"]
    assert extrapolated_notes(["on 3 units (b.0, b.1, b.2)"], ["on 4 units (b.0, b.1, b.2, …)"], 2) == \
        ["on 6 units (b.0, b.1, b.2, …)"]
    with pytest.raises(NotComposable):
        extrapolated_notes(["3 units"], ["4 units of 2"], 1)


def _estimate_without_block_notes(values: dict) -> dict:
    import trainmem

    data = trainmem.estimate(zoo("gpt_deep"), device="a100-80gb", cache=False, batch_size=2, optimizer="adamw",
                             precision="bf16-mixed", **values).to_dict()
    notes = [w for w in data["warnings"] if "blocks of blocks" in w]
    data["warnings"] = [w for w in data["warnings"] if w not in notes]
    return {"estimate": data, "notes": notes}


# the deep GPT's blocks (50 k elements) as ZeRO-3 units of their own, each prefetching only the next
ZERO3_BLOCK_UNITS = {"zero3_persistence_threshold": 1000, "zero3_prefetch_bucket": 1000}


@pytest.mark.heavy
@pytest.mark.parametrize("layout", [{"strategy": "fsdp", "dp": 2}, {"strategy": "zero2", "dp": 2},
                                    {"strategy": "fsdp", "dp": 2, "tp": 2},
                                    {"strategy": "fsdp", "dp": 2, "tp": 2, "offload": "params"},
                                    {"strategy": "zero2", "dp": 2, "tp": 2, "checkpointing": True},
                                    {"strategy": "zero3", "dp": 2, **ZERO3_BLOCK_UNITS},
                                    {"strategy": "fsdp1", "dp": 2},
                                    {"strategy": "fsdp1", "dp": 2, "fsdp1_sharding": "shard-grad-op",
                                     "checkpointing": True},
                                    {"strategy": "hsdp", "world_size": 4, "dp_shard": 2},
                                    {"strategy": "tp", "tp": 2, "checkpointing": True}],
                         ids=["fsdp", "zero2", "fsdp-tp2", "fsdp-tp2-offload", "zero2-tp2-ckpt", "zero3", "fsdp1",
                              "fsdp1-grad-op-ckpt", "hsdp", "tp-ckpt"])
def test_fsdp_ranks_compose(monkeypatch, layout):
    """A rank of FSDP2 (and ZeRO-2, FSDP2 without resharding; HSDP), alone or with tensor parallelism, of tensor
    parallelism alone, of ZeRO-3 whose blocks prefetch alone and of FSDP1, composed from 3 and 4 blocks, gives the
    estimate the rank traced whole gives."""
    monkeypatch.setattr(block_reuse, "MIN_BLOCKS", 5)
    composed = _estimate_without_block_notes(layout)
    with block_reuse.whole_models():
        whole = _estimate_without_block_notes(layout)
    assert any("the model traced with 3 and 4" in note for note in composed["notes"])
    assert composed["estimate"] == whole["estimate"]


def test_zero3_composes_only_where_the_blocks_prefetch_alone():
    """ZeRO-3 with DeepSpeed's defaults on the deep GPT: its 50 k-element blocks fall below the persistence threshold
    (100 k) and join the root's unit, which grows with the blocks; with ZERO3_BLOCK_UNITS they are units that each
    prefetch the next alone (parallel/zero.py blocks_prefetch_alone)."""
    from trainmem.parallel.rank_trace import build_on_meta, composable
    from trainmem.setup.layout import ParallelLayout, Strategy

    for values, expected in (({}, False), (ZERO3_BLOCK_UNITS, True), ({"zero3_persistence_threshold": 1000}, False)):
        setup = TrainingSetup(batch_size=2, precision="bf16-mixed",
                              parallel=ParallelLayout(strategy=Strategy.ZERO3, world_size=2, **values).resolve())
        model = build_on_meta(resolve(zoo("gpt_deep"), setup), setup)[0]
        assert composable(setup.parallel, model, setup) is expected, values


def test_bucketed_strategies_are_not_composed(monkeypatch):
    """DDP's gradient buckets partition all the parameters by size: its ranks are traced whole, without trying."""
    from trainmem.parallel.rank_trace import composable
    from trainmem.setup.layout import ParallelLayout, Strategy

    assert not composable(ParallelLayout(strategy=Strategy.DDP, world_size=2).resolve())
    assert composable(ParallelLayout(strategy=Strategy.FSDP, world_size=2).resolve())
    assert composable(ParallelLayout(strategy=Strategy.FSDP, world_size=4, tp=2).resolve())
    assert not composable(ParallelLayout(strategy=Strategy.FSDP, world_size=4, pp=2).resolve())
