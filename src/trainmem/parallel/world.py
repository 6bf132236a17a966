"""A fake torch.distributed world of any size, in this one process, for tracing one rank.

`fake_world(layout, rank)` starts the "fake" process-group backend (collectives return at once and never
touch data) as `rank` of `layout.world_size` ranks, and builds the device mesh torchtitan builds:
`init_device_mesh("cpu", (pp, dp, tp))` with named dimensions, HSDP's dp split as (dp_replicate, dp_shard).
Building the mesh creates its sub-groups lazily over the fake backend: world 1,024 (pp 4 x dp 32 x tp 8)
takes about 0.04 s here (measured with torch 2.13, /tmp/h1_mesh.py: init 0.6 ms, mesh 43 ms). The group
is destroyed when the block ends, also on error, so that the next trace starts from nothing; inside
`kept_worlds()` (the planner's jobs) it is kept for the next trace of the same mesh and rank instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from trainmem.errors import SetupError
from trainmem.setup.layout import ParallelLayout


@dataclasses.dataclass
class World:
    """One rank's view of the fake world: its coordinates and the meshes the strategies take."""

    layout: ParallelLayout
    rank: int
    mesh: Any  # torch DeviceMesh over "cpu", dims ("pp", "dp", "tp") or ("pp", "dp_replicate", "dp_shard", "tp")
    pp_rank: int
    dp_rank: int
    tp_rank: int

    @property
    def dp_dims(self) -> tuple[str, ...]:
        return ("dp_replicate", "dp_shard") if self.layout.replicate_x_shard else ("dp",)

    def dp_mesh(self):
        """The data-parallel mesh fully_shard takes: 1-D, or 2-D (replicate, shard) for HSDP."""
        dims = self.dp_dims
        return self.mesh[dims[0]] if len(dims) == 1 else self.mesh[dims]

    def tp_mesh(self):
        return self.mesh["tp"]

    def pp_mesh(self):
        return self.mesh["pp"]

    def dp_group(self):
        """The process group over every data-parallel peer (for HSDP: replicate x shard flattened)."""
        from trainmem.trace.torch_private import flatten_mesh

        mesh = self.dp_mesh()
        return mesh.get_group() if mesh.ndim == 1 else flatten_mesh(mesh, "dp_flat").get_group()

    def pp_group(self):
        return self.pp_mesh().get_group()


def mesh_shape(layout: ParallelLayout) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The mesh's shape and dimension names: (pp, dp, tp), or (pp, dp_replicate, dp_shard, tp) for HSDP."""
    if layout.replicate_x_shard:  # HSDP, FSDP1's HYBRID_SHARD
        shard = layout.hsdp_shard
        return (layout.pp, layout.dp // shard, shard, layout.tp), ("pp", "dp_replicate", "dp_shard", "tp")
    return (layout.pp, layout.dp, layout.tp), ("pp", "dp", "tp")


# the world kept between traces inside kept_worlds(): {"on": bool, "key": (world size, mesh, rank) | None, "world"}
_kept: dict[str, Any] = {"on": False, "key": None, "world": None}


@contextlib.contextmanager
def kept_worlds() -> Iterator[None]:
    """Inside, a fake world outlives its trace and the next trace of the same mesh shape and rank runs in it (a new
    World for its layout over the same mesh); another mesh ends it first. DTensor's sharding decisions, cached per
    world (clear_dtensor_caches), then carry from one trace to the next as they carry from one step to the next
    within a trace: a plan's layouts of one (dp, tp, pp) trace their optimizer's foreach ops on DTensors (FSDP2's
    parameters) through DTensor's slow sharding propagation once instead of once per trace. The world ends with
    the block."""
    before, _kept["on"] = _kept["on"], True
    try:
        yield
    finally:
        _kept["on"] = before
        if not before:
            _end_kept()


def _end_kept() -> None:
    if _kept["key"] is not None:
        import torch.distributed as dist

        from trainmem.trace.torch_private import clear_dtensor_caches

        _kept["key"] = _kept["world"] = None
        dist.destroy_process_group()
        clear_dtensor_caches()  # decisions made on this world's meshes name its process groups


@contextlib.contextmanager
def fake_world(layout: ParallelLayout, rank: int) -> Iterator[World]:
    """The fake process group as `rank` of a resolved layout, with its mesh; destroyed at exit (kept inside
    kept_worlds)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from trainmem.trace.torch_private import clear_dtensor_caches, fake_store

    layout = layout.resolve()
    if not 0 <= rank < layout.world_size:
        raise SetupError(f"expected a rank in 0..{layout.world_size - 1}, got {rank}", where="rank")
    key = (layout.world_size, mesh_shape(layout), rank)
    if _kept["on"] and _kept["key"] == key:
        fake_store(layout)  # what this layout needs of this torch, checked as a new world would
        try:
            yield dataclasses.replace(_kept["world"], layout=layout)
        except BaseException:
            _end_kept()  # a trace that failed in it leaves no world behind
            raise
        return
    _end_kept()
    if dist.is_initialized():
        raise SetupError("expected no process group in this process (trainmem starts a fake one per traced "
                         "rank), got one already initialized", where="torch.distributed")
    dist.init_process_group("fake", store=fake_store(layout), rank=rank, world_size=layout.world_size)
    kept = False
    try:
        shape, names = mesh_shape(layout)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        pp_rank, dp_rank, tp_rank = layout.coords(rank)
        world = World(layout, rank, mesh, pp_rank, dp_rank, tp_rank)
        yield world
        kept = _kept["on"]
        if kept:
            _kept["key"], _kept["world"] = key, world
    finally:
        if not kept:
            dist.destroy_process_group()
            clear_dtensor_caches()  # decisions made on this world's meshes name its process groups
