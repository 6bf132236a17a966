"""Per-rank estimates, checked by hand: DDP keeps the single process's model states and adds its gradient bucket;
FSDP2 at world 4 keeps a quarter of them, in FSDP2's padded dim-0 chunks; the JSON lists every role and its
top-level figures are the most loaded role's.

The model is mlp:64-256-256-10: Linear(64, 256), ReLU, Linear(256, 256), ReLU, Linear(256, 10), fp32, Adam.
"""

from __future__ import annotations

import json

import pytest

import trainmem

MODEL = "mlp:64-256-256-10"
SHAPES = [(256, 64), (256,), (256, 256), (256,), (10, 256), (10,)]
PARAMETER_BYTES = 4 * sum(rows * (cols[0] if cols else 1) for rows, *cols in SHAPES)  # 85,002 x 4 = 340,008


def _shard_bytes(dp_index: int, dp: int, padded: bool) -> int:
    """FSDP2's dim-0 chunk of each parameter (torch.chunk: ceil(rows / dp) rows per rank, the last ones shorter or
    empty); the sharded storage is padded to the first chunk's size on every rank (_fsdp_param.py
    padded_sharded_param), the local tensor (what Adam's state copies) is not."""
    total = 0
    for rows, *cols in SHAPES:
        per = -(-rows // dp)
        mine = per if padded else max(0, min(per, rows - dp_index * per))
        total += 4 * mine * (cols[0] if cols else 1)
    return total


@pytest.fixture(scope="module")
def single():
    return trainmem.estimate(MODEL, batch_size=8)


@pytest.fixture(scope="module")
def ddp():
    return trainmem.estimate(MODEL, batch_size=8, strategy="ddp", world_size=4)


@pytest.fixture(scope="module")
def fsdp():
    return trainmem.estimate(MODEL, batch_size=8, strategy="fsdp", world_size=4)


def test_ddp_keeps_the_single_process_model_states_and_one_bucket(single, ddp):
    assert PARAMETER_BYTES == 340_008
    for key in ("parameters", "gradients", "optimizer_state"):
        assert ddp.breakdown[key] == single.breakdown[key], key
    assert ddp.breakdown["optimizer_state"] == 2 * PARAMETER_BYTES
    # DDP's default buckets (25 MiB, the first 1 MiB) hold all 340,008 B in one bucket; the Reducer's constructor
    # also keeps a 4-element int32 tensor (16 B, reducer.cpp's bookkeeping, recorded in DDP's construction)
    assert ddp.breakdown["communication"] == PARAMETER_BYTES + 16
    assert [row.label for row in ddp.ranks] == ["all ranks"] and ddp.ranks[0].ranks == (0, 1, 2, 3)


@pytest.mark.heavy
def test_fsdp_holds_a_quarter_in_padded_chunks(fsdp):
    from trainmem.estimate.orchestrate import prepare, setup_of
    from trainmem.estimate.per_rank import trace_role
    from trainmem.parallel.roles import rank_roles
    from trainmem.parallel.rank_trace import build_on_meta
    from trainmem.trace.events import Category, Phase

    # ranks 0-2 hold full chunks; rank 3 holds 1 row of the 10-row layer: two roles
    assert [(row.label, row.ranks) for row in fsdp.ranks] == [("dp indices 0-2", (0, 1, 2)), ("dp index 3", (3,))]
    for row, index in zip(fsdp.ranks, (0, 3)):
        assert row.breakdown["optimizer_state"] == 2 * _shard_bytes(index, 4, padded=False)  # Adam's two moments
    assert _shard_bytes(0, 4, padded=False) == 85_516 and _shard_bytes(3, 4, padded=False) == 83_460
    setup = setup_of(None, {"batch_size": 8, "strategy": "fsdp", "world_size": 4}, "test")
    chosen = prepare(MODEL, setup)
    role = rank_roles(setup.parallel, build_on_meta(chosen.source, setup)[0])[0]
    traced = trace_role(chosen, setup, role)
    sharded = sum(r.nbytes for r in traced.trace.storages.values()
                  if r.category == Category.PARAMETERS and r.phase == Phase.INIT)
    assert sharded == _shard_bytes(0, 4, padded=True) == 85_516  # about a quarter of 340,008
    # unsharded parameters are freed and re-made by storage resizes, each as large as the all-gathered padded chunks
    # (4 ranks x ceil(rows / 4) rows: the 10-row layer's storage has 12 rows)
    unsharded = [r for r in traced.trace.storages.values() if r.op == "resize_" and r.category == Category.PARAMETERS]
    padded = {4 * 4 * -(-rows // 4) * (cols[0] if cols else 1) for rows, *cols in SHAPES}
    assert padded == {65_536, 1_024, 262_144, 12_288, 48}
    assert unsharded and {r.nbytes for r in unsharded} == padded
    # on the CPU the peak is gloo's reduce-scatter of the 256x256 layer: FSDP's flat input (4 ranks x 64 rows x
    # (256 weight + 1 bias) x 4 B) is in communication, and gloo clones it below the dispatcher (targets/gloo.py)
    flat_input = 4 * 64 * (256 + 1) * 4
    # (the op is attributed to the layer, module "2", under torch 2.8-2.13; under 2.15, whose FSDP2 issues it
    # later, to module "1", the ReLU whose backward runs then: same sizes, same breakdown of communication)
    assert fsdp.peak_op == "_reduce_scatter_base_" and fsdp.peak_module in ("2", "1")
    assert fsdp.breakdown["communication"] >= flat_input + flat_input // 4  # the input and this rank's output
    assert fsdp.breakdown["runtime"] >= flat_input


def test_json_lists_roles_and_the_top_level_is_the_most_loaded(fsdp):
    data = json.loads(json.dumps(fsdp.to_dict()))
    assert [row["label"] for row in data["ranks"]] == ["dp indices 0-2", "dp index 3"]
    top = max(data["ranks"], key=lambda row: row["peak"]["process_bytes"])
    assert data["peak"]["process_bytes"] == top["peak"]["process_bytes"]
    assert data["peak"] == top["peak"] and data["breakdown"] == top["breakdown"]
    assert data["parallel"]["most_loaded"]["label"] == top["label"]
    assert data["parallel"]["layout"]["dp"] == 4 and data["parallel"]["cross_checks"]
    figures = [row["peak"]["process_bytes"] for row in data["ranks"]]
    spread = max(figures) - min(figures)
    assert data["parallel"]["spread_bytes"] == spread
    assert all(isinstance(v, int) for row in data["ranks"] for v in row["breakdown"].values())


def test_text_report_has_the_per_rank_section(fsdp, single):
    text = str(fsdp)
    assert "Per rank — fsdp: 4 ranks (dp 4)" in text and "◀ most loaded" in text and "spread between roles" in text
    assert "Per rank" not in str(single)


def test_offloaded_optimizer_state_is_host_ram_not_device_memory():
    est = trainmem.estimate(MODEL, batch_size=8, strategy="fsdp", world_size=4, offload="optimizer", device="h100-80gb")
    assert est.breakdown["optimizer_state"] == 0  # the CUDA target leaves host-resident storages out
    for row, index in zip(est.ranks, (0, 3)):
        shard = _shard_bytes(index, 4, padded=False)
        # host peak: Adam's two moments, plus the foreach step's sqrt of every second moment alive at once
        # (torch/optim/adam.py _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)),
        # plus six fp32 step counters
        assert row.host_bytes == 2 * shard + shard + 6 * 4
    assert est.parallel["host_bytes_per_node"] == 3 * est.ranks[0].host_bytes + est.ranks[1].host_bytes
