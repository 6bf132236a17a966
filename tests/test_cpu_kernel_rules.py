"""Check the CPU target's loss and EmbeddingBag rules (`trainmem.targets.cpu_kernels`) against the real kernels.

Each case calls a user-level function (F.mse_loss, F.embedding_bag + backward…) on real tensors and
captures the aten call the dispatcher sees — the call trainmem's recorder would hand to the rule. The
same call then runs (1) on fake tensors, which give the sizes the trace records, corrected by the rule's
`output_nbytes`, and (2) for real under ``torch.profiler`` with ``profile_memory=True``. Checked, in
storage bytes (not shapes): every output's storage equals the model's, and the in-op peak of the
model (``before``, then the outputs, then ``after``) is within 1% of the profiler's running peak of the
[memory] events inside the op. Sizes are large enough that the kernels' 4–8 byte scratch
(the reductions' internals) stays far below 1%.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from kernel_checks import memory_inside, running_peak
from trainmem.targets import KernelEffect
from trainmem.targets import cpu_kernels as cpu
from trainmem.targets.cpu_info import CpuInfo
from trainmem.targets.onednn.scratchpad import PAGE_BYTES, book, div_up, round_up
from trainmem.targets.rule_registry import RuleRegistry
from trainmem.trace.events import KernelCall
from trainmem.trace.recorder import _meta_of
from trainmem.trace.torch_private import FakeTensorMode, TorchDispatchMode, tree_leaves

_CPU = CpuInfo.this_machine()


class _Capture(TorchDispatchMode):
    def __init__(self, op: str) -> None:
        super().__init__()
        self.op, self.calls = op, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == self.op:
            self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _dispatched(op: str, fn):
    with _Capture(op) as capture:
        fn()
    assert capture.calls, f"aten.{op} was not dispatched"
    return capture.calls[0]


def _compare(op: str, fn) -> tuple[KernelEffect, list[int], list[int]]:
    """The rule's effect, the model's output storage sizes and the real ones; asserts the in-op peak."""
    func, args, kwargs = _dispatched(op, fn)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        real_out = func(*args, **kwargs)
    events = memory_inside(prof, f"aten::{op}")
    mode = FakeTensorMode()
    fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    with mode:
        fake_out = tree_leaves(func(*fake_args, **kwargs))
    call = KernelCall(op, 0, len(fake_out), _meta_of(args), _meta_of(fake_out), tuple(range(len(fake_out))))
    effect = cpu.rule_for(op)(call, _CPU) if op in cpu.kernel_ops() else KernelEffect()
    sizes = dict(effect.output_nbytes)
    model_out = [sizes.get(i, t.untyped_storage().nbytes()) for i, t in enumerate(fake_out)]
    real_sizes = [t.untyped_storage().nbytes() for t in tree_leaves(real_out)]
    real = running_peak(events)
    model = running_peak(list(effect.before) + [sum(model_out)] + list(effect.after))
    assert abs(model - real) <= 0.01 * real, (op, real, model, events, effect)
    assert sum(effect.before) + sum(effect.after) == 0, effect
    return effect, model_out, real_sizes


def _pair(shape=(128, 2000), low=None):
    gen = torch.Generator().manual_seed(0)
    if low is not None:  # probabilities for binary_cross_entropy
        return torch.rand(shape, generator=gen).clamp(0.01, 0.99).requires_grad_(), torch.rand(shape, generator=gen)
    return torch.randn(shape, generator=gen, requires_grad=True), torch.randn(shape, generator=gen)


LOSSES = {
    "mse_loss": lambda x, t, r: F.mse_loss(x, t, reduction=r),
    "smooth_l1_loss": lambda x, t, r: F.smooth_l1_loss(x, t, reduction=r),
    "binary_cross_entropy": lambda x, t, r: F.binary_cross_entropy(x, t, reduction=r),
    "soft_margin_loss": lambda x, t, r: F.soft_margin_loss(x, t.sign(), reduction=r),
    "huber_loss": lambda x, t, r: F.huber_loss(x, t, reduction=r),
}


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("op", list(LOSSES))
def test_loss_forward_storage_and_peak(op, reduction):
    x, t = _pair(low=0 if op == "binary_cross_entropy" else None)
    effect, model_out, real_sizes = _compare(op, lambda: LOSSES[op](x.detach(), t, reduction))
    assert model_out == real_sizes
    if reduction != "none" and op != "huber_loss":  # the 0-dim loss keeps an input-sized storage
        assert real_sizes == [x.numel() * 4]


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("op", list(LOSSES))
def test_loss_backward_storage_and_peak(op, reduction):
    """The backward kernels: only soft_margin_loss allocates beyond its gradient."""
    x, t = _pair(low=0 if op == "binary_cross_entropy" else None)

    def run():
        loss = LOSSES[op](x, t, reduction)
        (loss if reduction != "none" else loss.sum()).backward()

    effect, model_out, real_sizes = _compare(f"{op}_backward", run)
    assert model_out == real_sizes
    assert bool(effect.before) == (op == "soft_margin_loss")


def test_mse_broadcast_target_is_output_sized():
    """The element-wise stage has the broadcast shape of input and target (TensorIterator)."""
    x = torch.randn(64, 1, 1000)
    t = torch.randn(64, 8, 1000)
    _, model_out, real_sizes = _compare("mse_loss", lambda: torch.ops.aten.mse_loss(x, t, 1))
    assert model_out == real_sizes == [64 * 8 * 1000 * 4]


def test_fake_kernel_alone_is_low():
    """Without the rule the trace would record 4 bytes for the loss: what the rule corrects."""
    mode = FakeTensorMode()
    with mode:
        loss = F.mse_loss(torch.randn(128, 2000), torch.randn(128, 2000))
    assert loss.untyped_storage().nbytes() == 4
    assert F.mse_loss(torch.randn(128, 2000), torch.randn(128, 2000)).untyped_storage().nbytes() == 128 * 2000 * 4


BAGS = {  # name: (num_weights, dim, bags, per bag, mode, per_sample_weights, index dtype, 2-D input)
    "sum_1d": (20000, 64, 256, 32, "sum", False, torch.int64, False),
    "mean_1d": (20000, 64, 256, 32, "mean", False, torch.int64, False),
    "sum_2d": (20000, 64, 256, 32, "sum", False, torch.int64, True),
    "sum_weighted": (20000, 64, 256, 32, "sum", True, torch.int64, False),
    "mean_int32": (20000, 64, 256, 32, "mean", False, torch.int32, False),
    "sum_int32_2d": (5000, 128, 512, 16, "sum", False, torch.int32, True),
    "max_1d": (5000, 64, 256, 16, "max", False, torch.int64, False),
}


@pytest.mark.parametrize("name", list(BAGS))
def test_embedding_bag_backward(name):
    num, dim, bags, per_bag, mode, weighted, dtype, two_d = BAGS[name]
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(num, dim, generator=gen, requires_grad=True)
    indices = torch.randint(0, num, (bags * per_bag,), generator=gen, dtype=dtype)
    offsets = torch.arange(0, bags * per_bag, per_bag, dtype=dtype)
    psw = torch.rand(bags * per_bag, generator=gen) if weighted else None

    def run():
        if two_d:
            out = F.embedding_bag(indices.view(bags, per_bag), weight, mode=mode, per_sample_weights=None)
        else:
            out = F.embedding_bag(indices, weight, offsets, mode=mode, per_sample_weights=psw)
        out.sum().backward()

    effect, model_out, real_sizes = _compare("_embedding_bag_backward", run)
    assert model_out == real_sizes == [num * dim * 4]
    assert effect.after, effect  # the sort and index_select buffers exist in every sum/mean case


def test_embedding_bag_backward_noncontiguous_grad():
    """`grad.contiguous()` copies a transposed incoming gradient."""
    weight = torch.randn(5000, 64, requires_grad=True)
    indices = torch.randint(0, 5000, (8192,))
    offsets = torch.arange(0, 8192, 32)

    def run():
        out = F.embedding_bag(indices, weight, offsets, mode="sum")
        (out.t() * torch.randn(64, 256)).sum().backward()  # mul's grad for out.t() is contiguous

    effect, _, _ = _compare("_embedding_bag_backward", run)
    assert 256 * 64 * 4 in effect.before


def test_registry_refuses_a_second_rule_for_an_op():
    """Registering another rule for an op the CPU target already has fails where it is registered,
    and leaves the first rule in place."""
    before = cpu.rule_for("mse_loss")
    with pytest.raises(RuntimeError, match="aten.mse_loss is already registered"):
        cpu.kernel_rule("mse_loss")(lambda call, cpu_info: KernelEffect())
    assert cpu.rule_for("mse_loss") is before
    assert "mse_loss" in cpu.kernel_ops()


def test_registry_refuses_duplicates_on_its_own():
    registry = RuleRegistry("test")
    registry.register("add")(lambda call, cpu_info: KernelEffect())
    with pytest.raises(RuntimeError, match="aten.add is already registered"):
        registry.register("add")(lambda call, cpu_info: KernelEffect())
    assert registry.ops() == frozenset({"add"})


def test_cpu_info_reads_this_process_once_and_refuses_no_threads():
    here = CpuInfo.this_machine()
    assert (here.capability, here.threads, here.avx512_bf16) == (
        torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(), torch.cpu._is_avx512_bf16_supported())
    assert here == CpuInfo.this_machine()  # AMX and the other instruction sets: test_onednn_rnn.py
    with pytest.raises(ValueError, match="at least one thread"):
        CpuInfo("AVX512", 0)


def test_scratchpad_booking():
    """registry_t::book: an empty entry costs nothing, others their size + max(alignment, 128)."""
    assert book(0) == 0
    assert book(1) == 129
    assert book(1000, PAGE_BYTES) == 1000 + 4096
    assert round_up(17, 16) == 32 and round_up(32, 16) == 32 and div_up(17, 16) == 2


def _conv_call(padding: int) -> KernelCall:
    """The aten.convolution call F.conv2d dispatches, as the recorder would hand it to the rule."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, 32, 32, generator=gen), torch.randn(64, 64, 3, 3, generator=gen)
    func, args, kwargs = _dispatched("convolution", lambda: F.conv2d(x, w, padding=padding))
    out = func(*args, **kwargs)
    return KernelCall("convolution", 0, 1, _meta_of(args), _meta_of((out,)), (0,))


