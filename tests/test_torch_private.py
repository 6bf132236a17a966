"""trace/torch_private.py: the private torch names that moved between torch 2.6 and 2.15 are probed once, each
with a named fallback that does the same on the older torches, and a one-line refusal (exit 2) where a torch has
none. Only one torch is installed here, so the older ones are simulated by removing the newer name (monkeypatch);
the fallbacks are the code paths torch 2.6-2.11 take (checked there by hand: identical per-rank figures)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from trainmem.cli import main
from trainmem.errors import TorchVersionError
from trainmem.trace import torch_private

MLP = "mlp:256-512-512-10"
MULTI_RANK = "tracing the ranks of a multi-GPU layout (--strategy, --dp, --tp, --pp, plan)"


@pytest.fixture(autouse=True)
def fresh_probes():
    """Each test probes again (the probes are cached once per process); the cache is left clean afterwards."""
    probes = (torch_private._sharding_cache_clearing, torch_private._shape_propagation_muting)
    for probe in probes:
        probe.cache_clear()
    yield
    for probe in probes:
        probe.cache_clear()


def _with_newer_names() -> None:
    """These tests simulate the older torches from the newest ways; under an older torch (make compat) the
    fallbacks are the ways taken for real, and the feature matrix runs them."""
    import torch.distributed.tensor.debug as debug
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    if not (hasattr(debug, "_clear_sharding_prop_cache") and hasattr(ShardingPropagator, "_fake_mode_lock")):
        pytest.skip(f"torch {torch.__version__} takes the older ways itself: "
                    f"{sorted(torch_private.private_api_ways().values())}")


def _without_newer_names(monkeypatch) -> None:
    """What torch 2.6-2.10 lack: the debug module's one-call clearing, and the propagator's fake-mode lock (2.12)."""
    import torch.distributed.tensor.debug as debug
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    _with_newer_names()

    monkeypatch.delattr(debug, "_clear_sharding_prop_cache")
    monkeypatch.delattr(ShardingPropagator, "_fake_mode_lock")


def _without_any_way(monkeypatch) -> None:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    _without_newer_names(monkeypatch)
    monkeypatch.delattr(ShardingPropagator, "_propagate_tensor_meta_non_cached")
    monkeypatch.setattr(DTensor._op_dispatcher.sharding_propagator, "propagate_op_sharding", object())


def test_this_torch_takes_the_recommended_ways():
    _with_newer_names()
    ways = torch_private.private_api_ways()
    assert ways == {"clear_dtensor_caches": "torch.distributed.tensor.debug._clear_sharding_prop_cache",
                    "dtensor_shape_propagation_muted": "ShardingPropagator._fake_mode_lock"}


def test_older_torch_clears_the_propagator_cache_by_hand(monkeypatch):
    """torch 2.6-2.10: no _clear_sharding_prop_cache; the propagator's lru cache is cleared itself — through
    LocalLRUCache.cache_clear (2.10) or its `.cache` (2.6-2.9, simulated with an object that has only that)."""
    import functools

    from torch.distributed.tensor import DTensor

    _without_newer_names(monkeypatch)
    ways = torch_private.private_api_ways()
    assert ways["clear_dtensor_caches"].startswith("DTensor._op_dispatcher.sharding_propagator")
    assert ways["dtensor_shape_propagation_muted"] == "ShardingPropagator._propagate_tensor_meta_non_cached (wrapped)"

    class OldLocalLRUCache:  # torch 2.6-2.9: no cache_clear of its own
        def __init__(self):
            self.cache = functools.lru_cache(None)(lambda key: key)

    old = OldLocalLRUCache()
    old.cache("a decision")
    monkeypatch.setattr(DTensor._op_dispatcher.sharding_propagator, "propagate_op_sharding", old)
    torch_private.clear_dtensor_caches()
    assert old.cache.cache_info().currsize == 0


def test_the_wrapping_fallback_mutes_as_the_lock_does(monkeypatch):
    """The same per-rank figures with the fallback of torch 2.6-2.11 as with 2.12's lock (without muting, the
    global-shape fake tensors would add about 5 MB to this tensor-parallel MLP's peak)."""
    import trainmem

    def figures():
        est = trainmem.estimate(MLP, input_shape="256", tp=2, device="h100-80gb")
        return est.tensor_bytes, est.allocated_bytes, est.reserved_bytes, est.process_bytes

    with_lock = figures()
    # 2.13's own propagation takes the lock (nullcontext unless replaced), so the lock stays and the wrapper is
    # chosen in its place: then only the wrapper mutes
    monkeypatch.setattr(torch_private, "_shape_propagation_muting",
                        lambda: ("wrapped", torch_private._mute_by_wrapping))
    monkeypatch.setattr(torch_private, "_sharding_cache_clearing",
                        lambda: ("by hand", torch_private._clear_propagator_cache))
    assert figures() == with_lock
    monkeypatch.setattr(torch_private, "_shape_propagation_muting", lambda: ("none", lambda _: contextlib.nullcontext()))
    assert figures()[0] > with_lock[0]  # what the muting keeps out


