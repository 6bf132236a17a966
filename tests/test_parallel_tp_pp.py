"""Tensor and pipeline parallelism (parallel/tp.py, pp.py): each rank traced alone under the fake process group,
checked against hand-computed parameter splits and the schedules' documented in-flight micro-batches."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn

from trainmem import frontends
from trainmem.errors import SetupError
from trainmem.frontends import ModelSource
from trainmem.parallel.apply import ParallelContext, apply_on_fake, apply_on_meta
from trainmem.setup.layout import ParallelLayout
from trainmem.parallel.pp import stage_parameter_counts
from trainmem.parallel.world import fake_world
from trainmem.setup import TrainingSetup
from trainmem.trace import step as training
from trainmem.trace.loops import run_loop
from trainmem.trace.torch_private import FakeTensorMode, TorchDispatchMode, tree_leaves


class _LiveBytes(TorchDispatchMode):
    """Bytes of live storages made by ops (a weak reference per storage), and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: dict[int, int] = {}
        self.now = self.peak = 0
        self.refs: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and id(tensor.untyped_storage()) not in self.sizes:
                storage = tensor.untyped_storage()
                key = id(storage)
                self.sizes[key] = storage.nbytes()
                self.now += storage.nbytes()
                self.peak = max(self.peak, self.now)
                self.refs.append(weakref.ref(storage, lambda _, key=key: self._died(key)))
        return out

    def _died(self, key: int) -> None:
        self.now -= self.sizes.pop(key, 0)


def _run(source, rank: int, setup: TrainingSetup):
    """Build on meta, apply the layout, materialize under fake tensors, run the steps: (model, result, live)."""
    from trainmem.trace.meta_build import building_on_meta

    source = frontends.resolve(source, setup)
    # as the trace builds: torch 2.6-2.8 fail a first import of torch._dynamo under the meta device (meta_build.py)
    with building_on_meta():
        model, make_batch, loss_fn = training.unpack_built(source.build(), source)
    with fake_world(setup.parallel, rank) as world:
        ctx = ParallelContext(setup.parallel, world, None, setup)
        model = apply_on_meta(model, ctx)
        live = _LiveBytes()
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            with live:
                result = apply_on_fake(model, ctx)
                prepared = training.prepare(result.model, make_batch, loss_fn, setup, source)
                (result.run_steps or run_loop)(prepared, setup, training.Observer())
    return model, result, live


def _local_numel(model: nn.Module) -> int:
    unique = {id(p): p for p in model.parameters()}.values()
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in unique)


def _tiny_llama(tie: bool, heads: int = 4, kv_heads: int = 2, hidden: int = 64, own_plan: bool = True) -> ModelSource:
    transformers = pytest.importorskip("transformers")
    from trainmem.frontends.hf import _batch_maker, _model_loss

    def build():
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=128,
                                          num_hidden_layers=4, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                          tie_word_embeddings=tie)
        model = transformers.LlamaForCausalLM(config)
        if not own_plan:  # a Llama-family model without a Hugging Face plan: the projection names decide
            model._tp_plan = {}
        return model
    return ModelSource(ref="", name="tiny llama", build=build, make_batch=_batch_maker("causal-lm", {"vocab_size": 128}, 16),
                       loss_fn=_model_loss)


