"""The CUDA target on a CPU trace: CUDA's autocast lists, attention backend choice, optimizer default,
host-side step counters, cuBLAS workspaces, and the whole estimate against a published measurement."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from trainmem import estimate
from trainmem.trace import cuda_autocast
from trainmem.trace.cuda_autocast import CUDA_POLICY, cuda_autocast_kernels, cuda_autocast_region
from trainmem.trace.cuda_composites import CudaAttention, CudaFacts
from trainmem.trace.torch_private import FakeTensorMode, TorchDispatchMode, ops_with_kernel
from trainmem.setup.target_options import TargetOptions

MB = 10**6


def test_policy_table_matches_the_installed_torch():
    """Every op this torch registers for AutocastCUDA has a policy here, and the table's record of which
    torch registers which op holds for this one (a torch upgrade that moves an op fails here, not in an
    estimate); the policy an estimate applies is exactly the registered ops'."""
    registered = ops_with_kernel("AutocastCUDA")
    assert registered <= set(CUDA_POLICY), sorted(registered - set(CUDA_POLICY))
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    cudnn_build = torch.backends.cudnn.is_available()  # compiled with cuDNN (no GPU needed)
    wrong = sorted(op for op in CUDA_POLICY
                   if cuda_autocast.registered_in(op, release, cudnn_build) not in (None, op in registered))
    assert not wrong, (release, wrong)
    assert set(cuda_autocast.cuda_policy()) == registered


def _under_cuda_autocast(fn, dtype=torch.float16):
    with FakeTensorMode(), cuda_autocast_kernels():
        with cuda_autocast_region(dtype):
            return fn()


def test_cuda_lists_not_cpu_lists():
    """CUDA runs layer_norm, softmax and sum in fp32 where CPU autocast keeps bf16/fp16; matmuls are cast."""
    def run():
        x, lin, ln = torch.empty(4, 8), nn.Linear(8, 8), nn.LayerNorm(8)
        y = lin(x)
        return y.dtype, ln(y).dtype, torch.softmax(y, -1).dtype, y.sum().dtype, torch.cat([y, y]).dtype
    assert _under_cuda_autocast(run) == (torch.float16, torch.float32, torch.float32, torch.float32, torch.float16)


def test_cast_cache_keeps_one_copy_per_parameter():
    def run():
        x, lin = torch.empty(4, 8), nn.Linear(8, 8)
        before = cuda_autocast._STATE.casts
        lin(x), lin(x)
        return cuda_autocast._STATE.casts - before
    assert _under_cuda_autocast(run) == 4  # weight and bias once, the input twice


def test_cpu_autocast_is_restored_afterwards():
    _under_cuda_autocast(lambda: None)
    with FakeTensorMode(), torch.autocast("cpu", dtype=torch.bfloat16):
        x, ln = torch.empty(4, 8, dtype=torch.bfloat16), nn.LayerNorm(8)
        assert ln(x).dtype == torch.bfloat16  # the CPU lists again


def test_binary_cross_entropy_is_refused_as_cuda_does():
    def run():
        return F.binary_cross_entropy(torch.empty(4).sigmoid(), torch.empty(4))
    with pytest.raises(RuntimeError, match="unsafe to autocast"):
        _under_cuda_autocast(run)


@pytest.mark.parametrize("cc,dtype,mask,expected", [
    ((8, 0), torch.float16, False, "flash"),
    ((8, 0), torch.float16, True, "memory-efficient"),  # flash takes no explicit mask
    ((7, 5), torch.float16, False, "memory-efficient"),  # flash needs sm80
    ((8, 0), torch.float32, False, "memory-efficient"),  # flash needs fp16/bf16
])
def test_attention_backend_choice(cc, dtype, mask, expected):
    attention = CudaAttention(CudaFacts(cc))
    with FakeTensorMode(), attention:
        q = torch.empty(2, 4, 16, 64, dtype=dtype, requires_grad=True)
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(16, 16, dtype=torch.bool) if mask else None)
    assert dict(attention.choices) == {expected: 1}


def test_flash_saves_logsumexp_not_the_weights():
    """A GPT at seq 256 keeps no [B, H, L, L] weights with flash; the CPU trace's math path would."""
    kwargs = dict(batch_size=4, input_shape="256", input_dtype="int64", input_max=512, precision="bf16-mixed")
    gpu = estimate("tests/models.py:tiny_gpt", device="a100-40gb", **kwargs)
    old = estimate("tests/models.py:tiny_gpt", device="custom:capacity=16GiB,cc=7.5", precision="fp16-mixed",
                   **{k: v for k, v in kwargs.items() if k != "precision"})
    assert any("flash backend" in w for w in gpu.warnings)
    assert any("memory-efficient backend" in w for w in old.warnings)


