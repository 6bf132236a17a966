"""Hand-computed values of the published formulas (trainmem.parallel.analytic) and of NCCL's per-process buffers
(trainmem.targets.nccl). No trace: these run in well under a second."""

from __future__ import annotations

import pytest

from trainmem.devices import get_device
from trainmem.parallel.analytic import (activation_bytes_per_layer, cross_checks, deepspeed_zero2_model_states,
                                        deepspeed_zero3_model_states, megatron_activation_bytes, zero_model_states)
from trainmem.setup.layout import ParallelLayout
from trainmem.targets.nccl import FIRST_COMM_BYTES, RECV_BYTES, nccl_process_bytes

MIB = 1 << 20


def test_zero_figure_1_values():
    # ZeRO (arXiv 1910.02054) Figure 1: Ψ = 7.5B, N = 64, K = 12: baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB,
    # P_os+g+p 1.9 GB (16Ψ/N = 1.875 GB).
    psi = 7_500_000_000
    assert zero_model_states(psi, 64, 0) == 120_000_000_000
    assert zero_model_states(psi, 64, 1) == 30_000_000_000 + 1_406_250_000  # 4Ψ + 12Ψ/64
    assert zero_model_states(psi, 64, 2) == 15_000_000_000 + 1_640_625_000  # 2Ψ + 14Ψ/64
    assert zero_model_states(psi, 64, 3) == 1_875_000_000  # 16Ψ/64
    assert round(zero_model_states(psi, 64, 1) / 1e9, 1) == 31.4
    assert round(zero_model_states(psi, 64, 2) / 1e9, 1) == 16.6


def test_zero_refuses_a_bad_stage():
    with pytest.raises(ValueError, match="expected stage 0-3"):
        zero_model_states(10, 2, 4)


def test_deepspeed_zero3_matches_its_printed_table_for_t5_small():
    # estimate_zero3_model_states_mem_needs_all_live(t5-small, 1 GPU) prints (GB = 2**30 B, two decimals):
    # 1.52|0.06 (offload both), 1.35|0.17 (offload optimizer), 0.09|1.08 (none, zero_init=1), 0.34|1.08 (zero_init=0).
    # t5-small: 60,506,624 parameters, largest layer the 32,128 x 512 shared embedding.
    total, largest = 60_506_624, 32_128 * 512
    gib = lambda n: round(n / 2**30, 2)  # noqa: E731
    cpu, gpu, _ = deepspeed_zero3_model_states(total, largest, cpu_offload=True, cpu_offload_params=True)
    assert (gib(cpu), gib(gpu)) == (1.52, 0.06)
    cpu, gpu, _ = deepspeed_zero3_model_states(total, largest, cpu_offload=True, cpu_offload_params=False)
    assert (gib(cpu), gib(gpu)) == (1.35, 0.17)
    cpu, gpu, layer = deepspeed_zero3_model_states(total, largest, cpu_offload=False, cpu_offload_params=False)
    assert (gib(cpu), gib(gpu), layer) == (0.09, 1.08, 4 * largest)
    cpu, _, _ = deepspeed_zero3_model_states(total, largest, cpu_offload=False, cpu_offload_params=False,
                                             zero_init=False)
    assert gib(cpu) == 0.34


def test_deepspeed_zero2_arithmetic():
    # stage_1_and_2.py: no offload 2Ψ + int(18Ψ/N); offload 2Ψ on the GPU, Ψ·max(4N, 16)·1.5 on the CPU.
    assert deepspeed_zero2_model_states(1_000_000, 8, 1, cpu_offload=False) == (48_000_000, 2_000_000 + 2_250_000)
    assert deepspeed_zero2_model_states(1_000_000, 8, 2, cpu_offload=True) == (96_000_000, 2_000_000)


def test_korthikanti_table_2_for_gpt3_175b():
    # GPT-3 175B as the paper configures it: a = 96, h = 12,288, s = 2,048, t = 8, micro-batch 1.
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert activation_bytes_per_layer(s, b, h, a) == sbh * 34 + 5 * a * s * s * b  # sbh(34 + 5as/h)
    assert activation_bytes_per_layer(s, b, h, a, t=t) == sbh * 10 + sbh * 24 // t + 5 * a * s * s * b // t
    assert activation_bytes_per_layer(s, b, h, a, t=t, sequence_parallel=True) == (sbh * 34 + 5 * a * s * s * b) // t
    assert activation_bytes_per_layer(s, b, h, a, t=t, sequence_parallel=True, recompute="selective") \
        == sbh * 34 // t == 106_954_752
    assert activation_bytes_per_layer(s, b, h, a, t=t, recompute="full") == 2 * sbh
    assert activation_bytes_per_layer(s, b, h, a, t=t, sequence_parallel=True, recompute="full") == 2 * sbh // t


