"""pack_padded_sequence and pad_packed_sequence on fake tensors (trace/rules.py, trace/packed_sequences.py).

The sequences' lengths are values fake tensors do not have, so the trace packs every sequence at the padded
length, the most the packed data can hold. Checked against the same loop run for real by
benchmarks/truth_loops.py (a fresh process that imports nothing of trainmem): with every sentence at the padded
length the bound is the run (tolerance of tests/test_loops.py); with sentences of random lengths it is above it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import zoo
from trainmem import estimate
from trainmem.errors import SetupError, TraceError
from trainmem.setup import TrainingSetup
from trainmem.trace.packed_sequences import packed_lengths

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.01


def measured_tensor_peak(reference: str, batch: int) -> int:
    command = [sys.executable, str(ROOT / "benchmarks" / "truth_loops.py"), reference, "--batch-size", str(batch),
               "--optimizer", "adam", "--loop", "inline", "--mode", "tensors"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stderr[-2000:]
    return json.loads(lines[-1])["tensor_peak_bytes"]


def test_the_estimate_says_it_packed_at_the_padded_length():
    est = estimate(zoo("packed_lstm_tagger"), batch_size=4, optimizer="adam")
    said = [w for w in est.warnings if w.startswith("aten._pack_padded_sequence:")]
    assert len(said) == 1 and "every sequence at the padded length (the bound)" in said[0]
    assert any("_pad_packed_sequence: lengths from the packed batch sizes" in w for w in est.warnings)
    assert "in 'model'" in said[0]  # the module it ran in (the tagger's own forward)


def test_the_padded_output_keeps_its_layout():
    # batch first: (B, T, features) as pad_packed_sequence returns it, so the head's output is (B, T, 12)
    est = estimate(zoo("packed_lstm_tagger"), batch_size=3, optimizer="sgd")
    assert est.tensor_bytes > 0 and est.coverage["ops"]["_pack_padded_sequence"] == 2


def test_an_integer_read_from_other_fake_values_is_still_refused(tmp_path):
    model = tmp_path / "reads.py"
    model.write_text("import torch, torch.nn as nn\n"
                     "class M(nn.Module):\n"
                     "    def __init__(self):\n        super().__init__(); self.l = nn.Linear(4, 4)\n"
                     "    def forward(self, x, n):\n        return self.l(x[: int(n.max())])\n"
                     "def build():\n"
                     "    return M(), lambda b: (torch.randn(b, 4), torch.randint(1, 3, (b,)))\n")
    with pytest.raises(TraceError, match="reads an integer"):
        estimate(f"{model}:build", batch_size=2)


@pytest.mark.slow
def test_at_the_padded_length_the_bound_is_the_run():
    measured = measured_tensor_peak(zoo("packed_lstm_tagger"), 16)
    est = estimate(zoo("packed_lstm_tagger"), batch_size=16, optimizer="adam")
    assert abs(est.tensor_bytes - measured) / measured <= TOLERANCE, (est.tensor_bytes, measured)


@pytest.mark.slow
def test_sentences_of_random_lengths_stay_below_the_bound():
    measured = measured_tensor_peak(zoo("packed_gru_tagger"), 16)
    est = estimate(zoo("packed_gru_tagger"), batch_size=16, optimizer="adam", run_steps=2)  # tensors: 2 steps
    assert est.tensor_bytes >= measured, (est.tensor_bytes, measured)


def test_the_dataset_lengths_give_the_batch_of_the_longest():
    assert packed_lengths(3, 10, None) == ([10, 10, 10], "every sequence at the padded length (the bound)")
    lengths, said = packed_lengths(4, 10, (3, 12, 7, 1, 5))
    assert lengths == [10, 7, 5, 3] and "the batch of the 4 longest of the 5 --seq-lengths given" in said
    # fewer lengths than the batch: the longest stands in for the missing ones (never low)
    assert packed_lengths(4, 10, (3, 6))[0] == [6, 6, 6, 3]


@pytest.mark.parametrize("value", ["", "12,x", "0,5", "-3", "1.5", "12,,4"])
def test_bad_sequence_lengths_are_one_line_naming_the_flag(value):
    with pytest.raises(SetupError) as error:
        TrainingSetup.from_mapping({"seq_lengths": value})
    assert error.value.where == "--seq-lengths"


def test_sequence_lengths_read_from_text_or_a_list_and_stay_out_of_other_runs_json():
    assert TrainingSetup.from_mapping({"seq_lengths": "12, 40,60"}).seq_lengths == (12, 40, 60)
    assert TrainingSetup.from_mapping({"seq_lengths": [12, 40]}).seq_lengths == (12, 40)
    assert "seq_lengths" not in TrainingSetup().to_dict()


@pytest.mark.slow
def test_given_the_batchs_lengths_the_estimate_is_above_the_run_and_below_the_bound():
    from models import TAGGER_LENGTHS

    measured = measured_tensor_peak(zoo("packed_lstm_fixed_lengths"), 16)
    # tensor bytes only: the two traced steps, without the long run's glibc heap replay (alloc/steady_state.py)
    given = estimate(zoo("packed_lstm_fixed_lengths"), batch_size=16, optimizer="adam",
                     seq_lengths=",".join(map(str, TAGGER_LENGTHS)), run_steps=2)
    bound = estimate(zoo("packed_lstm_fixed_lengths"), batch_size=16, optimizer="adam", run_steps=2)
    # measured: 10,444,352 B real, 11,400,512 B given the lengths (the engine accumulates gradients out of place on
    # fake tensors, in place for real: docs/numbers.md), 24,959,872 B at the padded length
    assert measured <= given.tensor_bytes < bound.tensor_bytes, (measured, given.tensor_bytes, bound.tensor_bytes)
