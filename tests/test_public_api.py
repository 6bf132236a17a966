import pytest

import trainmem
from trainmem.setup.target_options import TargetOptions


def test_all_is_sorted_and_complete():
    assert trainmem.__all__ == sorted(trainmem.__all__)
    public = {name for name in vars(trainmem) if not name.startswith("_") and not isinstance(getattr(trainmem, name), type(trainmem))}
    assert public | {"__version__"} == set(trainmem.__all__)


def test_estimate_prints_itself_and_exposes_numbers():
    est = trainmem.estimate("mlp:8-4", batch_size=2)
    assert isinstance(est.tensor_bytes, int) and isinstance(est.process_bytes, int)
    assert "Peak memory" in str(est)


def test_device_as_torch_device_string_or_device():
    """device= takes a name, a torch.device or a trainmem.Device; each names the same target."""
    import torch

    from trainmem.devices import get_device

    by_name = trainmem.estimate("mlp:8-4", batch_size=2, device="cpu")
    by_torch = trainmem.estimate("mlp:8-4", batch_size=2, device=torch.device("cpu"))
    assert by_torch.to_dict()["peak"] == by_name.to_dict()["peak"] and by_torch.device.name == "cpu"
    h200 = trainmem.estimate("mlp:8-4", batch_size=2, device="h200")
    as_device = trainmem.estimate("mlp:8-4", batch_size=2, device=get_device("h200"))
    assert as_device.to_dict() == h200.to_dict() and h200.device.kind == "cuda"


def test_cuda_without_a_gpu_model_is_one_clear_error(monkeypatch):
    """torch.device("cuda") names no GPU model: with no GPU visible to identify, the error asks for one."""
    import pytest
    import torch

    import trainmem.devices as devices

    monkeypatch.setattr(devices, "_visible_gpu", lambda index: None)
    for device in (torch.device("cuda"), torch.device("cuda", 0), "cuda:0"):
        with pytest.raises(trainmem.TrainmemError, match="expected the GPU model to estimate for"):
            trainmem.estimate("mlp:8-4", batch_size=2, device=device)


def test_setup_of_the_wrong_type_is_refused_alike_by_estimate_and_fit():
    """estimate() and fit() read the setup with one function (estimate.orchestrate.setup_of)."""
    import pytest

    for call, where in ((trainmem.estimate, "estimate()"), (trainmem.fit, "fit()")):
        with pytest.raises(trainmem.TrainmemError) as info:
            call("mlp:8-4", setup={"batch_size": 2})
        assert str(info.value) == (f"{where}: expected setup= as a trainmem.TrainingSetup (or the setup's values "
                                   "as keywords), got dict")


def test_text_and_json_count_the_peak_step_and_name_its_module_alike():
    """JSON's peak.step counts from 0 and the text prints that same number, saying how it counts; both name
    the model itself '(model)', as the per-module rows do."""
    est = trainmem.estimate("mlp:1000-100-100-100-100-10", batch_size=256, optimizer="adam", input_shape="1000")
    peak = est.to_dict()["peak"]
    where = next(line for line in str(est).splitlines() if line.startswith("Where: "))
    assert (peak["step"], peak["module"]) == (1, "(model)") and est.setup.steps == 2
    assert where.startswith(f"Where: step {peak['step']} (of steps 0–1 traced), ")
    assert f"module '{peak['module']}'" in where and est.modules[0].module == peak["module"]
    single = trainmem.estimate("mlp:8-4", batch_size=2, steps=1)
    assert "step 0 (the one step traced, counted from 0)" in str(single) and single.to_dict()["peak"]["step"] == 0


def test_the_lean_loop_comparison_resolves_the_model_once(monkeypatch):
    """compare_loop traces twice from one plan: a user's file (the reference) is read and run once."""
    import trainmem.frontends as frontends

    resolved = []
    real = frontends.resolve
    monkeypatch.setattr(frontends, "resolve", lambda model, setup: resolved.append(model) or real(model, setup))
    est = trainmem.estimate("mlp:64-32-8", batch_size=4, input_shape="64", compare_loop=True)
    assert resolved == ["mlp:64-32-8"] and est.lean_loop is not None and est.lean_loop.loop == "lean"


@pytest.mark.parametrize("device", ["cpu", "a100-40gb"])
def test_the_lean_loop_figure_is_the_lean_loops_own_estimate(device):
    """The comparison replays only the allocator (estimate/orchestrate.py lean_allocated), and its figure is the one a
    whole estimate of the lean loop reports."""
    values = dict(batch_size=16, input_shape="64", optimizer="adam", device=device)
    est = trainmem.estimate("mlp:64-256-256-8", compare_loop=True, **values)
    lean = trainmem.estimate("mlp:64-256-256-8", loop="lean", **values)
    assert est.lean_loop.allocated_bytes == lean.allocated_bytes
    assert est.lean_loop.saving_bytes == est.allocated_bytes - lean.allocated_bytes > 0


def test_a_cuda_context_as_large_as_the_card_is_refused():
    import pytest

    with pytest.raises(trainmem.TrainmemError) as info:
        trainmem.estimate("mlp:8-4", batch_size=2, device="a100-40gb",
                          target_options=TargetOptions(cuda_context=1000 * 2**40))
    assert str(info.value) == ("--cuda-context: expected a CUDA context smaller than a100-40gb's 40.00 GiB, "
                               "got 1000.00 TiB")
    assert trainmem.estimate("mlp:8-4", batch_size=2, device="a100-40gb",
                             target_options=TargetOptions(cuda_context=2**30)).process_parts[
        "cuda_context"] == 2**30


def test_a_model_built_from_a_calibrated_library_counts_its_import():
    """A factory or module object of transformers classes: its process holds transformers, as an hf: reference's
    does (frontends/libraries.py); a plain torch model holds none."""
    pytest.importorskip("transformers")
    from trainmem.frontends.libraries import model_libraries

    root = __import__("pathlib").Path(__file__).resolve().parent
    factory = f"{root}/integration_models.py:tiny_gpt2"
    est = trainmem.estimate(factory, batch_size=2)
    assert "libraries_transformers" in est.process_parts
    plain = trainmem.estimate(f"{root}/integration_models.py:mlp_factory", batch_size=2)
    assert not any(key.startswith("librar") for key in plain.process_parts)
    import integration_models as models

    assert model_libraries(models.tiny_gpt2_model()) == ("transformers",) and model_libraries(models.mlp()) == ()
