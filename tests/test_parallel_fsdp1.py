"""--strategy fsdp1: FSDP1 (FullyShardedDataParallel, FlatParameter) traced with torch's own code (parallel/fsdp1.py).
Figures are checked against values computed by hand from FSDP1's documented flattening (each unit one flat parameter,
padded so that every rank's shard has ceil(numel / world) elements); the real runs over gloo are
tests/test_distributed_measure.py's."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from conftest import skip_where_torch_refuses
from trainmem import estimate
from trainmem.errors import SetupError
from trainmem.parallel import fsdp
from trainmem.setup import TrainingSetup
from trainmem.setup.layout import ParallelLayout

MLP = "mlp:256-512-512-10"
UNITS = [256 * 512 + 512, 512 * 512 + 512, 512 * 10 + 10]  # the three Linears: auto wrap makes each a unit
PARAMETERS = sum(UNITS)


def _estimate(**values):
    return estimate(MLP, setup=TrainingSetup.from_mapping({"batch_size": 32, "strategy": "fsdp1", **values}),
                    cache=False)


@pytest.mark.heavy
def test_every_rank_holds_a_padded_shard_of_each_unit_and_adam_state_for_it():
    est = _estimate(world_size=4)
    shard = sum(math.ceil(numel / 4) for numel in UNITS)  # the root holds no parameter of its own
    assert [row.ranks for row in est.ranks] == [(0, 1, 2, 3)]  # every rank alike: one traced for all
    assert est.ranks[0].breakdown["optimizer_state"] == 2 * 4 * shard  # exp_avg, exp_avg_sq of each flat shard
    assert any("FSDP1: FullyShardedDataParallel on 3 unit(s)" in w for w in est.warnings)
    assert not any("data pointer of FakeTensor" in w for w in est.warnings)
    # modules are named as the user's model names them, not by FSDP1's wrapper attribute
    assert [row["module"] for row in est.to_dict()["modules"]] == ["(model)", "0", "1", "2", "3", "4"]


@pytest.mark.heavy
def test_with_orig_params_the_ranks_partition_the_parameters_between_their_optimizer_states():
    est = _estimate(world_size=4, fsdp1_use_orig_params=True)
    states = [row.breakdown["optimizer_state"] for row in est.ranks]
    # each rank's optimizer steps the views of its shard, one per original parameter: together every parameter once,
    # without the padding; the last rank's shard holds the head's remainder and padding, so its state is smaller
    assert sum(states) == 2 * 4 * PARAMETERS
    assert states[-1] < states[0]


def test_no_shard_keeps_a_full_replica_and_shard_grad_op_holds_more_than_full_shard():
    replica = _estimate(world_size=2, fsdp1_sharding="no-shard")
    assert replica.ranks[0].breakdown["optimizer_state"] == 2 * 4 * PARAMETERS
    full, grad_op = _estimate(world_size=4), _estimate(world_size=4, fsdp1_sharding="shard-grad-op")
    assert grad_op.tensor_bytes >= full.tensor_bytes


def test_a_gpu_target_does_not_count_the_host_copy_the_model_is_built_in():
    big = "mlp:" + "-".join(["2048"] * 17) + "-10"  # 16 units of 4.2 M parameters: 16.8 MB each in fp32
    setup = TrainingSetup.from_mapping({"batch_size": 1, "strategy": "fsdp1", "world_size": 64})
    est = estimate(big, setup=setup, device="a100-80gb", cache=False)
    unit = 4 * (2048 * 2048 + 2048)
    whole_model = 16 * unit + 4 * (2048 * 10 + 10)
    # a rank holds a 64th of each unit with its gradient and Adam state, and in backward a few gathered units and
    # their gradients: far below the whole model, which the device would hold at the start if the host copy the
    # model is built in were counted there
    assert est.ranks[0].peak["tensor_bytes"] < whole_model / 2
    assert est.ranks[0].peak["tensor_bytes"] > 2 * unit  # a gathered unit and its gradient at least
    assert any("built in host RAM" in w for w in est.warnings)


def test_dp_index_classes():
    model = None  # fsdp1's classes depend on the layout alone
    assert fsdp.dp_index_classes(model, ParallelLayout(strategy="fsdp1", world_size=4)) == [(0, 1, 2, 3)]
    orig = ParallelLayout(strategy="fsdp1", world_size=3, fsdp1_use_orig_params=True)
    assert fsdp.dp_index_classes(model, orig) == [(0,), (1,), (2,)]
    # HYBRID_SHARD: shards of 2 replicated 3 times; the replicas of one shard index hold the same views
    hybrid = ParallelLayout(strategy="fsdp1", world_size=6, dp_shard=2, fsdp1_sharding="hybrid-shard",
                            fsdp1_use_orig_params=True)
    assert fsdp.dp_index_classes(model, hybrid) == [(0, 2, 4), (1, 3, 5)]


@pytest.mark.heavy
def test_hybrid_shard_shards_inside_the_shard_group_only():
    est = _estimate(world_size=4, dp_shard=2, fsdp1_sharding="hybrid-shard")
    assert est.ranks[0].breakdown["optimizer_state"] == 2 * 4 * sum(math.ceil(numel / 2) for numel in UNITS)


@pytest.mark.parametrize(("values", "where"), [
    ({"strategy": "fsdp", "world_size": 2, "fsdp1_sharding": "no-shard"}, "--fsdp1-sharding"),
    ({"strategy": "ddp", "world_size": 2, "fsdp1_use_orig_params": True}, "--fsdp1-use-orig-params"),
    ({"strategy": "fsdp1", "world_size": 2, "reshard_after_forward": False}, "--reshard-after-forward"),
    ({"strategy": "fsdp1", "world_size": 2, "fsdp_prefetch": 2}, "--fsdp-prefetch"),
    ({"strategy": "fsdp1", "dp": 2, "tp": 2}, "--strategy"),
    ({"strategy": "fsdp1", "world_size": 2, "fsdp1_sharding": "hybrid"}, "--fsdp1-sharding"),
    ({"strategy": "fsdp1", "world_size": 2, "offload": "optimizer"}, "--offload"),  # FSDP1 offloads all or none
    ({"strategy": "fsdp1", "world_size": 4, "dp_shard": 2}, "--dp-shard"),  # only hybrid-shard has shard groups
    ({"strategy": "fsdp", "world_size": 2, "fsdp1_param_dtype": "bfloat16"}, "--fsdp1-param-dtype"),
    ({"strategy": "fsdp1", "world_size": 2, "fsdp1_param_dtype": "int8"}, "--fsdp1-param-dtype"),
    ({"strategy": "fsdp1", "world_size": 2, "fsdp1_backward_prefetch": "early"}, "--fsdp1-backward-prefetch"),
    ({"strategy": "ddp", "world_size": 2, "fsdp1_forward_prefetch": True}, "--fsdp1-forward-prefetch"),
])
def test_knobs_that_do_not_go_together_are_refused_naming_the_flag(values, where):
    with pytest.raises(SetupError) as caught:
        ParallelLayout(**values).resolve()
    assert caught.value.where == where and "\n" not in str(caught.value)


def test_the_layout_reports_fsdp1_knobs_only_for_fsdp1():
    assert "fsdp1_sharding" not in ParallelLayout(strategy="fsdp", world_size=2).to_dict()
    assert ParallelLayout(strategy="fsdp1", world_size=2).to_dict()["fsdp1_sharding"] == "full-shard"


@pytest.mark.heavy
def test_the_cli_takes_the_flags_and_refuses_a_bad_value_in_one_line():
    skip_where_torch_refuses("fsdp1")
    command = [sys.executable, "-m", "trainmem", "estimate", MLP, "--batch-size", "8", "--strategy", "fsdp1",
               "--world-size", "2", "--fsdp1-sharding", "shard-grad-op", "--fsdp1-use-orig-params", "--format", "json",
               "--no-cache"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    layout = json.loads(done.stdout)["setup"]["parallel"]
    assert (layout["fsdp1_sharding"], layout["fsdp1_use_orig_params"]) == ("shard-grad-op", True)
    bad = subprocess.run(command[:-4] + ["--fsdp1-sharding", "sideways"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--fsdp1-sharding" in bad.stderr


def test_fake_tensors_get_distinct_data_pointers_only_while_fsdp1_runs():
    import torch

    from trainmem.trace.fake_cache import fake_data_pointers
    from trainmem.trace.torch_private import FakeTensor, FakeTensorMode

    had = "data_ptr" in FakeTensor.__dict__
    with FakeTensorMode():
        a, c, empty = torch.empty(4), torch.empty(4), torch.empty(0)
        b = a[1:]
        with fake_data_pointers():
            assert a.data_ptr() != 0 and a.data_ptr() != c.data_ptr()
            assert b.data_ptr() == a.data_ptr() + 4  # one float32 in, as a real view's pointer is
            assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            assert empty.data_ptr() == 0
    assert ("data_ptr" in FakeTensor.__dict__) == had
    assert torch.empty(3).untyped_storage().data_ptr() != 0  # real storages keep their own pointers


LLAMA = "hf:tests/data/tiny_llama"


def _llama(**values):
    setup = TrainingSetup.from_mapping({"batch_size": 2, "seq_len": 32, "strategy": "fsdp1", "world_size": 2, **values})
    return estimate(LLAMA, setup=setup, cache=False)


@pytest.mark.parametrize(("values", "where"), [
    ({"lora": "r=8"}, "--fsdp1-use-orig-params"),  # FSDP1: "Must flatten tensors with uniform requires_grad"
    ({"freeze": ("model.embed_tokens",)}, "--fsdp1-use-orig-params"),  # frozen beside trainable in the root unit
    ({"qlora": True, "device": "a100-80gb"}, "--qlora"),  # FSDP1: "Cannot flatten integer dtype tensors"
])
def test_what_fsdp1_cannot_flatten_is_refused_naming_the_flag(values, where):
    device = values.pop("device", "cpu")
    with pytest.raises(SetupError) as caught:
        setup = TrainingSetup.from_mapping({"batch_size": 2, "seq_len": 32, "strategy": "fsdp1", "world_size": 2,
                                            **values})
        estimate(LLAMA, setup=setup, device=device, cache=False)
    assert caught.value.where == where and "\n" not in str(caught.value)


@pytest.mark.heavy
def test_freezing_whole_units_and_lora_with_orig_params_trace():
    frozen = _llama(freeze=("model.layers",))  # every decoder layer is a unit of its own: each uniformly frozen
    assert 0 < frozen.trainable_parameters < frozen.parameters
    lora = _llama(lora="r=8", fsdp1_use_orig_params=True)
    assert 0 < lora.trainable_parameters < frozen.trainable_parameters


@pytest.mark.heavy
def test_bf16_parameters_gather_half_the_bytes_and_need_a_mixed_precision():
    lightning = _estimate(world_size=2, precision="bf16-mixed")
    tutorial = _estimate(world_size=2, precision="bf16-mixed", fsdp1_param_dtype="bfloat16")
    assert tutorial.tensor_bytes < lightning.tensor_bytes
    assert any("param_dtype=bfloat16" in w for w in tutorial.warnings)
    with pytest.raises(SetupError) as caught:
        _estimate(world_size=2, fsdp1_param_dtype="bfloat16")  # fp32: there is no mixed precision to take it
    assert caught.value.where == "--fsdp1-param-dtype"


@pytest.mark.heavy
def test_backward_prefetch_before_the_gradients_holds_one_more_gathered_unit():
    wide = "mlp:1024-1024-1024-1024-1024-10"  # four 4 MiB units
    peaks = {}
    for when in ("pre", "post", "none"):
        setup = TrainingSetup.from_mapping({"batch_size": 1, "input_shape": "1024", "optimizer": "sgd",
                                            "strategy": "fsdp1", "world_size": 2, "fsdp1_backward_prefetch": when})
        peaks[when] = estimate(wide, setup=setup, cache=False).tensor_bytes
    # BACKWARD_PRE all-gathers the next unit (4 MiB padded flat parameter) before the current one's gradients exist;
    # measured over gloo on 2026-12-06: post 26.08 MiB and none 26.07 MiB, each rank within 0.01% of the estimate
    assert peaks["pre"] - peaks["post"] >= 1024 * 1024 * 4 // 2
    assert peaks["post"] >= peaks["none"]


@pytest.mark.heavy
def test_cpu_offload_keeps_each_units_reduced_gradient_shard_on_the_device_until_backward_ends():
    """CPUOffload(offload_params=True), run by FSDP1 itself: the sharded flat parameters, their host gradient buffers
    and Adam's state are host RAM; on the device, every unit's reduced gradient shard (_saved_grad_shard, the
    reduce-scatter's output) is kept until the end of backward (torch/distributed/fsdp/_flat_param.py
    prepare_gradient_for_optim deletes it), so late in backward the device holds most of a rank's gradient shard."""
    big = "mlp:" + "-".join(["1024"] * 17) + "-10"  # 16 units of 1.05 M parameters, one more small one

    def on_gpu(**values):
        setup = TrainingSetup.from_mapping({"batch_size": 1, "strategy": "fsdp1", "world_size": 2, **values})
        return estimate(big, setup=setup, device="a100-40gb", cache=False)

    plain, offloaded = on_gpu(), on_gpu(offload="params")
    unit_shard = 4 * (1024 * 1024 + 1024) // 2  # fp32, a rank's half of one unit
    assert offloaded.allocated_bytes < plain.allocated_bytes / 2
    at_peak = offloaded.ranks[0].breakdown
    assert at_peak["optimizer_state"] == 0 and at_peak["gradients"] == 0  # host RAM: Adam's state, the .grad buffers
    assert at_peak["communication"] >= 12 * unit_shard  # the reduced shards, held on the device as backward goes
    # host RAM: the pinned shard, its host gradient buffer and two Adam moments, fp32
    assert offloaded.ranks[0].host_bytes >= 4 * 16 * unit_shard
    assert any("CPUOffload(offload_params=True)" in w for w in offloaded.warnings)