def test_a_torch_with_no_way_is_refused_in_one_line(monkeypatch, capsys):
    _without_any_way(monkeypatch)
    with pytest.raises(TorchVersionError) as caught:
        torch_private.fake_store()
    assert f"(this is torch {torch.__version__})" in str(caught.value)
    code = main(["estimate", MLP, "--input-shape", "256", "--tp", "2", "--device", "h100-80gb"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"trainmem: error: {MULTI_RANK} needs a torch with")
    code = main(["plan", MLP, "--input-shape", "256", "--gpus", "2xh100-80gb", "--micro-batches", "1",
                 "--precisions", "fp32", "--offloads", "none"])
    out = capsys.readouterr()
    assert code == 2 and out.out == "" and "no layout could be evaluated: " in out.err
    assert f"layouts failed: {MULTI_RANK} needs a torch with" in out.err


def test_below_the_oldest_checked_torch_the_refusal_names_the_version(monkeypatch):
    _without_any_way(monkeypatch)
    monkeypatch.setattr(torch, "__version__", "2.4.1+cu121")
    with pytest.raises(TorchVersionError) as caught:
        torch_private.fake_store()
    assert str(caught.value).startswith(f"{MULTI_RANK} needs torch >= 2.6 (this is torch 2.4.1+cu121: ")


@pytest.mark.parametrize("version, release", [("2.8.0+cu128", (2, 8, 0)), ("2.13.0+cpu", (2, 13, 0)),
                                              ("2.10.0a0+git1234", (2, 10, 0)), ("2.6", (2, 6, 0)), ("weird", (0, 0, 0))])
def test_torch_release(version, release):
    assert torch_private.torch_release(version) == release


@pytest.mark.parametrize("version, argv, line", [
    ("2.6.0+cu124", ["--strategy", "fsdp", "--world-size", "2"], "--strategy fsdp needs torch >= 2.7 (this is torch "
     "2.6.0+cu124; fake tensors have kernels for c10d's collectives from torch 2.7)"),
    ("2.6.0+cu124", ["--strategy", "ddp", "--world-size", "2"], "--strategy ddp needs torch >= 2.7 (this is torch "
     "2.6.0+cu124; DistributedDataParallel takes init_sync from torch 2.7)"),
    ("2.6.0+cu124", ["--strategy", "fsdp1", "--world-size", "2"], "--strategy fsdp1 needs torch >= 2.7 (this is torch "
     "2.6.0+cu124; fake tensors have kernels for c10d's collectives from torch 2.7)"),
    ("2.6.0+cu124", ["--pp", "2", "--batch-size", "2"], "--pp needs torch >= 2.7 (this is torch 2.6.0+cu124; "),
    ("2.7.0+cu126", ["--strategy", "hsdp", "--world-size", "4", "--gpus-per-node", "2"],
     "--strategy hsdp needs torch >= 2.8 (this is torch 2.7.0+cu126; on torch 2.7 HSDP's backward fails")])
def test_a_layout_an_older_torch_cannot_trace_is_refused_in_one_line(monkeypatch, capsys, version, argv, line):
    """What tracing each strategy on torch 2.6.0 and 2.7.0 showed (LATER_TORCH), simulated by the version."""
    monkeypatch.setattr(torch, "__version__", version)
    code = main(["estimate", MLP, "--input-shape", "256", "--device", "h100-80gb", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"trainmem: error: {line}") and err.count("\n") == 1


def test_tensor_parallelism_alone_runs_on_the_oldest_torch(monkeypatch):
    from trainmem.setup.layout import ParallelLayout, Strategy

    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    torch_private.require_torch_for(ParallelLayout(strategy=Strategy.TP, world_size=2, tp=2).resolve())


@pytest.fixture
def fresh_pipeline_probe():
    torch_private._PIPELINE_FORWARD_CACHE_NAME.clear()
    yield
    torch_private._PIPELINE_FORWARD_CACHE_NAME.clear()


@pytest.mark.parametrize("name", ["fwd_cache", "_forward_chunk_states"])
def test_a_stages_micro_batches_in_flight_by_either_name(fresh_pipeline_probe, name):
    """torch 2.6-2.14 keep a stage's forward chunks in `fwd_cache`, 2.15 in `_forward_chunk_states`: the first
    stage seen decides which, once per stage class."""
    stage_class = type(f"Stage{name}", (), {})
    stage = stage_class()
    setattr(stage, name, {0: "chunk 0", 1: "chunk 1"})
    assert torch_private.pipeline_chunks_in_flight(stage) == 2
    assert torch_private._PIPELINE_FORWARD_CACHE_NAME == {stage_class: name}
    getattr(stage, name).pop(0)
    assert torch_private.pipeline_chunks_in_flight(stage) == 1


def test_a_stage_without_a_forward_cache_is_refused_in_one_line(fresh_pipeline_probe):
    with pytest.raises(TorchVersionError) as caught:
        torch_private.pipeline_chunks_in_flight(type("NewStage", (), {})())
    assert str(caught.value).startswith("--pp needs a torch with a forward cache on PipelineStage")
    assert "\n" not in str(caught.value)


def test_this_torchs_pipeline_stage_has_a_forward_cache_the_probe_knows():
    """The real PipelineStage of the installed torch: its forward cache is one of the names the probe tries."""
    import inspect

    from torch.distributed.pipelining import stage

    source = inspect.getsource(stage._PipelineStageBase.__init__)
    assert any(f"self.{name}" in source for name in torch_private._PIPELINE_FORWARD_CACHES)


def test_fit_on_a_torch_that_cannot_trace_the_layout_says_so_once(monkeypatch, capsys):
    """The refusal holds for every candidate: fit gives it as it is, not as a failed batch size 1."""
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    code = main(["fit", MLP, "--input-shape", "256", "--device", "a100-80gb", "--strategy", "ddp", "--world-size", "2"])
    out = capsys.readouterr()
    assert code == 2 and out.out == "" and out.err.count("\n") == 1
    assert out.err.startswith("trainmem: error: --strategy ddp needs torch >= 2.7 (this is torch 2.6.0+cu124; ")


def test_clearing_dtensor_caches_empties_the_redistribute_plans(monkeypatch):
    """The plans keep the placements of the world they were made in (torch 2.8: an embedding's _MaskPartial with
    its mask): a fake world's end empties them with the sharding decisions."""
    import functools

    from torch.distributed.tensor import _redistribute

    plans = functools.cache(lambda source, target: (source, target))
    monkeypatch.setattr(_redistribute, "_gen_transform_infos", plans)
    plans("a spec", "another")
    torch_private.clear_dtensor_caches()
    assert plans.cache_info().currsize == 0
