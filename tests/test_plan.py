"""trainmem plan: --gpus parsing, the enumeration's rules, the model-state floor by hand, the reuse arithmetic,
and the planner's figures against full estimates of the same layouts (never below, within a stated tolerance)."""

from __future__ import annotations

import io
import json

import pytest

from trainmem.errors import SetupError
from trainmem.setup.layout import Offload, Strategy
from trainmem.plan import enumerate as layouts
from trainmem.plan.gpus import parse_gpus
from trainmem.plan.reuse import MiB, Figures, extrapolate, over_dp
from trainmem.plan.states import model_state_floor
from trainmem.setup import Precision, TrainingSetup

# A Llama of 8 blocks, small enough that a full estimate takes seconds: the planner traces 3 and 4 of its blocks
# and extrapolates to 8.
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 8,
              "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
# The planner's figure may exceed the full estimate's by its rounding up to MiB (one per category and phase it
# sums) and the steeper of two slopes; measured +1.2% to +2.8% on TINY_LLAMA (seq 64, AdamW, h100-80gb).
ABOVE_TOLERANCE = 0.05


@pytest.mark.parametrize("text, count, device", [("8xh100-80gb", 8, "h100-80gb"), ("1024 x H100-80GB", 1024, "h100-80gb"),
                                                 ("2×a100-40gb", 2, "a100-40gb")])
def test_gpus_parse(text, count, device):
    gpus = parse_gpus(text)
    assert (gpus.count, gpus.device.name) == (count, device)


@pytest.mark.parametrize("text", ["h100-80gb", "8", "0xh100-80gb", "8xcpu", "8xnot-a-gpu", "-8xh100-80gb", 8, None])
def test_gpus_refused_in_one_line(text):
    with pytest.raises(SetupError) as caught:
        parse_gpus(text)
    assert caught.value.where == "--gpus" and "\n" not in str(caught.value)


def test_enumeration_rules():
    found = layouts.candidates(16, 8, blocks=4)
    assert found and all(c.dp * c.tp * c.pp == 16 for c in found)
    assert {c.tp for c in found} == {1, 2, 4, 8}  # divisors of a node's 8 GPUs, never 16
    assert max(c.pp for c in found) == 4  # at most the blocks
    assert all(c.offload == Offload.NONE for c in found if c.kind in (Strategy.DDP, Strategy.NONE))
    # parameters move to host RAM only under ZeRO-3 and the FSDPs (DeepSpeed's offload_param is stage 3's)
    assert {c.kind for c in found if c.offload == Offload.PARAMS} == {Strategy.FSDP, Strategy.HSDP, Strategy.ZERO3}
    assert {Strategy.ZERO1, Strategy.ZERO2} <= {c.kind for c in found if c.offload == Offload.OPTIMIZER}
    assert all(c.kind == Strategy.NONE for c in found if c.dp == 1)
    # HSDP only where the data-parallel ranks span nodes: dp 16 with tp 1 (shard 8 < 16), not dp 2 with tp 8
    assert any(c.kind == Strategy.HSDP and c.dp == 16 for c in found)
    assert not any(c.kind == Strategy.HSDP and c.tp * c.dp <= 8 for c in found)
    per_layout = len(layouts.DEFAULT_MICRO_BATCHES) * 2 * len(layouts.DEFAULT_PRECISIONS)
    assert len(found) % per_layout == 0
    assert found[0].layout(8).world_size == 16
    # DDP's replicas (ddp, zero1) hold plain tensors, never tensor-parallel shards: parallel/ddp.py refuses them
    assert not any(c.kind in (Strategy.DDP, Strategy.ZERO1) and c.tp > 1 for c in found)
    assert any(c.kind == Strategy.ZERO2 and c.tp > 1 for c in found)


