"""The layout of many ranks: resolve() fills the degrees, every bad combination is one line naming the flag (exit 2
on the command line), rank coordinates follow init_device_mesh's order, and the fake world builds its mesh."""

from __future__ import annotations

import pytest

from trainmem.errors import SetupError
from trainmem.setup.layout import ParallelLayout, Strategy
from trainmem.setup import TrainingSetup


@pytest.mark.parametrize("given, expected", [
    (dict(strategy="fsdp", world_size=8), (Strategy.FSDP, 8, 1, 1, 8)),
    (dict(strategy="tp", world_size=8), (Strategy.TP, 1, 8, 1, 8)),
    (dict(strategy="pp", world_size=4), (Strategy.PP, 1, 1, 4, 4)),
    (dict(dp=16, tp=8, pp=4), (Strategy.FSDP, 16, 8, 4, 512)),  # torchtitan's default: FSDP over dp
    (dict(strategy="ddp", world_size=8, tp=2), (Strategy.DDP, 4, 2, 1, 8)),
    (dict(tp=4, pp=2), (Strategy.TP, 1, 4, 2, 8)),
    (dict(strategy="zero1", dp=4), (Strategy.ZERO1, 4, 1, 1, 4)),
])
def test_resolve_fills_degrees(given, expected):
    layout = ParallelLayout(**given).resolve()
    assert (layout.strategy, layout.dp, layout.tp, layout.pp, layout.world_size) == expected
    assert layout.resolve() == layout  # idempotent


def test_resolve_defaults_microbatches_and_hsdp_shard():
    assert ParallelLayout(pp=4, dp=2).resolve().microbatches == 4
    hsdp = ParallelLayout(strategy="hsdp", world_size=64, tp=2, gpus_per_node=8).resolve()
    assert (hsdp.dp, hsdp.hsdp_shard) == (32, 4)  # a node's 8 GPUs hold 4 data-parallel ranks of tp 2


def test_rank_coordinates_are_init_device_mesh_order():
    layout = ParallelLayout(dp=32, tp=8, pp=4).resolve()
    assert layout.coords(513) == (2, 0, 1)  # 513 = (2 * 32 + 0) * 8 + 1
    assert all(layout.rank_of(*layout.coords(rank)) == rank for rank in range(0, 1024, 37))


@pytest.mark.parametrize("given, where", [
    (dict(strategy="fsdp", world_size=6, tp=4), "--world-size"),
    (dict(world_size=4), "--world-size"),
    (dict(strategy="tp"), "--strategy"),
    (dict(microbatches=4), "--microbatches"),
    (dict(pp=4, microbatches=2), "--microbatches"),
    (dict(strategy="ddp", world_size=2, offload="params"), "--offload"),
    (dict(strategy="zero1", world_size=2, offload="params"), "--offload"),  # DeepSpeed: offload_param is stage 3's
    (dict(strategy="zero2", world_size=2, offload="params"), "--offload"),
    (dict(strategy="hsdp", world_size=8, dp_shard=3), "--dp-shard"),
    (dict(strategy="fsdp", world_size=8, dp_shard=2), "--dp-shard"),
    (dict(strategy="fsdp2"), "--strategy"),
    (dict(dp=0), "--dp"),
    (dict(ddp_bucket_mb=0), "--ddp-bucket-mb"),
    (dict(gradient_as_bucket_view="yes"), "--gradient-as-bucket-view"),
    (dict(dp=2048, tp=1024), "--dp"),
])
def test_bad_layouts_are_one_line_naming_the_flag(given, where):
    with pytest.raises(SetupError) as error:
        ParallelLayout(**given).resolve()
    assert error.value.where == where and "\n" not in str(error.value) and "expected" in str(error.value)


def test_setup_takes_flat_keys_and_a_table_alike():
    flat = TrainingSetup.from_mapping({"strategy": "fsdp", "world_size": 8, "reshard_after_forward": False})
    table = TrainingSetup.from_mapping({"parallel": {"strategy": "fsdp", "world_size": 8,
                                                     "reshard_after_forward": False}})
    assert flat.parallel == table.parallel and flat.parallel.dp == 8
    assert TrainingSetup.from_mapping(flat.to_dict()).parallel == flat.parallel  # to_dict round-trips
    assert "parallel" not in TrainingSetup().to_dict()  # one process: the setup's JSON is unchanged
    with pytest.raises(SetupError, match="either parallel or its flat keys"):
        TrainingSetup.from_mapping({"parallel": {"strategy": "ddp"}, "world_size": 2})