# ---- tensor parallelism -------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [0, 1])
def test_tp_mlp_pair_halves_the_weights(rank):
    # Linear(64,128) column-wise: weight rows and bias halved; Linear(128,10) row-wise: weight columns halved,
    # bias replicated (torch RowwiseParallel keeps the bias whole and adds it after the all-reduce)
    setup = TrainingSetup.from_mapping({"strategy": "tp", "world_size": 2, "batch_size": 8})
    model, _, _ = _run("mlp:64-128-10", rank, setup)
    assert _local_numel(model) == (128 * 64 // 2 + 128 // 2) + (10 * 128 // 2 + 10)
    assert model[0].weight.to_local().shape == (64, 64) and model[2].weight.to_local().shape == (10, 64)
    assert model[2].bias.to_local().shape == (10,)


def test_tp_llama_uses_its_own_plan():
    # per layer, halved: q 64x64, k and v 32x64 (2 kv heads of 16), o 64x64, gate/up/down 128x64; norms whole
    layer = (4096 + 2048 + 2048 + 4096 + 3 * 8192) // 2 + 2 * 64
    vocab = 128 * 64 // 2  # embed_tokens (embedding_rowwise) and lm_head (colwise_gather_output) each halved
    setup = TrainingSetup.from_mapping({"strategy": "tp", "world_size": 2, "batch_size": 2})
    untied, _, _ = _run(_tiny_llama(tie=False), 0, setup)
    assert _local_numel(untied) == 4 * layer + 64 + 2 * vocab
    tied, _, _ = _run(_tiny_llama(tie=True), 1, setup)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight  # still one Parameter after parallelize_module
    assert _local_numel(tied) == 4 * layer + 64 + vocab


@pytest.mark.parametrize("tie", [False, True])
def test_tp_llama_names_split_the_vocabulary_like_torchtitan(tie):
    # without the model's own plan: the projections by name, and embed_tokens row-wise / lm_head column-wise
    # added (torchtitan's tok_embeddings / output); the same hand counts as the Hugging Face plan's
    from torch.distributed.tensor import DTensor, Shard

    layer = (4096 + 2048 + 2048 + 4096 + 3 * 8192) // 2 + 2 * 64
    vocab = 128 * 64 // 2
    setup = TrainingSetup.from_mapping({"strategy": "tp", "world_size": 2, "batch_size": 2,
                                        "optimizer_impl": "foreach"})
    model, _, _ = _run(_tiny_llama(tie=tie, own_plan=False), 1, setup)
    assert model.model.embed_tokens.weight.placements == (Shard(0),) == model.lm_head.weight.placements
    assert all(isinstance(p, DTensor) for p in model.parameters())  # norms replicated: foreach Adam ran
    if tie:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    assert _local_numel(model) == 4 * layer + 64 + (1 if tie else 2) * vocab


def test_tp_embedding_backward_makes_the_full_vocabulary_gradient():
    # torch's DTensor strategy for embedding_dense_backward (torch/distributed/tensor/_ops/_embedding_ops.py,
    # embedding_dense_backward_strategy) has no vocabulary-sharded weight gradient: with replicated token ids
    # and gradient it computes the whole (vocab, hidden) gradient, then keeps this rank's rows. A real TP run
    # holds that transient too; the trace shows it rather than the shard
    class Shapes(TorchDispatchMode):
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.embedding_dense_backward.default:
                self.seen.append(tuple(out.shape))
            return out

    setup = TrainingSetup.from_mapping({"strategy": "tp", "world_size": 2, "batch_size": 2, "steps": 1})
    source = frontends.resolve(_tiny_llama(tie=False), setup)
    with torch.device("meta"):
        model, make_batch, loss_fn = training.unpack_built(source.build(), source)
    with fake_world(setup.parallel, 0) as world:
        ctx = ParallelContext(setup.parallel, world, None, setup)
        model = apply_on_meta(model, ctx)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            prepared = training.prepare(apply_on_fake(model, ctx).model, make_batch, loss_fn, setup, source)
            with Shapes() as shapes:
                run_loop(prepared, setup, training.Observer())
    assert model.model.embed_tokens.weight.to_local().shape == (64, 64)
    assert shapes.seen == [(128, 64)] * setup.steps


def test_tp_llama_sequence_parallel_shards_the_residual_stream():
    # torchtitan's default with TP: between the blocks each rank holds its half of the sequence (batch 2, seq
    # 16, hidden 64 -> local (2, 8, 64)); the norms' weights are replicated; the logits are gathered whole
    from torch.distributed.tensor import DTensor, Shard

    from trainmem.parallel.roles import RankRole
    from trainmem.parallel.rank_trace import trace_rank

    seen = {}

    def keep(key, value) -> None:  # a forward hook returning a value would replace the output
        seen.setdefault(key, value)

    def build():
        model = _tiny_llama(tie=False).build()
        model.model.layers[1].register_forward_hook(lambda m, i, out: keep("layer", out))
        model.register_forward_hook(lambda m, i, out: keep("logits", out.logits))
        return model

    setup = TrainingSetup.from_mapping({"strategy": "tp", "world_size": 2, "batch_size": 2, "steps": 1,
                                        "checkpointing": True, "optimizer_impl": "foreach"})
    source = frontends.resolve(_tiny_llama(tie=False), setup)
    source = ModelSource(ref="", name="tiny llama", build=build, make_batch=source.make_batch, loss_fn=source.loss_fn)
    traced = trace_rank(source, setup, RankRole(0, (0, 1), "all ranks"))
    assert any("sequence parallelism" in note for note in traced.parallel_notes)
    hidden = seen["layer"][0] if isinstance(seen["layer"], tuple) else seen["layer"]
    assert isinstance(hidden, DTensor) and hidden.placements == (Shard(1),)
    assert hidden.to_local().shape == (2, 8, 64) and hidden.shape == (2, 16, 64)
    assert not isinstance(seen["logits"], DTensor) and seen["logits"].shape == (2, 16, 128)


def test_tp_refuses_uneven_splits_and_models_without_a_plan():
    setup = TrainingSetup.from_mapping({"strategy": "tp", "world_size": 2, "batch_size": 8})
    with pytest.raises(SetupError, match=r"0's output features \(out_features=127\) to divide by --tp 2"):
        _run("mlp:64-127-10", 0, setup)
    with pytest.raises(SetupError, match="num_attention_heads \\(6\\) to divide by --tp 4"):
        _run(_tiny_llama(tie=False, heads=6, kv_heads=2, hidden=96), 0,
             TrainingSetup.from_mapping({"strategy": "tp", "world_size": 4, "batch_size": 2}))
    from trainmem.parallel.tp import choose_plan

    with torch.device("meta"), pytest.raises(SetupError, match="expected a model with a tensor-parallel plan"):
        choose_plan(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()))