def test_megatron_input_output_terms():
    # p = 1: L·per_layer + 8sb + sbh + 4sbh(1 + v/h), all / t.
    s, b, h, v, layers = 16, 2, 8, 100, 3
    per_layer = activation_bytes_per_layer(s, b, h, 1, recompute="selective", sequence_parallel=True)
    expected = layers * per_layer + 8 * s * b + s * b * h + 4 * s * b * h + 4 * s * b * v
    assert megatron_activation_bytes(s, b, h, layers, v, per_layer=per_layer) == expected


def _estimate_dict(params: int, breakdown: dict, **setup) -> dict:
    return {"model": {"parameters": params}, "breakdown": breakdown,
            "setup": {"precision": "bf16-mixed", "optimizer": "adamw", "batch_size": 2, "checkpointing": False,
                      **setup}}


def test_cross_checks_for_fsdp_name_each_formula_and_its_traced_figure():
    est = _estimate_dict(8_000_000, {"parameters": 4_000_000, "gradients": 4_000_000, "optimizer_state": 8_000_000,
                                     "activations": 123})
    config = {"seq_len": 128, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 1000, "largest_layer_params": 64_000}
    checks = cross_checks(est, ParallelLayout(strategy="fsdp", world_size=8), config)
    names = [c.name for c in checks]
    assert names[0].startswith("ZeRO") and "zero3" in names[1] and names[2].startswith("Activations")
    assert checks[0].formula_bytes == 16 * 8_000_000 // 8 and checks[0].traced_bytes == 16_000_000
    assert "fp32 parameters" in checks[0].explanation  # bf16-mixed: no master copy, said so
    assert checks[2].traced_bytes == 123 and checks[2].formula_bytes > 0


def test_cross_checks_without_model_config_keep_the_model_state_checks():
    est = _estimate_dict(1000, {"parameters": 4000})
    checks = cross_checks(est, ParallelLayout(strategy="ddp", world_size=2), None)
    assert [c.name.split()[0] for c in checks] == ["ZeRO"] and checks[0].formula_bytes == 16_000


def test_nccl_fsdp_8_h100_one_communicator_with_nvls():
    size, text = nccl_process_bytes(ParallelLayout(strategy="fsdp", world_size=8), 0, get_device("h100-80gb"))
    ring_tree = 32 * 2 * (RECV_BYTES + 2 * MIB)  # 32 channels x (ring + tree) x (10 MiB + 2 MiB)
    assert RECV_BYTES == 10 * MIB
    assert FIRST_COMM_BYTES == 180 * MIB  # measured once a process (benchmarks/data/nccl_memory_h200.json)
    assert size == FIRST_COMM_BYTES + ring_tree + 16 * 2 * MIB * 8  # + NVLS: 16 channels x 2 x 1 MiB x 8 GPUs
    assert "NCCL_BUFFSIZE" in text and "dp (8 ranks, NVLS)" in text


def test_nccl_3d_layout_counts_tp_dp_world_and_pipeline_peers():
    layout = ParallelLayout(dp=8, tp=8, pp=8)  # torchtitan's 405B layout, 8 GPUs a node
    size, text = nccl_process_bytes(layout, 0, get_device("a100-80gb"))  # no NVLS before Hopper
    assert size == 180 * MIB + 3 * 32 * 2 * 12 * MIB + 2 * 32 * 14 * MIB
    assert "pp send/recv (2 peers)" in text


def test_nccl_is_zero_on_the_cpu_and_for_one_rank():
    assert nccl_process_bytes(ParallelLayout(strategy="ddp", world_size=2), 0, get_device("cpu"))[0] == 0
    assert nccl_process_bytes(ParallelLayout(), 0, get_device("h100-80gb"))[0] == 0


def test_cross_checks_move_offloaded_states_off_the_gpu():
    est = _estimate_dict(8_000_000, {"parameters": 0})
    optimizer = cross_checks(est, ParallelLayout(strategy="fsdp", world_size=8, offload="optimizer"), None)[0]
    params = cross_checks(est, ParallelLayout(strategy="fsdp", world_size=8, offload="params"), None)[0]
    assert optimizer.formula_bytes == 4 * 8_000_000 // 8 and "ZeRO-Offload" in optimizer.explanation
    assert params.formula_bytes == 0
