"""trainmem compare A B … / --sweep / --devices, and sweep(): each configuration's figures are those
of a separate estimate(), the largest batch per device is trainmem fit's answer, bad sweeps are one line with
exit 2, and the progress bar stays off where it must."""

import io
import json

import pytest

import trainmem
from trainmem.cli import main
from trainmem.sweep import compare_setups, sweep
from trainmem.setup.target_options import TargetOptions

SMALL, WIDER = "mlp:64-32-8", "mlp:64-128-8"
ROW_KEYS = {"label", "model", "values", "device", "status", "error", "setup", "peak", "breakdown", "capacity_bytes",
            "fits", "largest_batch"}
PEAK_KEYS = {"tensor_bytes", "allocated_bytes", "reserved_bytes", "process_bytes", "process_bytes_high", "phase",
             "module", "op"}


def run(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def _same_figures(row: dict, est) -> None:
    peak = row["peak"]
    assert peak["tensor_bytes"] == est.tensor_bytes and peak["allocated_bytes"] == est.allocated_bytes
    assert peak["reserved_bytes"] == est.reserved_bytes and peak["process_bytes"] == est.process_bytes
    assert peak["process_bytes_high"] == est.process_bytes_high
    assert row["breakdown"] == est.to_dict()["breakdown"] and row["fits"] == est.fits


def test_sweep_rows_equal_separate_estimates(capsys):
    code, out, err = run(["compare", SMALL, "--optimizer", "adamw", "--sweep", "batch=1,2",
                          "precision=fp32,bf16-mixed", "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["columns"] == ["batch", "precision"] and data["configurations"] == data["estimated"] == 4
    assert [tuple(row["values"].values()) for row in data["rows"]] == [
        ("1", "fp32"), ("1", "bf16-mixed"), ("2", "fp32"), ("2", "bf16-mixed")]
    for row in data["rows"]:
        batch, precision = int(row["values"]["batch"]), row["values"]["precision"]
        assert row["setup"]["batch_size"] == batch and row["setup"]["precision"] == precision
        assert row["setup"]["optimizer"] == "adamw"  # the fixed flag holds for every configuration
        _same_figures(row, trainmem.estimate(SMALL, batch_size=batch, precision=precision, optimizer="adamw"))
    # the figures differ where the setups do (not one estimate repeated)
    assert len({row["peak"]["tensor_bytes"] for row in data["rows"]}) > 1


def test_two_models_on_a_gpu_table_and_json(capsys):
    args = ["compare", SMALL, WIDER, "--batch-size", "4", "--device", "a100-40gb"]
    code, out, err = run([*args, "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert set(data) >= {"trainmem_version", "columns", "devices", "configurations", "estimated", "not_evaluated",
                         "failed", "time_limit_s", "rows", "warnings"}
    assert data["columns"] == ["model"] and [row["model"] for row in data["rows"]] == [SMALL, WIDER]
    for row in data["rows"]:
        assert set(row) == ROW_KEYS and set(row["peak"]) >= PEAK_KEYS and row["status"] == "estimated"
        assert row["device"] == "a100-40gb" and row["peak"]["reserved_bytes"] >= row["peak"]["allocated_bytes"]
        _same_figures(row, trainmem.estimate(row["model"], batch_size=4, device="a100-40gb"))
    code, text, _ = run(args, capsys)
    lines = text.splitlines()
    assert code == 0 and lines[1].split() == ["model", "allocated", "reserved", "nvidia-smi", "fits"]
    assert lines[2].split()[0] == SMALL and lines[3].split()[0] == WIDER
    # aligned: every row's cells start where the headings' do
    assert len({line.index("yes") for line in lines[2:4]}) == 1


def test_largest_batch_equals_fit():
    """The a100-80gb search runs first and the a100-40gb one reuses its traces (the same compute capability):
    the answer must still be fit's, searched alone."""
    result = sweep(WIDER, {"batch_size": [1, 2]}, devices="a100-80gb,a100-40gb")
    alone = trainmem.fit(WIDER, device="a100-40gb")
    assert alone.first_miss is not None  # a real answer below the search's limit, not the limit itself
    for row in result.rows:
        found = row.largest["a100-40gb"]
        assert (found.best, found.first_miss) == (alone.best, alone.first_miss)
    assert f"{alone.best:,}" in str(result)
    data = result.to_dict()
    assert [d["name"] for d in data["devices"]] == ["a100-80gb", "a100-40gb"]
    assert data["devices"][1]["budget_bytes"] == alone.budget
    assert data["rows"][0]["largest_batch"]["a100-40gb"]["best"] == alone.best


@pytest.mark.parametrize("sweep, where, words", [
    (["batc=1,2"], "--sweep batc=1,2", "did you mean batch?"),
    (["batch=0,1"], "--sweep batch=0", "expected a positive integer, got 0"),
    (["batch=two"], "--sweep batch=two", "expected a whole number, got 'two'"),
    (["precision=fp32,fp33"], "--sweep precision=fp33", "expected fp32|"),
    (["checkpointing=maybe"], "--sweep checkpointing=maybe", "expected on|off"),
    (["device=cpu,a100-41gb"], "--sweep device=a100-41gb", "expected a device among"),
    (["seq_len=128"], "--sweep seq_len=128", "expected an hf: model"),
    (["batch=1,1"], "--sweep batch=1,1", "expected distinct values"),
    (["batch"], "--sweep", "expected KEY=V1,V2"),
    (["batch=1,2", "batch=4"], "--sweep batch=4", "each key swept once"),
    (["input_shape=3,4"], "--sweep input_shape=3,4", "no commas"),
])
def test_bad_sweeps_are_one_line_exit_2(sweep, where, words, capsys):
    code, out, err = run(["compare", SMALL, "--sweep", *sweep], capsys)
    line = err.strip()
    assert code == 2 and out == "" and "\n" not in line
    assert line.startswith(f"trainmem: error: {where}: ") and words in line


def test_refusals(capsys):
    code, _, err = run(["compare", SMALL, "--sweep", "batch=1,2,3,4,5,6,7,8", "precision=fp32,bf16-mixed,fp16-mixed",
                        "loop=inline,lean,step-fn"], capsys)
    assert code == 2 and "expected at most 64 configurations" in err and "1 × 8 × 3 × 3 = 72" in err
    code, _, err = run(["compare", SMALL, "--batch-size", "2", "--sweep", "batch=1,2"], capsys)
    assert code == 2 and "--batch-size: expected --batch-size or --sweep batch=…, got both" in err
    code, _, err = run(["compare", SMALL, "--devices", "a100-40gb"], capsys)  # one model, no sweep: torch vs Keras
    assert code == 2 and err.startswith("trainmem: error: --devices: expected a second MODEL or --sweep")
    code, _, err = run(["compare", SMALL, WIDER, "--devices", "a100-41gb"], capsys)
    assert code == 2 and err.startswith("trainmem: error: --devices: expected a device among")
    code, out, err = run(["compare", SMALL, "mlp:0-3"], capsys)  # a bad reference fails before any trace
    assert code == 2 and out == "" and err.startswith("trainmem: error: MODEL: expected mlp:IN-HIDDEN")
    code, _, err = run(["compare", "hf:gpt2"], capsys)  # one model alone is still the PyTorch-vs-Keras comparison
    assert code == 2 and "expected mlp:… or a layer spec" in err


def test_time_limit_and_a_setup_file(tmp_path, capsys):
    result = sweep(SMALL, "batch=1,2", time_limit=1e-9)
    assert [row.status for row in result.rows] == ["not evaluated"] * 2 and "not evaluated" in str(result)
    setup = tmp_path / "run.toml"
    setup.write_text('optimizer = "sgd"\n[sweep]\nbatch = [1, 3]\n')
    code, out, err = run(["compare", SMALL, "--setup", str(setup), "--format", "json"], capsys)
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [row["setup"]["batch_size"] for row in rows] == [1, 3] and rows[0]["setup"]["optimizer"] == "sgd"


def test_python_api_and_notebook_views():
    result = compare_setups(SMALL, {"plain": {"batch_size": 2},
                                             "checkpointed": trainmem.TrainingSetup(batch_size=2, checkpointing=True)})
    assert [row.label for row in result.rows] == [(("setup", "plain"),), (("setup", "checkpointed"),)]
    page = result._repr_html_()
    assert page.count("<tr>") == 3 and "<th>setup</th>" in page and "checkpointed" in page
    text = str(result)
    assert text.startswith("trainmem compare — 2 configurations of mlp:64-32-8 on cpu")
    assert json.loads(json.dumps(result.to_dict()))["estimated"] == 2


def test_plot_of_peaks(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    target = tmp_path / "peaks.svg"
    code, _, err = run(["compare", SMALL, WIDER, "--plot", str(target)], capsys)
    assert code == 0, err
    assert f"wrote the plot of peaks to {target}" in err
    drawing = target.read_text()
    assert "series-tensors" in drawing and "series-process (peak RSS)" in drawing


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_off_with_no_color_and_open_ended_on_a_terminal(monkeypatch):
    from trainmem.progress import Progress

    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)  # the plain line, whose text is ours
    monkeypatch.delenv("NO_COLOR", raising=False)
    shown = _Terminal()
    with Progress("fit: the largest batch size", stream=shown, unit="candidate") as bar:
        bar.total(None)  # doubling, then bisecting: no total known
        bar.advance(3)
        assert shown.getvalue().split("\r")[-1].startswith("fit: the largest batch size: 3 (")
    monkeypatch.setenv("NO_COLOR", "1")
    hidden = _Terminal()
    with Progress("fit", stream=hidden) as bar:
        bar.total(5)
        bar.advance(5)
    assert hidden.getvalue() == ""


def test_a_failed_configuration_is_listed_with_its_error():
    result = sweep(SMALL, {"device": ["cpu", "a100-40gb"]},
                   target_options=TargetOptions(alloc_conf="expandable_segments:True"))
    assert [row.status for row in result.rows] == ["failed", "estimated"]
    assert "only with a GPU --device" in result.rows[0].error and result.to_dict()["failed"] == 1
    assert "device cpu failed: --device: expected" in str(result)  # the row that failed, and why


@pytest.mark.heavy
def test_margin_with_devices_and_warnings_elsewhere(tmp_path, capsys):
    code, out, err = run(["compare", SMALL, WIDER, "--devices", "a100-40gb", "--margin", "0.5", "--format", "json"],
                         capsys)
    assert code == 0 and "warning" not in err, err
    (device,) = json.loads(out)["devices"]
    assert device["margin"] == 0.5 and device["budget_bytes"] == device["capacity_bytes"] // 2
    code, _, err = run(["compare", SMALL, WIDER, "--margin", "0.5"], capsys)  # no --devices: nothing to keep
    assert code == 0 and "warning: --margin: ignored" in err
    setup = tmp_path / "shared.toml"  # a file shared with estimate may hold compare's keys: warned, not used
    setup.write_text('sweep = ["batch=1,2"]\ndevices = "a100-40gb"\n')
    code, _, err = run(["estimate", SMALL, "--setup", str(setup), "--quiet"], capsys)
    assert code == 0 and f"warning: {setup}: sweep: ignored: only trainmem compare sweeps" in err
    assert f"warning: {setup}: devices: ignored" in err


def test_a_device_that_cannot_run_a_configuration_leaves_the_row_and_the_other_devices():
    """bf16-mixed on a T4 (compute capability 7.5) is refused by the setup's own rules: that one cell says
    n/a with the reason, the configuration's figures and the A100's answer stand."""
    result = sweep(SMALL, {"precision": ["bf16-mixed"]}, device="a100-40gb", devices="a100-40gb,t4")
    (row,) = result.rows
    assert row.status != "failed" and row.estimate is not None
    assert row.largest["a100-40gb"].best is not None and not row.largest["a100-40gb"].error
    assert row.largest["t4"].text() == "n/a" and "compute capability" in row.largest["t4"].error
    assert "n/a: " in str(result) and "t4" in str(result)
    assert "error" in result.to_dict()["rows"][0]["largest_batch"]["t4"]