# ---- pipeline parallelism -----------------------------------------------------------------------------------
def test_stage_parameter_counts_by_parameter_balance():
    with torch.device("meta"):
        model = frontends.resolve("mlp:64-64-64-64-10", TrainingSetup()).build()
    linear, head = 64 * 64 + 64, 10 * 64 + 10
    assert stage_parameter_counts(model, ParallelLayout(strategy="pp", pp=2, world_size=2)) == [2 * linear, linear + head]
    assert stage_parameter_counts(model, ParallelLayout(strategy="pp", pp=4, world_size=4)) == [linear] * 3 + [head]
    with pytest.raises(SetupError, match="at least 8 layers"):
        stage_parameter_counts(model, ParallelLayout(strategy="pp", pp=8, world_size=8))


def test_pp_refuses_models_it_cannot_split():
    from trainmem.parallel.pp_split import split_stages

    with pytest.raises(SetupError, match="expected an nn.Sequential or a Llama-family"):
        split_stages(nn.Transformer(d_model=8, nhead=2, batch_first=True, device="meta"), 2)


def test_schedules_keep_their_micro_batches_in_flight():
    # torch's GPipe runs every forward before any backward; 1F1B lets stage i run pp - i forwards ahead
    per_micro = 2 * 1024 * 64 * 4  # stage 0 (Linear, ReLU, Linear, ReLU) keeps both ReLU outputs of 1,024 rows x 64 fp32 per micro-batch
    held = {"gpipe": {0: 4, 1: 4}, "1f1b": {0: 2, 1: 1}}
    stage0_peak = {}
    for schedule in held:
        for rank in (0, 1):
            setup = TrainingSetup.from_mapping({"strategy": "pp", "world_size": 2, "batch_size": 4096,
                                                "schedule": schedule, "microbatches": 4})
            model, result, live = _run("mlp:64-64-64-64-10", rank, setup)
            assert result.run_steps.__self__.most_in_flight == {rank: held[schedule][rank]}
            assert _local_numel(model) == [2 * 4160, 4160 + 650][rank]
            if rank == 0:
                stage0_peak[schedule] = live.peak
    # GPipe's stage 0 holds two micro-batches more than 1F1B's at its peak
    assert stage0_peak["gpipe"] - stage0_peak["1f1b"] == pytest.approx(2 * per_micro, rel=0.05)


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_llama_pipeline_runs_on_first_middle_and_last_stage(rank):
    setup = TrainingSetup.from_mapping({"strategy": "pp", "world_size": 4, "batch_size": 4, "schedule": "1f1b"})
    model, result, _ = _run(_tiny_llama(tie=True), rank, setup)
    layer = 4096 + 2048 + 2048 + 4096 + 3 * 8192 + 2 * 64
    expected = [128 * 64 + layer, layer, layer, layer + 64 + 128 * 64][rank]  # one decoder layer per stage
    assert _local_numel(model) == expected
    assert result.run_steps.__self__.most_in_flight == {rank: 4 - rank}


