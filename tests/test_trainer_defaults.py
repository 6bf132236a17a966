"""The Trainer's default optimizer follows the installed torch the way transformers' TrainingArguments does."""

from __future__ import annotations

import pytest

from trainmem.trainer_defaults import trainer_optim_name, trainer_optimizer_impl


@pytest.mark.parametrize("version,impl", [("2.6.0+cu124", "default"), ("2.7.1", "default"),
                                          ("2.8.0.dev20250601", "fused"), ("2.8.0", "fused"),
                                          ("2.13.0+cpu", "fused"), ("2.15.0+cu132", "fused"), ("3.0.0", "fused")])
def test_fused_from_torch_2_8(version, impl):
    assert trainer_optimizer_impl(version) == impl
    assert trainer_optim_name(version) == ("adamw_torch_fused" if impl == "fused" else "adamw_torch")


def test_a_version_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="expected a torch version"):
        trainer_optimizer_impl("nightly")


def test_agrees_with_the_installed_transformers():
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir="unused", report_to="none")
    assert str(args.optim.value) == trainer_optim_name()