def test_model_state_floor_by_hand():
    adam = TrainingSetup.from_mapping({"optimizer": "adam"})
    fsdp = layouts.Candidate(Strategy.FSDP, 4, 1, 1, 1, False, "fp32", Offload.NONE).layout(8)
    # fp32 weights, gradients and Adam's two moments, each sharded over 4 ranks: 250 elements x (4 + 4 + 8) bytes
    assert model_state_floor(1000, fsdp, adam) == 250 * 16
    ddp = layouts.Candidate(Strategy.DDP, 4, 1, 1, 1, False, "fp32", Offload.NONE).layout(8)
    assert model_state_floor(1000, ddp, adam) == 1000 * 16
    zero1 = layouts.Candidate(Strategy.ZERO1, 4, 1, 1, 1, False, "fp32", Offload.NONE).layout(8)
    assert model_state_floor(1000, zero1, adam) == 1000 * 8 + 250 * 8
    tp_pp = layouts.Candidate(Strategy.ZERO2, 2, 2, 2, 1, False, "fp32", Offload.OPTIMIZER).layout(8)
    assert model_state_floor(1000, tp_pp, adam) == 250 * 4 + 125 * 4  # optimizer state in host RAM


def _figures(params: int, acts: int, temps: int, process_extra: int = 0) -> Figures:
    maxima = {("forward", "parameters"): params, ("forward", "activations"): acts,
              ("optimizer", "parameters"): params, ("optimizer", "temporaries"): temps}
    allocated = max(params + acts, params + temps)
    return Figures(maxima, allocated, allocated + process_extra)


def test_blocks_extrapolation_is_the_line_rounded_up():
    points = [(k, _figures(10 * MiB * k + 5, 3 * MiB * k, MiB, 100 * MiB)) for k in (1, 2, 3)]
    at_80 = extrapolate(points, 80, "blocks")
    assert at_80.maxima[("forward", "parameters")] == 800 * MiB + MiB  # 800 MiB + 5 bytes, rounded up to MiB
    assert at_80.maxima[("forward", "activations")] == 240 * MiB
    assert at_80.bound()[:2] == (1041 * MiB, "forward")
    assert at_80.peak() == at_80.bound()[0] + 100 * MiB  # the process overhead stays
    assert not at_80.not_affine


def test_blocks_extrapolation_takes_the_last_step_and_says_so():
    # FSDP's prefetch: one unsharded block with 1 block, two from 2 blocks on; the last step is the steady one
    points = [(1, _figures(10 * MiB, MiB, MiB)), (2, _figures(20 * MiB, MiB, MiB)), (3, _figures(20 * MiB, MiB, MiB))]
    at_80 = extrapolate(points, 80, "blocks")
    assert at_80.maxima[("forward", "parameters")] == 20 * MiB
    assert "blocks: parameters in forward" in at_80.not_affine
    growing = [(1, _figures(10 * MiB, MiB, MiB)), (2, _figures(20 * MiB, MiB, MiB)), (3, _figures(40 * MiB, MiB, MiB))]
    assert extrapolate(growing, 5, "blocks").maxima[("forward", "parameters")] == 80 * MiB  # 40 + 2 x 20


def test_dp_extrapolation_is_a_line_in_one_over_dp_plus_padding():
    # sharded 64 MiB at dp 2, 32 MiB at dp 4: U + W/dp with U = 0, W = 128 MiB; dp 64 -> 2 MiB + padding
    points = [(2, _figures(64 * MiB, 8 * MiB, 0)), (4, _figures(32 * MiB, 8 * MiB, 0))]
    at_64 = over_dp(points, 64, padding_bytes=3 * MiB)
    assert at_64.maxima[("optimizer", "parameters")] == at_64.maxima[("forward", "parameters")] == 2 * MiB
    assert at_64.maxima[("forward", "activations")] == 8 * MiB + 3 * MiB  # the padding, in the peak's phase
    assert at_64.bound()[0] == 2 * MiB + 8 * MiB + 3 * MiB
    assert over_dp(points, 4, 3 * MiB) is points[1][1]  # a traced degree is its own figure


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return f"hf:{path}"


