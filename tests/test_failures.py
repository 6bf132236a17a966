"""An error is never an answer: when a layout, candidate or configuration fails to evaluate, `plan`, `fit` and
`compare` (configurations, --sweep) list it as failed with its reason and exit 2 when nothing was evaluated;
exit 1 ("does not fit") only when something was evaluated and none of it fits. The evaluation function of each
command is made to fail here (monkeypatched), as it does on a torch that lacks what a strategy needs."""

from __future__ import annotations

import importlib
import json

import pytest

from conftest import skip_where_torch_refuses

from trainmem.cli import main
from trainmem.errors import NothingEvaluated, grouped_failures
from trainmem.setup.layout import Strategy

fitmod = importlib.import_module("trainmem.fit")  # the module (trainmem.fit the attribute is the function)
estimatemod = importlib.import_module("trainmem.estimate")
core = importlib.import_module("trainmem.plan.core")

MISSING = "cannot import name '_clear_sharding_prop_cache' from 'torch.distributed.tensor.debug'"
MLP = "mlp:256-512-512-10"
PLAN = ["plan", MLP, "--input-shape", "256", "--gpus", "2xh100-80gb", "--micro-batches", "1", "--precisions", "fp32",
        "--offloads", "none"]
SMALL, WIDER = "mlp:64-32-8", "mlp:64-128-8"
SMALL_GPU = "custom:capacity=400MiB,cc=8.0,context=287MB"


