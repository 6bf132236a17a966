"""First-hour fixes (issue 25, item 8): a message names the flag the user typed, or says the value is the default;
a batch past int64 sizes blames --batch-size; compare without TensorFlow says what its Keras side needs; the
defaults a preset turns on can be turned off (--no-checkpointing, --max-grad-norm none)."""

from __future__ import annotations

import json
import sys

import pytest

from trainmem.cli import main
from trainmem.cli.options import timeout_words

MLP = ["estimate", "mlp:10-4"]


def _error_line(args: list[str], capsys) -> str:
    code = main(args)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and not captured.out, captured.err
    return lines[0]


def _setup(args: list[str], capsys) -> dict:
    code = main([*args, "--format", "json"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    return json.loads(captured.out)["setup"]


# --- 1. every message names the flag the user typed, or says the value is the default -------------------------


def test_a_refusal_says_the_device_is_the_default_when_none_was_typed(tmp_path, capsys):
    line = _error_line([*MLP, "--memory-snapshot", str(tmp_path / "s.pickle")], capsys)
    assert line.startswith("trainmem: error: --memory-snapshot:") and line.endswith("got --device cpu (the default)")


def test_a_refusal_names_the_device_as_typed(tmp_path, capsys):
    line = _error_line([*MLP, "--device", "cpu", "--memory-snapshot", str(tmp_path / "s.pickle")], capsys)
    assert line.endswith("got --device cpu")


def test_a_refusal_names_the_setup_file_that_gave_the_device(tmp_path, capsys):
    setup = tmp_path / "run.toml"
    setup.write_text('device = "cpu"\n')
    line = _error_line([*MLP, "--setup", str(setup), "--memory-snapshot", str(tmp_path / "s.pickle")], capsys)
    assert line.endswith(f"got cpu ({setup}: device)")


@pytest.mark.parametrize("flags,says", [
    (["--offload", "optimizer"], "got --strategy none (the default)"),
    (["--tp", "2", "--offload", "optimizer"], "got --strategy tp (implied by --tp 2)"),
    (["--dp", "4", "--dp-shard", "2"], "got --strategy fsdp (implied by --dp 4)"),
    (["--strategy", "ddp", "--dp", "4", "--dp-shard", "2"], "got --strategy ddp"),
])
def test_a_layout_refusal_says_where_the_strategy_came_from(flags, says, capsys):
    assert _error_line([*MLP, *flags], capsys).endswith(says)


def test_the_time_limit_says_it_is_the_default():
    assert timeout_words(86400, None) == "--timeout 86400 s (the default)"
    assert timeout_words(3, "--timeout") == "--timeout 3 s"
    assert timeout_words(3, "run.toml: timeout") == "3 s (run.toml: timeout)"


def test_a_keras_refusal_blames_the_preset_not_what_it_turned_on():
    from trainmem.errors import SetupError
    from trainmem.setup import TrainingSetup
    from trainmem.trace.tf.fit_setup import check_supported

    with pytest.raises(SetupError) as refused:
        check_supported(TrainingSetup(qlora=True, checkpointing=True))
    assert refused.value.where == "--qlora"


# --- 2. a batch past int64 sizes blames --batch-size ----------------------------------------------------------


@pytest.mark.parametrize("model,batch,flags", [
    ("mlp:10-4", 2**62, []),  # the batch itself: 2**62 x 10 elements
    ("mlp:1-4", 2**62, []),  # the batch fits, the first Linear's output [2**62, 4] does not
    ("mlp:1-4", 2**62, ["--input-shape", "1"]),  # typed shapes: this once blamed --input-shape
    ("mlp:10-400", 2**55, []),  # bytes, not elements: [2**55, 400] in 4-byte floats
])
def test_a_batch_past_int64_blames_batch_size(model, batch, flags, capsys):
    line = _error_line(["estimate", model, "--batch-size", str(batch), *flags], capsys)
    assert line.startswith("trainmem: error: --batch-size:") and "--input-shape" not in line


def test_a_batch_past_int64_from_a_setup_file_blames_the_file(tmp_path, capsys):
    setup = tmp_path / "run.toml"
    setup.write_text(f"batch_size = {2**62}\n")
    line = _error_line(["estimate", "mlp:1-4", "--setup", str(setup)], capsys)
    assert line.startswith(f"trainmem: error: {setup}: batch_size:") and "--batch-size" not in line


def test_a_keras_batch_past_int64_blames_batch_size(capsys):
    pytest.importorskip("tensorflow")
    line = _error_line([*MLP, "--framework", "keras", "--batch-size", str(2**62)], capsys)
    assert line.startswith("trainmem: error: --batch-size:")


# --- 3. compare's Keras side without TensorFlow ---------------------------------------------------------------


@pytest.mark.parametrize("missing", [("tensorflow",), ("keras",), ("tensorflow", "keras")])
def test_compare_without_tensorflow_names_what_its_keras_side_needs(missing, monkeypatch, capsys):
    for name in missing:  # an import of a name mapped to None fails, and find_spec finds nothing
        monkeypatch.setitem(sys.modules, name, None)
    line = _error_line(["compare", "mlp:10-4", "--input-shape", "10"], capsys)
    assert line.startswith("trainmem: error: compare: expected TensorFlow and Keras 3 for compare's Keras side")
    assert "pip install 'trainmem[tensorflow]'" in line and all(f"no {name}" in line for name in missing)
    assert "for a Keras model" not in line


# --- 4. negations of what presets turn on ---------------------------------------------------------------------


def test_no_checkpointing_wins_over_qlora(capsys):
    pytest.importorskip("peft")
    qlora = [*MLP, "--qlora", "--device", "a100-40gb"]
    assert _setup(qlora, capsys)["checkpointing"] is True
    assert _setup([*qlora, "--no-checkpointing"], capsys)["checkpointing"] is False


def test_no_checkpointing_wins_over_a_setup_file(tmp_path, capsys):
    setup = tmp_path / "run.toml"
    setup.write_text("checkpointing = true\n")
    assert _setup([*MLP, "--setup", str(setup)], capsys)["checkpointing"] is True
    assert _setup([*MLP, "--setup", str(setup), "--no-checkpointing"], capsys)["checkpointing"] is False
    assert _setup([*MLP, "--checkpointing"], capsys)["checkpointing"] is True


def test_max_grad_norm_none_wins_over_hf_trainer(tmp_path, capsys):
    assert _setup([*MLP, "--hf-trainer"], capsys)["max_grad_norm"] == 1.0
    assert _setup([*MLP, "--hf-trainer", "--max-grad-norm", "none"], capsys)["max_grad_norm"] is None
    setup = tmp_path / "run.toml"
    setup.write_text('hf_trainer = true\nmax_grad_norm = "none"\n')
    assert _setup([*MLP, "--setup", str(setup)], capsys)["max_grad_norm"] is None
    assert _setup([*MLP, "--max-grad-norm", "0.5"], capsys)["max_grad_norm"] == 0.5


def test_plan_takes_checkpointing_off_as_fixed():
    from trainmem.plan import fixed_checkpointing

    assert fixed_checkpointing({"checkpointing": False}) == ("off",)
    assert fixed_checkpointing({"checkpointing": True}) == ("on",)
    assert fixed_checkpointing({}) is None
