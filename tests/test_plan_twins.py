"""What the planner shares between layouts. A ZeRO-3 layout that makes exactly FSDP's fully_shard calls (parallel/zero.py traces_as_fsdp) is traced once for
both by the planner (plan/tracer.py traced_as). The claim is held to the traces themselves: where the check says
twins, the two ranks' traces are equal event for event; where it does not, they differ. And the traces of one plan job share a fake world (parallel/world.py kept_worlds):
traced there, a rank's events are those a fresh world gives."""

from __future__ import annotations

import json

import pytest

from trainmem.setup import TrainingSetup

# A Llama of 8 blocks of 184,576 parameters each: above ZeRO-3's persistence threshold (100,000 elements), so under
# bf16-mixed every block is a unit of its own; with a prefetch bucket of 200,000 elements ZeRO-3 prefetches one
# unit, as FSDP does. In fp32 its 128-element norm weights stay whole on every rank (ignored_params): not twins.
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128,
         "intermediate_size": 352, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 8,
         "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
BUCKET = 200_000
ASKED = {"seq_len": 64, "optimizer": "adamw", "zero3_prefetch_bucket": BUCKET}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("twin_llama") / "config.json"
    path.write_text(json.dumps(LLAMA))
    return f"hf:{path}"


def _rank_trace(model_ref: str, strategy: str, precision: str, bucket: int = BUCKET, **more):
    from trainmem.estimate.orchestrate import prepare
    from trainmem.estimate.per_rank import trace_role
    from trainmem.parallel.rank_trace import build_on_meta
    from trainmem.parallel.roles import rank_roles
    from trainmem.parallel.zero import traces_as_fsdp

    setup = TrainingSetup.from_mapping({**ASKED, "batch_size": 2, "precision": precision, "strategy": strategy,
                                        "dp": 4, "zero3_prefetch_bucket": bucket, **more})
    chosen = prepare(model_ref, setup, "h100-80gb", 1)
    model = build_on_meta(chosen.source, setup)[0]
    twin = traces_as_fsdp(model, setup.parallel, setup)
    return twin, trace_role(chosen, setup, rank_roles(setup.parallel, model)[0]).trace


@pytest.mark.heavy
@pytest.mark.parametrize("precision, bucket, pp, twins", [("bf16-mixed", BUCKET, 1, True), ("fp32", BUCKET, 1, False),
                                                          ("bf16-mixed", 50_000_000, 1, False),
                                                          ("bf16-mixed", BUCKET, 2, True)])
def test_twins_trace_the_same_events_and_others_do_not(llama, precision, bucket, pp, twins):
    """bf16-mixed with the small bucket: twins, equal traces (with 2 pipeline stages too: each stage a root of its
    own; the first stage's rank traced). fp32 (norm weights kept whole) and DeepSpeed's default bucket (50 M
    elements: ZeRO-3 prefetches every unit ahead): not twins, and the traces differ."""
    from trainmem.trace.block_check import first_difference

    said, zero3 = _rank_trace(llama, "zero3", precision, bucket, pp=pp)
    _, fsdp = _rank_trace(llama, "fsdp", precision, bucket, pp=pp)
    assert said == twins
    assert (first_difference(zero3, fsdp) is None) == twins


@pytest.mark.heavy
def test_the_planner_traces_twins_once_with_the_same_rows(llama):
    from trainmem.plan import plan

    asked = dict(micro_batches="2", precisions="bf16-mixed", checkpointing="off", offloads="none", tps="1", pps="1",
                 jobs=1, **ASKED)
    both = plan(llama, "4xh100-80gb", strategies="fsdp,zero3", **asked)
    alone = plan(llama, "4xh100-80gb", strategies="fsdp", **asked)
    rows = {str(row.candidate.kind): row for row in both.rows}
    assert both.traces == alone.traces == 2  # blocks 3 and 4, for FSDP only
    assert rows["zero3"].peak_bytes == rows["fsdp"].peak_bytes == alone.rows[0].peak_bytes
    assert "traced as fsdp" in rows["zero3"].why and "traced as fsdp" not in rows["fsdp"].why


@pytest.mark.heavy
def test_traces_in_a_kept_world_equal_fresh_ones(llama):
    """FSDP with tensor parallelism (DTensor ops in forward, backward and the optimizer), checkpointing off then
    on, then off again: the sharding decisions the kept world carries over change no event."""
    from trainmem.parallel.world import kept_worlds
    from trainmem.trace.block_check import first_difference

    asked = [{"tp": 2, "checkpointing": on} for on in (False, True, False)]
    fresh = [_rank_trace(llama, "fsdp", "bf16-mixed", **more)[1] for more in asked[:2]]
    with kept_worlds():
        kept = [_rank_trace(llama, "fsdp", "bf16-mixed", **more)[1] for more in asked]
    assert [first_difference(k, f) for k, f in zip(kept, fresh + fresh[:1])] == [None, None, None]


@pytest.mark.heavy
def test_pipeline_traces_do_not_depend_on_what_the_process_traced_before(llama):
    """torch.distributed.pipelining makes a tensor when it is imported (microbatch.py's sum_reducer). Imported inside
    the first pipeline trace of a process, that tensor was a fake one of that trace, and the pipeline ranks of later
    traces differed by a 4-byte lift_fresh in their inputs (the ZeRO-3 twin above then differed from FSDP's). Now
    imported before any step is recorded (pp.py on_meta): in a fresh process, the three traces are one."""
    import subprocess
    import sys

    script = ("import sys; sys.path.insert(0, 'tests')\n"
              "from test_plan_twins import _rank_trace\n"
              "from trainmem.trace.block_check import first_difference\n"
              f"traces = [_rank_trace({llama!r}, kind, 'bf16-mixed', pp=2)[1] for kind in ('fsdp', 'zero3', 'fsdp')]\n"
              "print('differences:', [first_difference(other, traces[0]) for other in traces[1:]])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "differences: [None, None]" in done.stdout, done.stdout + done.stderr[-2000:]
