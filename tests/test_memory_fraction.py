"""per_process_memory_fraction in --alloc-conf: the allocator is capped at fraction × the card's
capacity (torch.cuda.set_per_process_memory_fraction); a run under the cap is the same run."""

import trainmem
from trainmem.setup.target_options import TargetOptions

HALF = "per_process_memory_fraction:0.5"


def _figures(estimate: trainmem.Estimate) -> dict:
    result = estimate.to_dict()
    allocator = {key: value for key, value in result["allocator"].items() if key != "settings"}
    return {"peak": result["peak"], "process": result["process"], "allocator": allocator, "fits": result["fits"]}


def test_a_run_under_half_the_card_is_the_same_with_the_fraction():
    setup = dict(device="a100-40gb", batch_size=64, optimizer="adam")
    whole = trainmem.estimate("mlp:1000-1000-10", **setup)
    half = trainmem.estimate("mlp:1000-1000-10", target_options=TargetOptions(alloc_conf=HALF), **setup)
    assert half.to_dict()["allocator"]["settings"] == "per_process_memory_fraction=0.5"
    assert _figures(half) == _figures(whole) and whole.fits


def test_a_run_beyond_half_the_card_does_not_fit_with_the_fraction():
    # 40,000 × 40,000 float32 weights: 6.4 GB of parameters, as much again in gradients and twice that
    # in Adam's state: about 26 GB, which a 40 GB card holds and half of it does not
    model = "mlp:40000-40000"
    whole = trainmem.estimate(model, device="a100-40gb", optimizer="adam")
    half = trainmem.estimate(model, device="a100-40gb", optimizer="adam", target_options=TargetOptions(alloc_conf=HALF))
    allocated = whole.to_dict()["peak"]["allocated_bytes"]
    assert 20e9 < allocated < 40e9 and whole.fits and whole.to_dict()["allocator"]["out_of_memory"] is None
    assert not half.fits and "out of memory" in half.to_dict()["allocator"]["out_of_memory"].lower()
    # the figures of a run that fails are the whole run's, as on a card large enough for it
    assert half.to_dict()["peak"]["allocated_bytes"] == allocated
    assert half.to_dict()["peak"]["reserved_bytes"] == whole.to_dict()["peak"]["reserved_bytes"]
