"""torchvision: and timm: references. They run in .venv-vision (torch 2.14.1 + torchvision + timm; see the
Makefile) and are skipped where torchvision is not installed."""

from __future__ import annotations

import pytest

torchvision = pytest.importorskip("torchvision")
timm = pytest.importorskip("timm")

from trainmem import estimate  # noqa: E402
from trainmem.errors import ModelRefError  # noqa: E402
from trainmem.frontends.vision import parse_ref  # noqa: E402
from trainmem.measure.single_process import measure  # noqa: E402
from trainmem.setup import TrainingSetup  # noqa: E402


def test_parse_ref_keywords():
    assert parse_ref("timm:vit_base_patch16_224?num_classes=10&drop_rate=0.1&global_pool=avg") == (
        "timm", "vit_base_patch16_224", {"num_classes": 10, "drop_rate": 0.1, "global_pool": "avg"})
    with pytest.raises(ModelRefError, match="key=value"):
        parse_ref("timm:resnet50?oops")


def test_torchvision_by_name_with_keywords():
    assert estimate("torchvision:resnet18", batch_size=2).parameters == 11_689_512
    assert estimate("torchvision:resnet18?num_classes=10", batch_size=2).parameters == 11_181_642


def test_input_follows_the_weights():
    est = estimate("torchvision:inception_v3?aux_logits=false&init_weights=false", batch_size=2)
    assert any("3×299×299" in w for w in est.warnings)


def test_constructor_that_computes_with_tensors():
    """torchvision's RegNet calls .tolist() while it is built: built on the CPU with empty weights."""
    assert estimate("torchvision:regnet_x_400mf", batch_size=2).parameters == 5_495_976


def test_timm_by_name():
    est = estimate("timm:convnext_tiny?num_classes=10", batch_size=2, device="a100-40gb")
    assert est.parameters == 27_827_818
    with pytest.raises(ModelRefError, match="timm model name"):
        estimate("timm:no_such_net")


def test_lora_on_a_timm_vit():
    pytest.importorskip("peft")
    est = estimate("timm:vit_tiny_patch16_224", batch_size=2, lora="r=4,alpha=8,targets=qkv")
    # 12 blocks, qkv: 192 → 576; A [4, 192], B [576, 4]
    assert est.trainable_parameters == 12 * (4 * 192 + 576 * 4)


@pytest.mark.slow
@pytest.mark.parametrize("ref,extra,check_rss", [
    ("torchvision:resnet18", {}, False),
    ("torchvision:resnet18", {"lora": "r=4,alpha=8,targets=conv1,conv2"}, False),
    ("timm:vit_tiny_patch16_224", {}, True),
    ("timm:vit_tiny_patch16_224", {"lora": "r=4,alpha=8,targets=qkv"}, True)])
def test_cpu_measure_agrees(ref, extra, check_rss):
    """The same run for real on this CPU (fresh processes), with the core issue's tolerances
    (tests/test_measured.py): the profiler's tensor peak within 1%, and peak RSS, the median of three
    runs, within 5% where the model family meets it in benchmarks/results/accuracy_cpu.md. A
    convolutional net's RSS is known to come out low, by 2-6% for resnet18 at batch 4: the runtime's
    small objects fragment glibc's heap (benchmarks/results/glibc_fidelity.md), which the estimate does
    not model yet. This environment's torch is the CUDA build, whose process floor and library
    increments have their own calibration (targets/data/cpu_runtime.json)."""
    # a case whose RSS is not held runs 8 steps rather than the long run (32): the tensor peak is the same
    length = {} if check_rss else {"run_steps": 8}
    comparison = measure(ref, TrainingSetup.from_mapping({"batch_size": 4, "optimizer": "adam", **extra, **length}),
                         runs=3 if check_rss else 1)
    errors = comparison.to_dict()["error"]
    assert abs(errors["tensor_bytes"]) <= 0.01, comparison
    if check_rss:
        assert abs(errors["process_bytes"]) <= 0.05, comparison