@pytest.mark.heavy
@pytest.mark.parametrize("checkpointing, micro_batches", [("off", (2, 4, 8)), ("on", (2,))])
def test_planner_never_below_a_full_estimate(tiny_llama, checkpointing, micro_batches):
    """Blocks 3 and 4 traced and extrapolated to 8; without checkpointing micro-batch 8 is predicted from the
    traces at 2 and 4 (batch 1 traces another stream here), checked by a real trace of 3 blocks."""
    from trainmem.estimate import estimate
    from trainmem.plan import plan

    setup = {"seq_len": 64, "optimizer": "adamw"}
    result = plan(tiny_llama, "1xh100-80gb", micro_batches=micro_batches, precisions="bf16-mixed",
                  checkpointing=checkpointing, **setup)
    assert all(row.status == "fits" for row in result.rows)
    assert (result.traces, result.predicted) == ((5, 1) if len(micro_batches) == 3 else (2, 0))
    for row in result.rows[::2]:  # micro-batch 2 (traced) and 8 (predicted)
        full = estimate(tiny_llama, device="h100-80gb", batch_size=row.candidate.micro_batch, precision="bf16-mixed",
                        checkpointing=checkpointing == "on", **setup)
        assert full.process_bytes_high <= row.peak_bytes <= full.process_bytes_high * (1 + ABOVE_TOLERANCE)


def _cli(argv: list[str]):
    from trainmem import cli
    from trainmem.cli.commands import plan as plan_command
    from trainmem.cli.parser import Parser

    parser = Parser(prog="trainmem")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    plan_command.add(commands, None)
    args = parser.parse_args(["plan", *argv])
    options = cli.merge_options(args, cli.option_keys(parser)).with_values(model=args.model)
    return plan_command.run(options, cli.setup_from_options(options))


def test_cli_json_and_exit_code():
    outcome = _cli(["mlp:100-10", "--input-shape", "100", "--gpus", "1xh100-80gb", "--batch-size", "4",
                    "--precision", "fp32", "--format", "json"])
    data = json.loads(outcome.text)
    assert outcome.code == 0 and data["counts"] == {"fits": 2, "skipped": 2} or data["counts"]["fits"] >= 1
    first = data["fits"][0]
    assert first["layout"]["micro_batch"] == 4 and first["layout"]["precision"] == "fp32"
    assert first["peak_bytes"] > 0 and first["headroom_bytes"] == data["gpus"]["capacity_bytes"] - first["peak_bytes"]


@pytest.mark.parametrize("argv, where", [(["--gpus", "eightxh100"], "--gpus"), ([], "--gpus"),
                                         (["--gpus", "8xh100-80gb", "--device", "h100-80gb"], "--device"),
                                         (["--gpus", "8xh100-80gb", "--strategy", "fsdp"], "--strategy"),
                                         (["--gpus", "8xh100-80gb", "--strategies", "tp"], "--strategies"),
                                         (["--gpus", "8xh100-80gb", "--jobs", "0"], "--jobs")])
def test_cli_refusals_name_the_flag(argv, where):
    with pytest.raises(SetupError) as caught:
        _cli(["mlp:100-10", "--input-shape", "100", *argv])
    assert caught.value.where == where


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_terminal(monkeypatch):
    from trainmem.progress import Progress

    quiet = io.StringIO()
    with Progress("planning", stream=quiet) as bar:
        bar.total(3)
        bar.advance(3)
    assert quiet.getvalue() == ""
    shown = _Terminal()
    with Progress("planning", stream=shown) as bar:  # tqdm's bar where it is installed
        bar.total(3)
        assert "planning" in shown.getvalue()
    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)  # without tqdm: one line rewritten in place
    plain = _Terminal()
    with Progress("planning", stream=plain) as bar:
        bar.total(3)
        bar.advance(2)
        assert plain.getvalue().split("\r")[-1].startswith("planning: 2/3")


@pytest.fixture(scope="module")
def uneven_llama(tmp_path_factory):
    """TINY_LLAMA with a vocabulary of 500 rows: over 8 ranks FSDP's chunks are 63 rows on ranks 0-6 and 59 on
    rank 7, so its ranks do not all hold alike shards."""
    path = tmp_path_factory.mktemp("uneven_llama") / "config.json"
    path.write_text(json.dumps({**TINY_LLAMA, "vocab_size": 500}))
    return f"hf:{path}"


