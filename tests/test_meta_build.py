"""A model whose code names a device is still built on meta (trace/meta_build.py)."""

import torch
from torch import nn

from trainmem.trace.meta_build import REAL_BUDGET_BYTES, SMALL_TENSOR_BYTES, building_on_meta


def test_a_layer_built_with_device_cpu_lands_on_meta():
    with building_on_meta():
        layer = nn.Linear(4096, 4096, device="cpu")  # 64 MiB of weight if made for real
    assert layer.weight.device.type == "meta" and layer.weight.shape == (4096, 4096)


def test_small_tensors_keep_their_device_and_values_construction_reads():
    with building_on_meta():
        rates = [x.item() for x in torch.linspace(0, 0.3, 4, device="cpu")]
        positions = torch.arange(16, device="cpu")
        unnamed = torch.zeros(4)  # no device: meta, as torch.device("meta") makes it
    assert rates == torch.linspace(0, 0.3, 4).tolist()
    assert positions.device.type == "cpu" and positions.tolist() == list(range(16))
    assert unnamed.device.type == "meta"


def test_small_tensors_made_for_real_are_bounded_in_total():
    count = REAL_BUDGET_BYTES // SMALL_TENSOR_BYTES + 10
    with building_on_meta():
        made = [torch.empty(SMALL_TENSOR_BYTES // 4, device="cpu") for _ in range(count)]
    real = sum(t.untyped_storage().nbytes() for t in made if t.device.type == "cpu")
    assert real <= REAL_BUDGET_BYTES and made[-1].device.type == "meta"


def test_a_model_naming_its_device_estimates_as_one_that_does_not(tmp_path):
    import trainmem

    source = tmp_path / "named.py"
    source.write_text("import torch.nn as nn\n"
                      "def named():\n    return nn.Sequential(nn.Linear(512, 512, device='cpu'), nn.ReLU(), nn.Linear(512, 10, device='cpu'))\n"
                      "def unnamed():\n    return nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))\n")
    named = trainmem.estimate(f"{source}:named", batch_size=8, input_shape=512)
    unnamed = trainmem.estimate(f"{source}:unnamed", batch_size=8, input_shape=512)
    assert named.tensor_bytes == unnamed.tensor_bytes and named.breakdown == unnamed.breakdown
