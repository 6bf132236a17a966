import trainmem


def test_all_is_sorted_and_complete():
    assert trainmem.__all__ == sorted(trainmem.__all__)
    public = {name for name in vars(trainmem) if not name.startswith("_") and not isinstance(getattr(trainmem, name), type(trainmem))}
    assert public | {"__version__"} == set(trainmem.__all__)


def test_estimate_prints_itself_and_exposes_numbers():
    est = trainmem.estimate("mlp:8-4", batch_size=2)
    assert isinstance(est.tensor_bytes, int) and isinstance(est.process_bytes, int)
    assert "Peak memory" in str(est)