@pytest.mark.parametrize("argv, where", [
    (["--strategy", "fsdp", "--world-size", "6", "--tp", "4"], "--world-size"),
    (["--strategy", "zero4", "--world-size", "2"], "--strategy"),
    (["--world-size", "4"], "--world-size"),
    (["--strategy", "ddp", "--world-size", "2", "--offload", "optimizer"], "--offload"),
    (["--strategy", "zero2", "--world-size", "2", "--offload", "params"], "--offload"),
    (["--gradient-as-bucket-view", "maybe"], "command line"),
])
def test_cli_bad_parallel_flags_exit_2_in_one_line(argv, where, capsys):
    from trainmem.cli import main

    assert main(["estimate", "mlp:8-4", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"trainmem: error: {where}")


def test_cli_flags_reach_the_setup():
    from trainmem.cli import build_parser, merge_options, option_keys, setup_from_options

    parser = build_parser()
    args = parser.parse_args(["estimate", "mlp:8-4", "--dp", "2", "--tp", "2", "--no-reshard-after-forward",
                              "--fsdp-wrap", "root", "--ddp-bucket-mb", "10", "--gpus-per-node", "4"])
    options = merge_options(args, option_keys(parser))
    layout = setup_from_options(options).parallel
    assert (layout.strategy, layout.world_size, layout.reshard_after_forward, str(layout.fsdp_wrap),
            layout.gpus_per_node) == (Strategy.FSDP, 4, False, "root", 4)


def test_fake_world_of_1024_ranks_builds_its_mesh_and_is_destroyed():
    import torch.distributed as dist

    from trainmem.parallel.world import fake_world

    with fake_world(ParallelLayout(dp=32, tp=8, pp=4), 1023) as world:
        assert (world.pp_rank, world.dp_rank, world.tp_rank) == (3, 31, 7)
        assert (world.dp_mesh().size(), world.tp_mesh().size(), world.pp_group().size()) == (32, 8, 4)
    assert not dist.is_initialized()
    with fake_world(ParallelLayout(strategy="hsdp", world_size=16, gpus_per_node=4), 5) as world:
        assert world.dp_mesh().ndim == 2 and world.dp_group().size() == 16
    with pytest.raises(SetupError, match="rank"):
        with fake_world(ParallelLayout(strategy="ddp", world_size=2), 2):
            pass


@pytest.mark.heavy
def test_kept_worlds_reuse_one_world_per_mesh_and_rank_and_end_with_the_block():
    import torch.distributed as dist

    from trainmem.parallel.world import fake_world, kept_worlds

    with kept_worlds():
        with fake_world(ParallelLayout(strategy="fsdp", dp=4, tp=2), 3) as first:
            group = dist.group.WORLD
        with fake_world(ParallelLayout(strategy="zero3", dp=4, tp=2, offload="params"), 3) as again:
            assert dist.group.WORLD is group and again.mesh is first.mesh and again.layout.strategy == "zero3"
        with fake_world(ParallelLayout(strategy="fsdp", dp=2, tp=4), 3) as other:  # another mesh: a new world
            assert dist.group.WORLD is not group and other.mesh.shape == (1, 2, 4)
        with pytest.raises(RuntimeError):
            with fake_world(ParallelLayout(strategy="fsdp", dp=2, tp=4), 3):
                raise RuntimeError("a trace that fails")
        assert not dist.is_initialized()  # a failed trace leaves no world behind
        with fake_world(ParallelLayout(strategy="fsdp", dp=2, tp=4), 3):
            pass
        assert dist.is_initialized()
    assert not dist.is_initialized()


def test_roles_group_alike_ranks():
    from trainmem.parallel.roles import compact, rank_roles

    roles = rank_roles(ParallelLayout(dp=2, tp=2, pp=2, strategy="ddp"), None)
    assert [(r.label, r.ranks) for r in roles] == [("pp stage 0", (0, 1, 2, 3)), ("pp stage 1", (4, 5, 6, 7))]
    assert compact((0, 1, 2, 5, 7, 8)) == "0-2, 5, 7-8"