def test_cpu_info_threads_reach_the_convolution_rule():
    """The rule sizes oneDNN's per-thread scratch from CpuInfo.threads, not from the running process:
    a padding-3 3x3 convolution runs gemm, whose im2col columns (64 * 9 * 36 * 36 f32) are per thread."""
    call = _conv_call(padding=3)
    columns = 64 * 9 * 36 * 36 * 4
    peaks = {}
    for threads in (1, 4):
        effect = cpu.rule_for("convolution")(call, CpuInfo("AVX512", threads))
        assert effect.before[0] == threads * columns + 128, effect
        peaks[threads] = running_peak(effect.before)
    assert peaks[4] - peaks[1] == 3 * columns


def test_cpu_info_capability_reaches_the_convolution_rule():
    """AVX2 blocks channels by 8, AVX512 by 16: 20 input channels are padded to 24 or 32 in the reorder."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 20, 32, 32, generator=gen), torch.randn(16, 20, 3, 3, generator=gen)
    func, args, kwargs = _dispatched("convolution", lambda: F.conv2d(x, w, padding=1))
    call = KernelCall("convolution", 0, 1, _meta_of(args), _meta_of((func(*args, **kwargs),)), (0,))
    reorders = {capability: cpu.rule_for("convolution")(call, CpuInfo(capability, 2)).before[0]
                for capability in ("AVX2", "AVX512")}
    assert reorders == {"AVX2": 8 * 24 * 32 * 32 * 4, "AVX512": 8 * 32 * 32 * 32 * 4}


def test_device_stream_splices_the_rules_with_the_given_cpu():
    """device_stream hands its CpuInfo to every rule: a traced convolution's stream grows with threads."""
    from conftest import zoo
    from trainmem.frontends import resolve
    from trainmem.setup import TrainingSetup
    from trainmem.trace.run import trace_training

    setup = TrainingSetup.from_mapping({"batch_size": 4, "optimizer": "sgd", "target_shape": "scalar"})
    traced = trace_training(resolve(zoo("cnn_bn"), setup), setup, cpu.kernel_ops())
    sizes = {}
    for threads in (1, 8):
        stream, fired = cpu.device_stream(traced.trace, CpuInfo("AVX512", threads))
        assert fired
        sizes[threads] = sum(event.nbytes for event in stream if event.key < 0 and event.action == "alloc")
    assert sizes[8] > sizes[1], sizes


@pytest.mark.slow
@pytest.mark.parametrize("name,values", [
    ("conv_autoencoder", {"batch_size": 16, "optimizer": "adam"}),  # F.mse_loss on the input: −4.6% without the rule
    ("embbag_recsys", {"batch_size": 1024, "optimizer": "sgd"}),  # peak inside EmbeddingBag's backward
])
def test_zoo_family_matches_measure(name, values):
    from conftest import zoo
    from trainmem.measure.single_process import measure
    from trainmem.setup import TrainingSetup

    # the tensor peak only: a run of the two traced steps, without the long run's glibc heap replay
    comparison = measure(zoo(name), TrainingSetup.from_mapping({**values, "run_steps": 2}))
    assert abs(comparison.to_dict()["error"]["tensor_bytes"]) <= 0.01, comparison