def test_interleaved_and_tp_with_pp():
    setup = TrainingSetup.from_mapping({"strategy": "pp", "world_size": 2, "batch_size": 8, "microbatches": 4,
                                        "schedule": "interleaved-1f1b"})
    model, result, _ = _run("mlp:64-64-64-64-64-64-64-64-64-10", 1, setup)
    assert sorted(result.run_steps.__self__.most_in_flight) == [1, 3]  # stages s with s % pp == rank
    setup = TrainingSetup.from_mapping({"tp": 2, "pp": 2, "world_size": 4, "batch_size": 4})
    model, _, _ = _run(_tiny_llama(tie=False), 3, setup)  # last stage, tp index 1: both halves of the plan
    layer = (4096 + 2048 + 2048 + 4096 + 3 * 8192) // 2 + 2 * 64
    assert _local_numel(model) == 2 * layer + 64 + 128 * 64 // 2


def test_pp_refuses_uneven_micro_batches():
    setup = TrainingSetup.from_mapping({"strategy": "pp", "world_size": 2, "batch_size": 7})
    with pytest.raises(SetupError, match=r"--batch-size \(7\) to divide into --microbatches 2"):
        _run("mlp:64-64-64-64-10", 0, setup)


def _receive_buffers_kept() -> bool:
    """Up to torch 2.14 a stage keeps one receive buffer per micro-batch for the whole run; torch 2.15 hands each
    to the stage's computation when it arrives (pipelining/_recv_buffers.py _RecvInfo.take_buffer), where it is
    the micro-batch's input like any other, and keeps none."""
    try:
        from torch.distributed.pipelining._recv_buffers import _RecvInfo
    except ImportError:
        return True
    return not hasattr(_RecvInfo, "take_buffer")


KEPT_BUFFERS = pytest.mark.skipif(not _receive_buffers_kept(), reason=f"torch {torch.__version__} keeps no receive "
                                  "buffer: each is handed to the stage (_RecvInfo.take_buffer)")


@KEPT_BUFFERS
def test_receive_buffers_are_communication_tensors():
    # the last of 2 stages receives one activation buffer per micro-batch (4 of 1,024 x 64 fp32) and no gradients;
    # the first receives one gradient buffer per micro-batch of its output's shape
    for rank in (0, 1):
        setup = TrainingSetup.from_mapping({"strategy": "pp", "world_size": 2, "batch_size": 4096, "microbatches": 4})
        _, result, _ = _run("mlp:64-64-64-64-10", rank, setup)
        buffers = result.communication_tensors()
        assert [tuple(b.shape) for b in buffers] == [(1024, 64)] * 4


def test_recorder_settles_each_chunk_of_an_interleaving_schedule():
    # 1F1B runs two forwards on stage 0 before its first backward; each chunk is settled on its own, so the
    # Linear outputs (dead once ReLU ran) are temporaries and the ReLU outputs (saved, or the stage's output
    # held by the schedule) activations: 4 micro-batches x 256 KiB of each, per step
    from trainmem.trace.events import Category, Phase
    from trainmem.trace.modules import ModuleTracker
    from trainmem.trace.recorder import TraceRecorder
    from trainmem.trace.run import RecordingObserver

    setup = TrainingSetup.from_mapping({"strategy": "pp", "world_size": 2, "batch_size": 4096, "microbatches": 4})
    source = frontends.resolve("mlp:64-64-64-64-10", setup)
    with torch.device("meta"):
        model, make_batch, loss_fn = training.unpack_built(source.build(), source)
    with fake_world(setup.parallel, 0) as world:
        ctx = ParallelContext(setup.parallel, world, None, setup)
        model = apply_on_meta(model, ctx)
        tracker = ModuleTracker(model)
        recorder = TraceRecorder(tracker)
        with FakeTensorMode(allow_non_fake_inputs=True), tracker, recorder:
            model.to_empty(device="cpu")
            result = apply_on_fake(model, ctx)
            prepared = training.prepare(result.model, make_batch, loss_fn, setup, source)
            result.run_steps(prepared, setup, RecordingObserver(recorder, model))
        recorder.closed = True
    forward = {}
    for record in recorder.trace.storages.values():
        if record.step == 1 and record.phase == Phase.FORWARD:
            key = (record.op, record.category)
            forward[key] = forward.get(key, 0) + record.nbytes
    quarter_mib = 1024 * 64 * 4
    assert forward == {("addmm", Category.TEMPORARIES): 2 * 4 * quarter_mib,
                       ("relu", Category.ACTIVATIONS): 2 * 4 * quarter_mib}