def test_optimizer_default_is_foreach_on_cuda_and_steps_stay_on_host():
    """Adam on CUDA defaults to foreach: one parameter-sized _foreach_sqrt list at the step; its step
    counters are CPU tensors (not in the CUDA figures)."""
    ref, kw = "mlp:1024-1024", dict(batch_size=1, input_shape="1024", optimizer="adam")
    cuda = estimate(ref, device="a100-40gb", **kw)
    params = 1024 * 1024 * 4 + 1024 * 4
    assert cuda.peak_op == "_foreach_sqrt"
    assert cuda.breakdown["optimizer_scalars"] == 0
    assert cuda.breakdown["temporaries"] >= params
    fused = estimate(ref, device="a100-40gb", optimizer_impl="fused", **kw)
    assert fused.allocated_bytes < cuda.allocated_bytes and fused.breakdown["optimizer_scalars"] > 0


def test_two_cublas_workspaces_one_per_thread():
    est = estimate("mlp:64-64", device="a100-40gb", batch_size=2, input_shape="64")
    rules = est.coverage["kernel_rules"]
    assert sorted(rules) == ["cuBLAS workspace, autograd thread (8,519,680 B)",
                             "cuBLAS workspace, main thread (8,519,680 B)",
                             "cuBLASLt workspace, main thread (1,048,576 B)"]  # the Linear's addmm with its bias
    h100 = estimate("mlp:64-64", device="h100-80gb", batch_size=2, input_shape="64")
    assert h100.breakdown["runtime"] >= 2 * 32 * 2**20  # 32 MiB each from cc 9.0


def test_reserved_counts_whole_segments():
    est = estimate("mlp:64-64", device="a100-40gb", batch_size=2, input_shape="64")
    # the first 8.125 MiB workspace opens a 20 MiB large segment (requests of 1–10 MiB get 20 MiB); the
    # second is split from its 11.875 MiB remainder; every other block fits one 2 MiB small segment
    assert est.reserved_bytes == 20 * 2**20 + 2 * 2**20
    assert est.process_bytes == est.reserved_bytes + est.coverage["cuda_runtime"]["cuda_context_bytes"]


def test_allocator_settings_reach_the_replay():
    kw = dict(batch_size=2, input_shape="64", device="a100-40gb")
    expandable = estimate("mlp:64-64", target_options=TargetOptions(alloc_conf="expandable_segments:True"), **kw)
    assert expandable.allocator.settings == "expandable_segments=True"
    assert expandable.reserved_bytes % (2 * 2**20) == 0  # mapped page by page (2 MiB small, 20 MiB large)
    from trainmem.errors import SetupError
    with pytest.raises(SetupError, match="alloc-conf"):
        estimate("mlp:64-64", target_options=TargetOptions(alloc_conf="max_split_size_mb:1"), **kw)


def test_bf16_refused_on_a_gpu_without_it():
    from trainmem.errors import SetupError
    with pytest.raises(SetupError, match="bf16"):
        estimate("mlp:8-8", device="t4", input_shape="8", precision="bf16-mixed")


transformers = pytest.importorskip("transformers")


@pytest.mark.heavy
def test_bert_base_calibration_point():
    """optimum-benchmark, bert-base-uncased fill-mask training, batch 2, seq 16, fp32, AdamW (Trainer
    default adamw_torch → foreach): max_memory_allocated 2,195.3 MB, max_memory_reserved 2,497.7 MB
    (MB = 1e6 B; benchmarks/data/gpu_published.jsonl has the source). Within 5% of each."""
    est = estimate("benchmarks/hf_models.py:bert_base_mlm", device="a100-40gb", batch_size=2, optimizer="adamw")
    assert est.allocated_bytes == pytest.approx(2195.345408 * MB, rel=0.05)
    assert est.reserved_bytes == pytest.approx(2497.708032 * MB, rel=0.05)
    assert est.peak_phase == "optimizer"  # the foreach sqrt list on top of the model states


def test_dropout_keeps_a_bool_mask_on_cuda():
    """ATen's dropout takes the fused native_dropout kernel on CUDA (1-byte mask); the CPU path keeps a
    noise tensor of the input's dtype."""
    kw = dict(batch_size=64, input_shape="1024", dropout=0.5)
    cuda = estimate("mlp:1024-1024-10", device="a100-40gb", **kw)
    cpu = estimate("mlp:1024-1024-10", **kw)
    assert "native_dropout" in cuda.coverage["ops"] and "native_dropout" not in cpu.coverage["ops"]
    assert "bernoulli_" in cpu.coverage["ops"]