def run(args, capsys):
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def _raise(*_args, **_kwargs):
    raise ImportError(MISSING)


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("trainmem: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_failures_grouped_by_reason():
    failures = [(f"layout {i}", "ImportError: x") for i in range(12)] + [("fsdp dp2", "TraceError: y")]
    assert grouped_failures(failures, "layouts") == ["12 layouts failed: ImportError: x", "fsdp dp2 failed: TraceError: y"]
    assert grouped_failures(failures[:2], "layouts") == ["2 layouts (layout 0, layout 1) failed: ImportError: x"]
    many = [(str(i), f"reason {i}") for i in range(5)]
    assert grouped_failures(many, "layouts", limit=3)[-1] == "2 more failed for 2 other reasons"


# ---- plan ----

def test_plan_every_layout_failed_is_exit_2_in_one_line(monkeypatch, capsys):
    """torch 2.8 before the probe: every layout raised ImportError and plan answered "No layout fits", exit 1."""
    monkeypatch.setattr(core, "figures_for", _raise)
    code, out, err = run(PLAN, capsys)
    line = _one_error_line(err)
    assert code == 2 and out == ""
    assert line.startswith("trainmem: error: plan: no layout could be evaluated: ") and "layouts failed: ImportError: " + MISSING in line


def test_plan_api_raises_with_every_failure(monkeypatch):
    from trainmem.plan import plan

    monkeypatch.setattr(core, "figures_for", _raise)
    with pytest.raises(NothingEvaluated) as caught:
        plan(MLP, "2xh100-80gb", input_shape="256", micro_batches="1", precisions="fp32", offloads="none")
    assert caught.value.failures and all(why == f"ImportError: {MISSING}" for _, why in caught.value.failures)


def _fsdp_fails(real):
    def figures_for(tracer, candidate):
        if candidate.kind == Strategy.FSDP:
            raise ImportError(MISSING)
        return real(tracer, candidate)
    return figures_for


@pytest.mark.heavy
def test_plan_partly_failed_names_them_and_answers_from_the_rest(monkeypatch, capsys):
    skip_where_torch_refuses("ddp")  # the DDP layouts are the ones that answer
    monkeypatch.setattr(core, "figures_for", _fsdp_fails(core.figures_for))
    code, out, err = run(PLAN, capsys)
    assert code == 0, err  # the other layouts fit
    fitting = out.split("Layouts that fit")[1].splitlines()
    assert fitting and not any(line.startswith("  fsdp") for line in fitting)  # a failure is not a figure
    assert f"2 layouts (fsdp dp2 mb1 fp32, fsdp dp2 mb1 fp32 ckpt) failed: ImportError: {MISSING}" in out
    code, out, _ = run([*PLAN, "--format", "json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["counts"]["failed"] >= 1
    (group,) = data["failures"]
    assert group["reason"] == f"ImportError: {MISSING}" and group["count"] == data["counts"]["failed"]
    assert all(row["status"] == "failed" for row in data["not_fitting"] if row["layout"]["strategy"] == "fsdp")


def test_plan_partly_failed_and_the_rest_does_not_fit_is_exit_1(monkeypatch, capsys):
    from trainmem.plan.reuse import Figures

    huge = 200 * 2**30  # above any card
    too_big = Figures({("forward", "activations"): huge}, huge, huge)

    def figures_for(tracer, candidate):
        if candidate.kind == Strategy.FSDP:
            raise ImportError(MISSING)
        return too_big

    monkeypatch.setattr(core, "figures_for", figures_for)
    code, out, _ = run(PLAN, capsys)
    assert code == 1
    assert "No layout evaluated fits (" in out and "failed, below)" in out and f"failed: ImportError: {MISSING}" in out


def test_plan_result_exposes_failures(monkeypatch):
    skip_where_torch_refuses("ddp")
    from trainmem.plan import plan

    monkeypatch.setattr(core, "figures_for", _fsdp_fails(core.figures_for))
    result = plan(MLP, "2xh100-80gb", input_shape="256", micro_batches="1", precisions="fp32", offloads="none",
                  strategies="ddp,fsdp")
    assert result.failed and all(row.candidate.kind == Strategy.FSDP for row in result.failed)
    assert result.failures[0] == (result.failed[0].candidate.label(), f"ImportError: {MISSING}")
    assert result.evaluated and result.best is not None


# ---- fit ----

def _scaled_estimate_failing(at):
    real = fitmod.ScaledBatches.estimate

    def estimate(self, batch):
        if at(batch):
            raise ImportError(MISSING)
        return real(self, batch)
    return estimate


def test_fit_first_candidate_failed_is_exit_2_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(fitmod.ScaledBatches, "estimate", _scaled_estimate_failing(lambda batch: True))
    code, out, err = run(["fit", "mlp:256-256-10", "--input-shape", "256", "--device", SMALL_GPU], capsys)
    assert code == 2 and out == ""
    assert _one_error_line(err) == ("trainmem: error: fit: no candidate could be evaluated: batch size 1 failed: "
                                    f"ImportError: {MISSING}")
    with pytest.raises(NothingEvaluated) as caught:
        fitmod.fit("mlp:256-256-10", device=SMALL_GPU, input_shape="256")
    assert caught.value.failures == (("batch size 1", f"ImportError: {MISSING}"),)


def test_fit_partly_failed_answers_from_what_was_evaluated(monkeypatch, capsys):
    """The search stops at the candidate that failed: the answer is the largest that fits of those evaluated,
    and the failure is listed (exit 0: something fits)."""
    monkeypatch.setattr(fitmod.ScaledBatches, "estimate", _scaled_estimate_failing(lambda batch: batch >= 4))
    code, out, err = run(["fit", "mlp:256-256-10", "--input-shape", "256", "--device", SMALL_GPU], capsys)
    assert code == 0, err
    assert "Largest batch size that fits: 2" in out and f"batch size        4: failed: ImportError: {MISSING}" in out
    assert "batch size 4 failed to evaluate" in out
    result = fitmod.fit("mlp:256-256-10", device=SMALL_GPU, input_shape="256")
    assert (result.best, result.first_miss) == (2, None) and result.failed == [(4, f"ImportError: {MISSING}")]
    assert result.to_dict()["failed"] == [{"value": 4, "error": f"ImportError: {MISSING}"}]


def test_fit_nothing_fits_and_a_remedy_failed_is_exit_1(monkeypatch, capsys):
    real = fitmod.estimate

    def estimate(model, setup, **kwargs):
        if setup.checkpointing:
            raise ImportError(MISSING)
        return real(model, setup=setup, **kwargs)

    monkeypatch.setattr(fitmod, "estimate", estimate)
    code, out, _ = run(["fit", "mlp:4096-4096-4096", "--input-shape", "4096", "--optimizer", "adam",
                        "--device", "custom:capacity=400MiB,cc=8.0", "--cuda-context", "100MiB"], capsys)
    assert code == 1 and "Even batch size 1 does not fit" in out
    assert f"activation checkpointing (--checkpointing): failed to evaluate — ImportError: {MISSING}" in out
    assert "mixed precision" in out and "8-bit Adam" in out  # the other remedies stand


# ---- compare: configurations and --sweep ----

def _estimate_failing(names):
    real = estimatemod.estimate

    def estimate(model, *args, **kwargs):
        if getattr(model, "name", model) in names:  # a reference, or the ModelSource it resolved to
            raise ImportError(MISSING)
        return real(model, *args, **kwargs)
    return estimate


def test_compare_every_configuration_failed_is_exit_2_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(estimatemod, "estimate", _estimate_failing({SMALL, WIDER}))
    code, out, err = run(["compare", SMALL, WIDER], capsys)
    assert code == 2 and out == ""
    assert _one_error_line(err) == (f"trainmem: error: no configuration could be evaluated: 2 configurations ({SMALL}, "
                                    f"{WIDER}) failed: ImportError: {MISSING}")
    code, _, err = run(["compare", SMALL, "--sweep", "batch=1,2,4,8"], capsys)
    assert code == 2 and "4 configurations (batch 1, batch 2, batch 4 …" not in err
    assert _one_error_line(err).endswith(f"no configuration could be evaluated: 4 configurations failed: "
                                         f"ImportError: {MISSING}")


def test_sweep_api_raises_when_every_configuration_failed(monkeypatch):
    from trainmem.sweep import sweep

    monkeypatch.setattr(estimatemod, "estimate", _estimate_failing({SMALL}))
    with pytest.raises(NothingEvaluated) as caught:
        sweep(SMALL, {"batch_size": [1, 2]})
    assert caught.value.failures == (("batch_size 1", f"ImportError: {MISSING}"), ("batch_size 2", f"ImportError: {MISSING}"))


def test_compare_partly_failed_lists_them_and_exits_per_the_rest(monkeypatch, capsys):
    monkeypatch.setattr(estimatemod, "estimate", _estimate_failing({WIDER}))
    code, out, err = run(["compare", SMALL, WIDER], capsys)
    assert code == 0, err  # SMALL fits the CPU
    assert f"{WIDER} failed: ImportError: {MISSING}" in out
    code, out, _ = run(["compare", SMALL, WIDER, "--format", "json"], capsys)
    data = json.loads(out)
    assert (data["estimated"], data["failed"]) == (1, 1)
    assert data["failures"] == [{"reason": f"ImportError: {MISSING}", "count": 1, "failed": [WIDER]}]


def test_compare_partly_failed_and_the_rest_does_not_fit_is_exit_1(monkeypatch, capsys):
    monkeypatch.setattr(estimatemod, "estimate", _estimate_failing({WIDER}))
    code, out, _ = run(["compare", SMALL, WIDER, "--device", "custom:capacity=1MiB,cc=8.0"], capsys)
    assert code == 1 and f"{WIDER} failed: ImportError: {MISSING}" in out


def test_largest_batch_search_that_fails_part_way_says_so(monkeypatch):
    from trainmem.sweep import sweep

    monkeypatch.setattr(fitmod.ScaledBatches, "estimate", _scaled_estimate_failing(lambda batch: batch >= 4))
    (row,) = sweep(SMALL, {"precision": ["fp32"]}, device="a100-40gb", devices="a100-40gb").rows
    found = row.largest["a100-40gb"]
    assert (found.best, found.text()) == (2, "2+") and found.failed == ((4, f"ImportError: {MISSING}"),)
    monkeypatch.setattr(fitmod.ScaledBatches, "estimate", _scaled_estimate_failing(lambda batch: True))
    (row,) = sweep(SMALL, {"precision": ["fp32"]}, device="a100-40gb", devices="a100-40gb").rows
    found = row.largest["a100-40gb"]
    assert found.text() == "n/a" and "batch size 1 failed: ImportError" in found.error