# ---- end to end through trainmem.estimate ---------------------------------------------------------------------
def test_estimate_tp_and_pp_per_rank_parameters_and_buffers():
    import trainmem

    # mlp:64-128-128-10 = Linear(64,128) 8,320, Linear(128,128) 16,512, Linear(128,10) 1,290 parameters
    tp = trainmem.estimate("mlp:64-128-128-10", strategy="tp", world_size=2, batch_size=8).to_dict()
    # the first pair is split (4,160 + 128x64 + 128 bias replicated); the unpaired last Linear stays whole
    assert tp["breakdown"]["parameters"] == 4 * (4160 + 128 * 64 + 128 + 1290)
    assert [r["ranks"] for r in tp["ranks"]] == [[0, 1]]
    pp = trainmem.estimate("mlp:64-128-128-10", strategy="pp", world_size=2, batch_size=8).to_dict()
    stages = {tuple(r["ranks"]): r["breakdown"] for r in pp["ranks"]}
    assert stages[(0,)]["parameters"] == 4 * 8320 and stages[(1,)]["parameters"] == 4 * (16512 + 1290)
    # one receive buffer per micro-batch (2 of 4 rows x 128 fp32): gradients into stage 0, activations into 1
    if _receive_buffers_kept():
        assert stages[(0,)]["communication"] == stages[(1,)]["communication"] == 2 * 4 * 128 * 4


def test_llama_stage_keeps_layer_names_and_checkpoint_blocks():
    from trainmem.parallel.pp_split import split_stages
    from trainmem.trace.checkpointing import find_blocks

    with torch.device("meta"):
        model = _tiny_llama(tie=False).build()
    last = split_stages(model, 2)[1]
    assert [name for name, _ in last.named_children()] == ["model", "lm_head"]
    assert sorted(n for n, _ in last.model.layers.named_children()) == ["2", "3"]  # the model's own layer numbers
    assert [block for _, block in find_blocks(last)] == [model.model.layers[2], model.model.layers[3]]


@KEPT_BUFFERS
def test_pp_receive_buffers_take_the_dtype_autocast_gives_the_stage_outputs():
    """Under bf16-mixed a stage's output leaves its last Linear (and ReLU) in bf16: the boundaries are worked out
    on CPU fake tensors, which autocast casts (meta tensors it never does), so the receive buffers are bf16 too
    (torch 2.8-2.11 also check each output against the declared dtype: PipeliningShapeError)."""
    import trainmem

    stages = {}
    for precision in ("fp32", "bf16-mixed"):
        pp = trainmem.estimate("mlp:64-128-128-10", strategy="pp", world_size=2, batch_size=8, precision=precision,
                               device="a100-40gb").to_dict()
        stages[precision] = {tuple(r["ranks"]): r["breakdown"]["communication"] for r in pp["ranks"]}
    assert stages["fp32"] == {(0,): 2 * 4 * 128 * 4, (1,): 2 * 4 * 128 * 4}
    assert stages["bf16-mixed"] == {(0,): 2 * 4 * 128 * 2, (1,): 2 * 4 * 128 * 2}


