"""Presets (setup/presets.py): --torch-version X.Y, the run's torch's defaults where they decide memory; --qlora and
--hf-trainer, and their --no- forms over a setup file."""

from __future__ import annotations

import pytest

import trainmem
from trainmem.cli import main
from trainmem.errors import SetupError
from trainmem.setup import TrainingSetup

MLP = {"input_shape": "1000", "batch_size": 64, "optimizer": "adam"}


def test_before_2_0_gradients_are_kept_and_the_optimizer_steps_per_tensor():
    old = TrainingSetup.from_mapping({"torch_version": "1.13"})
    assert (str(old.zero_grad), str(old.optimizer_impl)) == ("zeros", "for-loop")
    for version in ("2.0", "2.1.2", "2.10.0+cu128"):
        new = TrainingSetup.from_mapping({"torch_version": version})
        assert (str(new.zero_grad), str(new.optimizer_impl)) == ("none", "default"), version


def test_a_value_given_beside_it_wins_and_errors_name_what_filled_it():
    given = TrainingSetup.from_mapping({"torch_version": "1.12", "zero_grad": "none"})
    assert str(given.zero_grad) == "none" and str(given.optimizer_impl) == "for-loop"
    assert given.flag_for("optimizer_impl") == "--torch-version 1.12 (its optimizer-impl for-loop)"
    assert given.flag_for("zero_grad") == "--zero-grad"


def test_an_optimizer_of_one_implementation_takes_only_the_zero_grad_default():
    for values in ({"optimizer": "lion"}, {"qlora": True}):
        setup = TrainingSetup.from_mapping({**values, "torch_version": "1.13"})
        assert (str(setup.zero_grad), str(setup.optimizer_impl)) == ("zeros", "default"), values


def test_the_trainers_adamw_follows_the_runs_torch():
    assert str(TrainingSetup.from_mapping({"hf_trainer": True, "torch_version": "2.8"}).optimizer_impl) == "fused"
    assert str(TrainingSetup.from_mapping({"hf_trainer": True, "torch_version": "2.7"}).optimizer_impl) == "default"
    # the Trainer passes no implementation before 2.8, so torch's own default of that version applies
    assert str(TrainingSetup.from_mapping({"hf_trainer": True, "torch_version": "1.13"}).optimizer_impl) == "for-loop"


def test_the_estimate_is_the_one_with_those_values_given_and_says_so():
    old = trainmem.estimate("mlp:1000-4000-4000-10", device="a100-40gb", torch_version="1.13", **MLP)
    spelled = trainmem.estimate("mlp:1000-4000-4000-10", device="a100-40gb", zero_grad="zeros",
                                optimizer_impl="for-loop", **MLP)
    assert old.allocated_bytes == spelled.allocated_bytes
    said = [w for w in old.warnings if w.startswith("--torch-version 1.13:")]
    assert len(said) == 1 and "zero_grad keeps the gradients" in said[0] and "installed torch" in said[0]
    assert old.to_dict()["setup"]["torch_version"] == "1.13"
    assert "torch_version" not in spelled.to_dict()["setup"]  # absent unless given: JSON of other runs unchanged


@pytest.mark.parametrize("value", ["abc", "3.1", "1", "2.x", ""])
def test_a_bad_version_is_one_line_naming_the_flag(value, capsys):
    code = main(["estimate", "mlp:100-10", "--input-shape", "100", "--torch-version", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--torch-version: expected a torch version" in err[0]


def test_a_number_in_a_setup_file_is_refused_as_it_would_lose_a_zero(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("torch_version = 2.10\n")
    with pytest.raises(SetupError, match="as text"):
        TrainingSetup.from_toml(path)


def test_keras_refuses_it():
    from trainmem.trace import keras_torch_step

    with pytest.raises(SetupError, match="--torch-version"):
        keras_torch_step.check_setup(TrainingSetup.from_mapping({"torch_version": "2.1"}))


@pytest.mark.parametrize("key,flag", [("qlora", "--no-qlora"), ("hf_trainer", "--no-hf-trainer")])
def test_a_presets_no_form_undoes_a_setup_file(key, flag, tmp_path, capsys):
    import json

    path = tmp_path / "run.toml"
    path.write_text(f'input_shape = "64"\n{key} = true\n')
    code = main(["estimate", "mlp:64-32-10", "--setup", str(path), flag, "--format", "json"])
    out = capsys.readouterr()
    setup = json.loads(out.out)["setup"]
    # no preset values filled in, and --qlora's GPU-only rule does not refuse the CPU run
    assert code == 0 and setup[key] is False and setup["optimizer"] == "adam" and not setup["checkpointing"], out.err
