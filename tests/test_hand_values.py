"""Hand-computed values the trace must reproduce exactly."""

import pytest

import trainmem

D = 64


def _linear(tmp_factory, extra: str = "") -> str:
    return tmp_factory(f"def factory():\n    m = nn.Sequential(nn.Linear({D}, {D}), nn.ReLU(), nn.Linear({D}, 4))\n{extra}    return m\n")


def test_seed_mlp_matches_the_issue():
    est = trainmem.estimate("mlp:1000-100-100-100-100-10", batch_size=256, optimizer="adam", input_shape="1000")
    data = est.to_dict()
    assert data["model"]["parameters"] == 131410
    assert data["breakdown"]["parameters"] == 525640
    assert data["breakdown"]["optimizer_state"] == 1051280  # 2 moments × 131,410 × 4 B, alive at the peak
    activations = next(r for r in est.explanation.rows if r.what == "activations")
    assert "1,820 values" in activations.formula
    assert activations.hand_bytes == 1820 * 256 * 4


@pytest.mark.parametrize("optimizer,buffers", [("adamw", 2), ("adam", 2), ("momentum", 1), ("rmsprop", 1),
                                               ("adagrad", 1), ("sgd", 0)])
def test_optimizer_state_per_parameter(optimizer, buffers):
    # Linear(d, d) keeps buffers · 4 · (d² + d) bytes of state
    est = trainmem.estimate(f"mlp:{D}-{D}", batch_size=4, optimizer=optimizer)
    assert est.breakdown["optimizer_state"] == buffers * 4 * (D * D + D)


def test_frozen_layers_keep_no_gradients_or_state(tmp_factory):
    ref = _linear(tmp_factory, "    m[0].requires_grad_(False)\n")
    est = trainmem.estimate(ref, batch_size=4, optimizer="adamw", input_shape=str(D))
    trainable = D * 4 + 4
    assert est.trainable_parameters == trainable
    assert est.breakdown["optimizer_state"] == 2 * 4 * trainable
    assert est.breakdown["gradients"] in (0, 4 * trainable)


def test_freeze_pattern_flag_equals_frozen_factory(tmp_factory):
    ref = _linear(tmp_factory)
    est = trainmem.estimate(ref, batch_size=4, optimizer="adamw", input_shape=str(D), freeze=["0.*"])
    assert est.breakdown["optimizer_state"] == 2 * 4 * (D * 4 + 4)


def test_fp16_mixed_keeps_fp32_master_weights_and_fp16_activations():
    fp32 = trainmem.estimate(f"mlp:{D}-{D}-{D}-4", batch_size=32, optimizer="adam")
    mixed = trainmem.estimate(f"mlp:{D}-{D}-{D}-4", batch_size=32, optimizer="adam", precision="fp16-mixed")
    assert mixed.breakdown["parameters"] == fp32.breakdown["parameters"]  # master weights stay fp32
    assert mixed.breakdown["optimizer_state"] == fp32.breakdown["optimizer_state"]
    assert mixed.explanation.saved_by_op.get("relu", 0) == fp32.explanation.saved_by_op["relu"] // 2


def test_pure_bf16_halves_model_states():
    fp32 = trainmem.estimate(f"mlp:{D}-{D}", batch_size=4, optimizer="adam")
    bf16 = trainmem.estimate(f"mlp:{D}-{D}", batch_size=4, optimizer="adam", precision="bf16")
    assert bf16.breakdown["parameters"] * 2 == fp32.breakdown["parameters"]
    assert bf16.breakdown["optimizer_state"] * 2 == fp32.breakdown["optimizer_state"]


def test_tied_weights_stay_tied():
    from conftest import zoo

    est = trainmem.estimate(zoo("tiny_gpt"), batch_size=1, optimizer="sgd")
    # 2000×256 token embedding shared with the LM head is counted once
    assert est.parameters == sum(m.parameters for m in est.modules)
    assert est.breakdown["parameters"] == est.parameters * 4


@pytest.mark.heavy
def test_checkpointing_saves_activations():
    from conftest import zoo

    plain = trainmem.estimate(zoo("tiny_gpt"), batch_size=4, optimizer="sgd")
    ckpt = trainmem.estimate(zoo("tiny_gpt"), batch_size=4, optimizer="sgd", checkpointing=True)
    assert ckpt.explanation.saved_activation_bytes < plain.explanation.saved_activation_bytes / 2
    assert any("checkpointing wraps 4 blocks" in w for w in ckpt.warnings)


@pytest.mark.heavy
def test_checkpointing_a_cnn_checkpoints_its_stage_blocks():
    """A torchvision-style CNN (features = Sequential of stages, classifier = Sequential(Dropout(inplace),
    Linear)): the stages' blocks are checkpointed, and the in-place dropout stays outside any checkpoint
    (checkpointing the whole head would make recomputation meet its modified input and fail)."""
    import torch
    from torch import nn

    from trainmem.trace.checkpointing import find_blocks

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Sequential(block(3, 8), block(8, 8)), nn.Sequential(block(8, 16)))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(16, 10))

        def forward(self, x):
            return self.classifier(torch.flatten(self.pool(self.features(x)), 1))

    # the stages are split into their conv-norm-activation blocks; the head into its Linear
    assert [name for name, _ in find_blocks(Net())] == ["features.0.0", "features.0.1", "features.1.0", "classifier.1"]
    plain = trainmem.estimate(Net(), batch_size=8, optimizer="sgd", input_shape="3,32,32")
    ckpt = trainmem.estimate(Net(), batch_size=8, optimizer="sgd", input_shape="3,32,32", checkpointing=True)
    assert ckpt.explanation.saved_activation_bytes < plain.explanation.saved_activation_bytes


def test_grad_accum_keeps_one_gradient_set():
    one = trainmem.estimate(f"mlp:{D}-{D}", batch_size=4, optimizer="sgd", steps=1)
    accum = trainmem.estimate(f"mlp:{D}-{D}", batch_size=4, optimizer="sgd", grad_accum=3, steps=1)
    assert accum.tensor_bytes >= one.tensor_bytes
    assert accum.breakdown["gradients"] <= 4 * (D * D + D)


def test_module_object_is_not_touched():
    import torch

    model = torch.nn.Linear(D, 3)
    before = model.weight.detach().clone()
    est = trainmem.estimate(model, batch_size=2, optimizer="adam", input_shape=str(D))
    assert est.breakdown["parameters"] == 4 * (D * 3 + 3)
    assert torch.equal(model.weight, before)


def test_rules_of_thumb_for_the_seed_mlp():
    """131,410 fp32 parameters; per sample 1,000 inputs and 810 leaf-layer outputs (4×(100 linear + 100
    relu) + 10), batch 256."""
    est = trainmem.estimate("mlp:1000-100-100-100-100-10", batch_size=256, optimizer="adam", input_shape="1000")
    rules = {row.rule: row.bytes for row in est.baselines}
    assert rules["checkpoint size × 2"] == 2 * 131_410 * 4
    assert rules["16 bytes per parameter (mixed-precision Adam)"] == 16 * 131_410
    assert rules["torchinfo-style (input + 2 × layer outputs + parameters)"] == (
        256 * 1000 * 4 + 2 * 810 * 256 * 4 + 131_410 * 4)
