"""TargetOptions: how the target runs, one frozen value for estimate(), fit() and sweep() (setup/target_options.py)."""

from __future__ import annotations

import pytest

import trainmem
from trainmem.errors import SetupError
from trainmem.setup.target_options import TargetOptions

GPU = dict(device="a100-40gb", batch_size=2, input_shape="8")


def test_a_dict_of_its_keys_reads_as_the_options():
    assert TargetOptions.of({"cuda_context": 2**30}, "here") == TargetOptions(cuda_context=2**30)
    assert TargetOptions.of(None, "here") == TargetOptions()
    options = TargetOptions(alloc_conf="expandable_segments:True")
    assert TargetOptions.of(options, "here") is options
    assert set(options.cuda()) == set(TargetOptions.CUDA_KEYS) and "tf_memory" not in options.cuda()


@pytest.mark.parametrize(("given", "message"), [
    ({"cuda_contxt": 1}, "expected target options among cuda_context, alloc_conf, cuda_version, module_loading, "
                         "cudnn_benchmark, tf_memory, tf_onednn, dataset_size, got cuda_contxt"),
    ("cuda_context=1", "expected target_options= as a trainmem.TargetOptions (or a dict of its keys), got str"),
])
def test_bad_options_are_refused_in_one_line(given, message):
    with pytest.raises(SetupError) as info:
        trainmem.estimate("mlp:8-4", target_options=given, **GPU)
    assert str(info.value) == f"estimate(): {message}"


@pytest.mark.parametrize("call", [trainmem.estimate, trainmem.fit])
def test_a_loose_keyword_says_where_it_goes_now(call):
    kw = dict(GPU) if call is trainmem.estimate else {k: v for k, v in GPU.items() if k != "batch_size"}
    with pytest.raises(SetupError) as info:
        call("mlp:8-4", cuda_context=2**30, **kw)
    where = "estimate()" if call is trainmem.estimate else "fit()"
    assert str(info.value) == (f"{where}: expected target_options=TargetOptions(cuda_context=…) for how the target "
                               "runs, got cuda_context as setup keywords")


def test_fit_refuses_tensorflow_options():
    with pytest.raises(SetupError, match="expected no TensorFlow option for fit"):
        trainmem.fit("mlp:8-4", device="a100-40gb", input_shape="8", target_options={"tf_memory": "growth"})


@pytest.mark.heavy
def test_the_options_reach_the_target():
    plain = trainmem.estimate("mlp:8-4", **GPU)
    given = trainmem.estimate("mlp:8-4", target_options=TargetOptions(cuda_context=2**30), **GPU)
    assert given.process_parts["cuda_context"] == 2**30 != plain.process_parts["cuda_context"]