def test_dtype_checks_stay_quiet_while_dtensor_works_out_global_shapes():
    """DTensor's global-shape propagation runs on fake tensors with its specs' dtypes, which can lag the local
    tensors' (FSDP2 over tensor-parallel weights under autocast, torch 2.8-2.12): the check is quiet while the
    recorder is muted for it, and checks every other op."""
    from trainmem.trace.dtype_checks import SameDtypeKernels

    quiet = {"now": False}
    with FakeTensorMode(), SameDtypeKernels(quiet=lambda: quiet["now"]):
        low, high = torch.empty(2, 3, dtype=torch.bfloat16), torch.empty(3, 4)
        with pytest.raises(RuntimeError, match="mm expects its tensors to have the same dtype, got bfloat16, float32"):
            torch.mm(low, high)
        quiet["now"] = True
        assert torch.mm(low, high).shape == (2, 4)


@pytest.mark.heavy
def test_fsdp_over_the_pipeline_stages_of_a_causal_lm_wraps_what_each_stage_calls():
    """A stage of 1 decoder layer has no repeated block, and its top-level child `model` is a holder whose forward
    never runs: FSDP's units are the decoder layers (auto, blocks) or what the stage calls (children), so every
    parameter is all-gathered by a hook that runs (the embedding stayed sharded: 'mixed torch.Tensor and DTensor')."""
    import trainmem
    from trainmem.parallel.fsdp import wrap_units
    from trainmem.parallel.pp_split import split_stages

    from trainmem.trace.meta_build import building_on_meta

    source = frontends.resolve(_tiny_llama(tie=False), TrainingSetup())
    with building_on_meta():
        first, last = split_stages(source.build(), 4)[0], split_stages(source.build(), 4)[3]
    assert wrap_units(first, "auto") == wrap_units(first, "blocks") == list(first.model.layers)
    assert wrap_units(first, "children") == [first.model.embed_tokens, *first.model.layers]
    assert wrap_units(last, "children") == [*last.model.layers, last.model.norm, last.lm_head]
    for kind in ("fsdp", "zero3"):
        est = trainmem.estimate("hf:tests/data/tiny_llama", strategy=kind, dp=2, pp=2, batch_size=2, seq_len=64,
                                device="a100-80gb")
        assert {tuple(r["ranks"]) for r in est.to_dict()["ranks"]}


def test_a_trace_failure_names_the_error_a_wrapper_with_an_empty_first_line_raised_from():
    from trainmem.trace.modules import ModuleTracker
    from trainmem.trace.recorder import TraceRecorder

    recorder = TraceRecorder(ModuleTracker(nn.Linear(1, 1)))
    try:
        try:
            raise RuntimeError("aten.embedding.default got mixed torch.Tensor and DTensor")
        except RuntimeError as error:
            raise RuntimeError("\n    [Stage 0] failed to run forward:\n    args: ...") from error
    except RuntimeError as wrapper:
        failed = recorder.fail(wrapper)
    assert "(RuntimeError: aten.embedding.default got mixed torch.Tensor and DTensor)" in str(failed)


def test_pp_boundaries_under_fsdps_mixed_precision_policy_and_fp16_refused():
    """FSDP2's MixedPrecisionPolicy computes in bf16 without autocast (torchtitan): the stage outputs, and so the
    receive buffers, are bf16 (torch 2.8-2.11 raised PipeliningShapeError on the fp32 ones declared before);
    fp16-mixed is refused, its GradScaler seeing the loss on the last stage only."""
    import trainmem

    est = trainmem.estimate("mlp:64-128-128-10", strategy="fsdp", dp=2, pp=2, batch_size=8, precision="bf16-mixed",
                            device="a100-40gb").to_dict()
    # per rank, one receive buffer per micro-batch (2 of 4 rows x 128) in bf16, where torch keeps them
    assert len(est["ranks"]) >= 2
    if _receive_buffers_kept():
        assert {r["breakdown"]["communication"] >= 2 * 4 * 128 * 2 for r in est["ranks"]} == {True}
    with pytest.raises(SetupError, match="expected bf16-mixed, bf16 or fp32 with pipeline parallelism, got fp16-mixed"):
        trainmem.estimate("mlp:64-128-128-10", strategy="pp", world_size=2, batch_size=8, precision="fp16-mixed",
                          device="a100-40gb")