@pytest.mark.heavy
@pytest.mark.parametrize("model, traces", [("tiny_llama", 2), ("uneven_llama", 4)])
def test_planner_data_parallel_degree(model, traces, request):
    """FSDP over 8 ranks, against the engine's full per-rank estimate at dp 8 (estimate/per_rank.py). Every rank
    alike (TINY_LLAMA's dimensions divide by 8): traced at dp 8 itself, blocks 3 and 4. Ranks unlike: from traces
    at dp 2 and at dp 4 (each with blocks 3 and 4), a line in 1/dp plus a padded row per parameter."""
    from trainmem.estimate import estimate
    from trainmem.plan import plan

    model = request.getfixturevalue(model)
    setup = {"seq_len": 64, "optimizer": "adamw"}
    result = plan(model, "8xh100-80gb", micro_batches="2", precisions="bf16-mixed", checkpointing="off",
                  strategies="fsdp", offloads="none", tps="1", pps="1", jobs=1, **setup)
    (row,) = result.rows
    assert row.candidate.dp == 8 and result.traces == traces
    full = estimate(model, device="h100-80gb", batch_size=2, precision="bf16-mixed", strategy="fsdp", dp=8,
                    **setup)
    assert row.status == "fits"
    assert full.process_bytes_high <= row.peak_bytes <= full.process_bytes_high * (1 + ABOVE_TOLERANCE)


@pytest.mark.heavy
@pytest.mark.parametrize("strategy, tp, pp", [("zero2", 2, 2), ("ddp", 1, 2), ("fsdp", 2, 1)])
def test_planner_tensor_and_pipeline_layouts(tiny_llama, strategy, tp, pp):
    """Layouts whose ranks differ by tensor-parallel shard and pipeline stage, over 8 GPUs, against the engine's
    full per-rank estimate of the same layout at the model's 8 blocks (every stage traced at its depth). The
    planner's figure is the most loaded rank's, from the model cut to 3 and 4 blocks (benchmarks/plan_vs_full.py
    compares every layout of a larger model: 46 layouts, 0 below, at most +0.88%)."""
    from trainmem.estimate import estimate
    from trainmem.plan import plan

    setup = {"seq_len": 64, "optimizer": "adamw"}
    result = plan(tiny_llama, "8xh100-80gb", micro_batches="2", precisions="bf16-mixed", checkpointing="off",
                  strategies=strategy, offloads="none", tps=str(tp), pps=str(pp), jobs=1, **setup)
    (row,) = result.rows
    dp = 8 // (tp * pp)
    assert (row.candidate.dp, row.candidate.tp, row.candidate.pp, row.status) == (dp, tp, pp, "fits")
    full = estimate(tiny_llama, device="h100-80gb", batch_size=row.candidate.batch_size, precision="bf16-mixed",
                    strategy=strategy, dp=dp, tp=tp, pp=pp, **setup)
    assert full.process_bytes_high <= row.peak_bytes <= full.process_bytes_high * (1 + ABOVE_TOLERANCE)


@pytest.mark.heavy
def test_worker_processes_give_the_rows_one_process_gives():
    """plan --jobs 2 forks two workers, each evaluating whole groups (plan/workers.py): the same rows, in the same
    order, and the traces they ran counted."""
    from trainmem.plan import plan

    asked = {"input_shape": "256", "micro_batches": "1,2", "precisions": "fp32", "checkpointing": "off",
             "strategies": "ddp,fsdp"}
    alone = plan("mlp:256-512-512-10", "4xh100-80gb", jobs=1, **asked)
    forked = plan("mlp:256-512-512-10", "4xh100-80gb", jobs=2, **asked)
    assert [(r.candidate, r.status, r.peak_bytes) for r in forked.rows] == \
        [(r.candidate, r.status, r.peak_bytes) for r in alone.rows]
    assert forked.traces == alone.traces > 0 and forked.predicted == alone.predicted


def test_time_limit_lists_the_rest_as_not_evaluated():
    from trainmem.plan import plan

    result = plan("mlp:100-10", "1xh100-80gb", input_shape="100", time_limit=1e-9)
    assert result.traces == 0 and {row.status for row in result.rows} == {"not evaluated"}
    assert result.best is None and "not evaluated within the time limit" in str(result)