def test_zero_grad_zeros_keeps_gradients_alive():
    kw = dict(batch_size=256, input_shape="1024", optimizer="sgd", device="a100-40gb")
    freed = estimate("mlp:1024-1024-1024-10", **kw)
    kept = estimate("mlp:1024-1024-1024-10", zero_grad="zeros", **kw)
    grads = 2 * (1024 * 1024 + 1024) * 4 + (1024 * 10 + 10) * 4
    assert kept.allocated_bytes >= freed.allocated_bytes
    assert kept.breakdown["gradients"] >= grads - 4096  # all gradients alive at the peak


def test_cross_entropy_under_cuda_autocast():
    """LossNLL.cpp: cross_entropy_loss calls log_softmax with the logits' own dtype, so under CUDA
    autocast the log-probabilities stay fp16 and nll_loss (autocast's fp32 list) gets an fp32 copy."""
    def run():
        logits = torch.empty(8, 100, dtype=torch.float16, requires_grad=True)
        with _OpDtypes() as seen:
            loss = F.cross_entropy(logits, torch.zeros(8, dtype=torch.long))
        return loss.dtype, seen
    dtype, seen = _under_cuda_autocast(run)
    assert dtype == torch.float32
    assert ("_log_softmax", torch.float16) in seen and ("nll_loss_forward", torch.float32) in seen


class _OpDtypes(TorchDispatchMode):
    """Records (op, first input dtype) of each op below autocast."""

    def __enter__(self):
        self.seen = []
        super().__enter__()
        return self.seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        self.seen.append((func.overloadpacket.__name__, first.dtype if first is not None else None))
        return func(*args, **(kwargs or {}))


def test_every_cuda_rule_names_a_test_that_exists():
    from pathlib import Path

    from trainmem.targets.cuda_rules import RULES
    root = Path(__file__).resolve().parents[1]
    for rule in RULES:
        if not rule.test:
            continue  # a stated gap
        path, name = rule.test.split("::")
        assert f"def {name}(" in (root / path).read_text(), rule


def test_mse_loss_keeps_an_input_sized_block_on_cuda():
    """Loss.cpp's mse_loss meta function builds an output of the input's size and resize_s it to 0-dim
    (the storage stays), on CUDA as on the CPU; the kernel adds a second input-sized buffer during the
    call. At the loss, a [4096, 1024] fp32 output (16 MiB) therefore holds two 16 MiB blocks more than a
    4-byte loss would."""
    from trainmem.targets import cuda_stream as cuda_target
    from trainmem.trace.cuda_composites import CudaFacts
    from trainmem.trace.run import trace_training
    from trainmem.frontends import resolve
    from trainmem.setup import TrainingSetup

    setup = TrainingSetup.from_mapping({"batch_size": 4096, "input_shape": "1024", "loss": "mse", "optimizer": "sgd"})
    traced = trace_training(resolve("mlp:1024-1024", setup), setup, cuda_target.kernel_ops(), CudaFacts((8, 0)))
    stream = cuda_target.device_stream(traced.trace, 8_519_680)
    loss_blocks = [e.nbytes for e in stream.events if e.action == "alloc" and e.op == "mse_loss"]
    buffers = [e.nbytes for e in stream.events if e.action == "alloc" and e.op == "mse_loss element-wise buffer"]
    assert loss_blocks and set(loss_blocks) == {4096 * 1024 * 4}
    assert buffers and set(buffers) == {4096 * 1024 * 4}
    assert any("reduced loss" in rule for rule in stream.rules)


def test_cublaslt_workspace_only_where_a_bias_is_fused(tmp_path):
    """addmm with a 1-D bias runs cuBLASLt's gemm_and_bias, whose own 1 MiB workspace a real H200 run (torch
    2.11, Linear(1024, 1024) → ReLU → Linear(1024, 10), Adam, batch 8) allocated once, in forward, and kept;
    its peaks there were 89,387,212 B requested / 89,390,080 B allocated (torch.cuda.memory_stats)."""
    est = estimate("mlp:1024-1024-10", device="h200", batch_size=8, input_shape="1024", optimizer="adam",
                   loop="step-fn", target_options=TargetOptions(cuda_version="13.0"))
    assert est.coverage["kernel_rules"]["cuBLASLt workspace, main thread (1,048,576 B)"] == 1
    assert 0 <= est.tensor_bytes - 89_387_212 <= 1024 and 0 <= est.allocated_bytes - 89_390_080 <= 1024
    model = tmp_path / "nobias.py"
    model.write_text("import torch\n\ndef make():\n    return torch.nn.Linear(64, 64, bias=False)\n")
    plain = estimate(f"{model}:make", device="a100-40gb", batch_size=2, input_shape="64")
    assert not any(rule.startswith("cuBLASLt") for rule in plain.coverage["kernel_rules"])
