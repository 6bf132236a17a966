"""--load, --resume, --checkpoint-dtype: the checkpoint read before training (trace/checkpoint_load.py).

The real-run test holds the tensor peak to benchmarks/truth_loops.py's (no trainmem code: torch.load,
load_state_dict, del, then the tutorial loop) within the tensor engine's tolerance; benchmarks/results/load_phase.md
has every row with peak RSS."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainmem import estimate
from trainmem.errors import SetupError
from trainmem.setup import TrainingSetup
from trainmem.trace.events import Phase

ROOT = Path(__file__).resolve().parents[1]
MLP = "mlp:1000-2000-2000-10"
PARAMS_BYTES = (1000 * 2000 + 2000 + 2000 * 2000 + 2000 + 2000 * 10 + 10) * 4
MiB = 1 << 20


def _estimate(device="cpu", **values):
    return estimate(MLP, input_shape="1000", batch_size=8, device=device, cache=False, **values)


def _live_by_phase(est) -> dict[str, int]:
    live, peaks = 0, {}
    charged = est.replay_input.allocator.charged
    for event in est.replay_input.events:
        live += charged(event.nbytes) if event.action == "alloc" else -charged(event.nbytes)
        peaks[str(event.phase)] = max(peaks.get(str(event.phase), 0), live)
    return peaks


@pytest.mark.parametrize("values,where,words", [
    ({"resume": True}, "--resume", "expected --load state-dict|state-dict-cpu with --resume"),
    ({"checkpoint_dtype": "bf16"}, "--checkpoint-dtype", "got --load none"),
    ({"load": "state-dict", "checkpoint_dtype": "int8"}, "--checkpoint-dtype", "expected fp32|bf16|fp16"),
    ({"load": "from-disk"}, "--load", "expected none|state-dict|state-dict-cpu"),
    ({"load": "state-dict", "strategy": "ddp", "world_size": 2}, "--load", "expected one process"),
    ({"load": "state-dict", "resume": True, "optimizer": "paged-adamw-8bit"}, "--resume", "torch.optim optimizer"),
])
def test_combinations_not_modelled_are_refused_in_one_line(values, where, words):
    with pytest.raises(SetupError) as error:
        TrainingSetup.from_mapping(values)
    assert error.value.where == where and words in error.value.message


def test_no_load_keeps_the_setup_keys_and_figures_of_a_run_without_it():
    assert "load" not in TrainingSetup().to_dict() and "resume" not in TrainingSetup().to_dict()
    plain, loaded = _estimate(optimizer="adam"), _estimate(optimizer="adam", load="state-dict")
    assert plain.load is None and "checkpoint" not in plain.breakdown
    assert loaded.to_dict()["setup"]["load"] == "state-dict"
    # Adam's step holds more than the parameters and their copy: the load adds nothing to the peak
    assert loaded.tensor_bytes == plain.tensor_bytes and loaded.load["peak_in"] == "training"


def test_the_checkpoint_copy_lives_beside_the_parameters_until_it_is_deleted():
    est = _estimate(optimizer="sgd", freeze=["0.*", "2.*"], load="state-dict")
    peaks = _live_by_phase(est)
    assert peaks["init"] == PARAMS_BYTES and peaks["load"] == 2 * PARAMS_BYTES
    assert est.peak_phase == "load" and est.breakdown["checkpoint"] == PARAMS_BYTES
    # the allocator's figures: each tensor rounded to 64 B (the last layer's 40-byte bias twice)
    assert est.load["load_peak_bytes"] == est.tensor_bytes == 2 * PARAMS_BYTES + 2 * 24
    assert PARAMS_BYTES < est.load["training_peak_bytes"] < PARAMS_BYTES + MiB and est.load["peak_in"] == "load"
    assert any(line.startswith("load (--load state-dict)") for line in est.warnings)


def test_a_checkpoint_in_half_precision_is_half_the_copy():
    est = _estimate(optimizer="sgd", freeze=["0.*", "2.*"], load="state-dict", checkpoint_dtype="fp16")
    assert est.breakdown["checkpoint"] == PARAMS_BYTES // 2
    assert 0 <= est.load["load_peak_bytes"] - PARAMS_BYTES * 3 // 2 <= 4 * 64  # 64-byte rounding of 4 tensors


def test_a_resumed_optimizer_state_is_allocated_while_loading_not_at_the_first_step():
    est = _estimate(optimizer="adam", load="state-dict", resume=True)
    state = [e for e in est.replay_input.events if e.action == "alloc" and str(e.category) == "optimizer_state"]
    assert state and all(e.phase == Phase.LOAD for e in state)
    assert sum(e.nbytes for e in state) == 2 * PARAMS_BYTES  # exp_avg and exp_avg_sq
    # parameters, the model's copy and the optimizer's state at once
    assert _live_by_phase(est)["load"] >= 4 * PARAMS_BYTES


def test_a_checkpoint_read_into_host_memory_is_not_on_the_gpu():
    device = _estimate("a100-80gb", optimizer="adam", load="state-dict", resume=True)
    host = _estimate("a100-80gb", optimizer="adam", load="state-dict-cpu", resume=True)
    assert _live_by_phase(device)["load"] >= 4 * PARAMS_BYTES
    # on the GPU while loading: the parameters and the optimizer's state copied in, never the model's copy
    assert 3 * PARAMS_BYTES <= _live_by_phase(host)["load"] < 3 * PARAMS_BYTES + MiB
    assert "checkpoint" not in host.breakdown or host.breakdown["checkpoint"] == 0


def _truth(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "truth_loops.py"), *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,freeze,values", [
    ("sgd", ("0.*", "2.*"), {}),
    ("adam", (), {"resume": True}),
    ("momentum", (), {"resume": True, "checkpoint_dtype": "bf16"}),
])
def test_tensor_peak_matches_a_real_run_that_loads(tmp_path, optimizer, freeze, values):
    common = [MLP, "--batch-size", "8", "--optimizer", optimizer, *[f"--freeze={p}" for p in freeze]]
    path = str(tmp_path / "checkpoint.pt")
    _truth([*common, "--write-checkpoint", path, *(["--resume"] if values.get("resume") else []),
            *(["--checkpoint-dtype", values["checkpoint_dtype"]] if "checkpoint_dtype" in values else [])])
    real = _truth([*common, "--load", path, "--mode", "tensors"])["tensor_peak_bytes"]
    est = _estimate(optimizer=optimizer, freeze=list(freeze), load="state-dict", **values)
    assert abs(est.tensor_bytes - real) <= 0.0005 * real