def _probe_order(peak: int, floor: int):
    from trainmem.plan.offload_order import OffloadOrder
    from trainmem.plan.plan_result import PlanRow

    assessed = []

    def assess(candidate):
        assessed.append(candidate)
        return PlanRow(candidate, "does not fit" if peak > 100 * MiB else "fits", peak)

    return OffloadOrder(100 * MiB, 10 * MiB, lambda c: floor, assess), assessed


def _chain(micro_batch: int, checkpointing: bool) -> list:
    return [layouts.Candidate(Strategy.FSDP, 8, 1, 1, micro_batch, checkpointing, "bf16-mixed", offload)
            for offload in Offload]


def test_offload_probe_rules_out_less_offload_and_larger_batches():
    order, assessed = _probe_order(peak=200 * MiB, floor=60 * MiB)  # states take 60% of the budget: probe
    probed = order.probe(_chain(1, False) + _chain(1, True))
    assert [c.offload for c in assessed] == [Offload.PARAMS, Offload.PARAMS]  # the most offload of each chain
    assert all(row.status == "does not fit" for row in probed.values())
    for candidate in _chain(1, False)[:2] + _chain(4, True)[:2]:  # less offload, same or more samples
        row = order.ruled_out(candidate)
        assert row.status == "ruled out" and "offload-params needs 200.00 MiB" in row.why
    assert order.ruled_out(_chain(4, True)[2]) is None  # the probed offload itself is traced at other batches


@pytest.mark.parametrize("peak, floor", [(105 * MiB, 60 * MiB), (200 * MiB, 40 * MiB)])
def test_offload_probe_needs_a_clear_miss_and_heavy_states(peak, floor):
    """Within the slack (105 MiB against 100 + 10) nothing is ruled out; with states under half the budget the
    most offload is not assessed ahead at all (a less intrusive knob probably fits)."""
    order, assessed = _probe_order(peak, floor)
    order.probe(_chain(1, False))
    assert len(assessed) == (1 if floor >= 50 * MiB else 0)
    assert order.ruled_out(_chain(1, False)[0]) is None


@pytest.mark.heavy
def test_a_plan_asked_again_reads_its_traces_from_the_cache(tmp_path, monkeypatch):
    """Rank traces are kept in the trace cache (parallel/rank_cache.py; one process's as trace/run.py keeps them):
    the same plan again traces nothing and gives the same rows."""
    from trainmem.plan import plan
    from trainmem.trace import cache_store

    monkeypatch.setenv("TRAINMEM_CACHE_DIR", str(tmp_path / "cache"))
    asked = {"input_shape": "256", "micro_batches": "1,2", "precisions": "fp32", "checkpointing": "off",
             "strategies": "fsdp", "jobs": 1}
    with cache_store.switched(True):
        first = plan("mlp:256-512-512-10", "2xh100-80gb", **asked)
        again = plan("mlp:256-512-512-10", "2xh100-80gb", **asked)
    assert first.traces == again.traces > 0 and (first.cached, again.cached) == (0, again.traces)
    assert [(r.candidate, r.status, r.peak_bytes) for r in again.rows] == \
        [(r.candidate, r.status, r.peak_bytes) for r in first.rows]
    assert "from the trace cache" in str(again) and again.to_dict()["cached_traces"] == again.traces


def test_workers_yield_in_the_groups_order_and_a_dead_worker_is_an_error():
    import os
    import time as clock

    from trainmem.errors import TraceError
    from trainmem.plan.workers import each_group

    def slow_first(group):
        clock.sleep(0.3 if group == 0 else 0)  # the first group finishes last
        return [group * 10], {"traces": 1}

    seen = []
    rows = list(each_group(slow_first, [0, 1, 2], 2, lambda index, counts, in_worker: seen.append((index, in_worker))))
    assert rows == [[0], [10], [20]] and sorted(seen) == [(0, True), (1, True), (2, True)]

    def dies(group):
        if group == 1:
            os._exit(3)  # as the kernel's OOM killer would end it: no answer, no exception
        return [group], {}

    with pytest.raises(TraceError, match="ended without an answer"):
        list(each_group(dies, [0, 1, 2], 2, lambda *_: None))


@pytest.mark.heavy
def test_jobs_pair_zero3_with_fsdp_and_the_heaviest_are_handed_out_first():
    """core._jobs: a ZeRO-3 group runs with the FSDP group of its degrees, FSDP's first (its traces stand for the
    twin's); core._heaviest_first: pipelines, then tensor parallelism, then more layouts, first; each_group hands
    jobs out in that order and still yields the rows in the jobs' own."""
    import time as clock

    from trainmem.plan import core
    from trainmem.plan.workers import each_group

    def candidate(kind, tp, pp, offload=Offload.NONE):
        return layouts.Candidate(Strategy(kind), 8 // (tp * pp), tp, pp, 1, False, Precision.BF16_MIXED, offload)

    left = [(0, candidate("zero3", 1, 1)), (0, candidate("ddp", 1, 1)), (0, candidate("fsdp", 1, 1)),
            (0, candidate("fsdp", 2, 1)), (0, candidate("fsdp", 1, 2)), (0, candidate("zero3", 1, 2)),
            (0, candidate("fsdp", 2, 1, Offload.OPTIMIZER))]
    order = core._jobs(left)
    kinds = [[[str(c.kind) for c in group] for group in job] for job in order]
    assert [["fsdp"], ["zero3"]] in kinds and [["fsdp"], ["zero3"]] == kinds[[j[0][0].pp for j in order].index(2)]
    first = core._heaviest_first(order)
    assert [(order[i][0][0].pp, order[i][0][0].tp) for i in first] == [(2, 1), (1, 2), (1, 1), (1, 1)]
    assert sum(len(group) for group in order[first[2]]) == 2  # the FSDP + ZeRO-3 job before DDP's single layout

    def job(index):
        clock.sleep(0.3)
        return [index], {}

    finished = []
    rows = list(each_group(job, [0, 1, 2, 3], 2, lambda index, *_: finished.append(index), first=[3, 2, 1, 0]))
    assert rows == [[0], [1], [2], [3]] and set(finished[:2]) == {2, 3}  # two workers took 3 and 2 first


def test_groups_run_here_where_a_forked_child_cannot_run_a_backward(monkeypatch):
    """A CUDA build of torch that ran a backward in this process refuses autograd in forked children (torch 2.15: every
    layout failed when a plan followed an estimate in one process): the groups then run here, with the same rows."""
    import torch

    from trainmem.plan import workers

    if torch.version.cuda is None:  # a CPU build's engine starts no device threads: its children always can
        assert workers.autograd_survives_fork()
    monkeypatch.setattr(workers, "autograd_survives_fork", lambda: False)
    seen = []
    rows = list(workers.each_group(lambda group: ([group * 10], {}), [0, 1, 2], 2,
                                   lambda index, counts, in_worker: seen.append((index, in_worker))))
    assert rows == [[0], [10], [20]] and seen == [(0, False), (1, False), (2, False)]


def test_the_result_says_how_many_workers_traced():
    from trainmem.plan import plan

    result = plan("mlp:100-10", "1xh100-80gb", input_shape="100", micro_batches="1", precisions="fp32",
                  checkpointing="off", jobs=2)
    assert result.to_dict()["jobs"] == 2 and "2 worker processes" in str(result)
    assert plan("mlp:100-10", "1xh100-80gb", input_shape="100", micro_batches="1", precisions="fp32",
                checkpointing="off", jobs=1).to_dict()["jobs"] == 1


def test_a_plan_with_no_layout_to_evaluate_says_so_rather_than_no_fit():
    """Nothing evaluated is no verdict (exit 2, cli/commands/plan.py): the text must not say "No layout fits"."""
    from trainmem.plan.plan_result import PlanResult

    empty = PlanResult("m", 10, parse_gpus("2xh100-80gb"), 8, 1 << 30, 0.05, "default", (), "none", 0, 0.1)
    assert empty.evaluated == 0
    assert "No layout was evaluated" in str(empty) and "No layout fits" not in str(empty)
