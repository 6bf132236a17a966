"""The CPU target: PyTorch's CPU kernels and what they allocate below the dispatcher.

Each rule is registered once (a duplicate is an error), keyed by the op the dispatcher sees, and names
its source. The rule's effect is spliced into the event stream around the op's own outputs.
"""

from __future__ import annotations

from collections.abc import Callable

from trainmem.alloc.device_events import DeviceEvent

from trainmem.targets import KernelEffect
from trainmem.targets.cpu_info import CpuInfo
from trainmem.targets.onednn import conv as onednn_conv
from trainmem.targets.onednn import matmul_cache, rnn_transients, rnn_workspace
from trainmem.targets.rule_registry import RuleRegistry
from trainmem.trace.events import Category, KernelCall, TensorMeta, Trace

KernelRule = Callable[[KernelCall, CpuInfo], KernelEffect]
_RULES: RuleRegistry[KernelRule] = RuleRegistry("CPU")
kernel_rule = _RULES.register


def kernel_ops() -> frozenset[str]:
    return _RULES.ops()


def rule_for(op: str) -> KernelRule:
    """The registered rule for `op` (the CUDA target reuses the device-independent loss rules, which
    read nothing of the CpuInfo)."""
    return _RULES.rule_for(op)


@kernel_rule("mkldnn_rnn_layer")
def _lstm_workspace(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """oneDNN's LSTM returns a training workspace (gates and states of every time step) whose size the
    fake kernel reports as 0 (torch/_meta_registrations.py); the real size is the primitive's
    workspace_desc (aten/src/ATen/native/mkldnn/RNN.cpp), computed in targets/onednn/rnn_workspace.py."""
    args = call.args
    # mkldnn_rnn has already made the input time-major, whatever batch_first says
    (seq_len, batch, input_size), hidden_size, bidirectional = args[0].shape, args[10], args[13]
    cell_bytes = args[6].itemsize if isinstance(args[6], TensorMeta) else args[0].itemsize
    nbytes = rnn_workspace.lstm_workspace_bytes(seq_len, batch, input_size, hidden_size, bool(bidirectional),
                                                args[0].itemsize, cell_bytes)
    before, after = rnn_transients.lstm_forward_transients(seq_len, batch, input_size, hidden_size, args[0].itemsize,
                                                           cpu=cpu)
    return KernelEffect(tuple(before), tuple(after), output_nbytes=((3, nbytes),), rule="oneDNN LSTM workspace and buffers")


@kernel_rule("mkldnn_rnn_layer_backward")
def _lstm_backward(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """oneDNN's LSTM backward reorders weights and keeps diff states in buffers of its own."""
    inp = call.args[0]
    if not isinstance(inp, TensorMeta):
        return KernelEffect()
    seq_len, batch, input_size = inp.shape
    hidden_size = call.args[1].shape[0] // 4
    hx, cx, grads = call.args[5], call.args[6], call.args[10:13]
    # the kernel copies a grad that is missing (zeros_like) or not contiguous (.contiguous())
    copied = [not isinstance(grad, TensorMeta) or not grad.contiguous for grad in grads]
    same = isinstance(hx, TensorMeta) and isinstance(cx, TensorMeta) and hx.storage_key == cx.storage_key
    before, after = rnn_transients.lstm_backward_transients(
        seq_len, batch, input_size, hidden_size, inp.itemsize, cpu=cpu,
        grad_output_copied=copied[0], grad_hy_copied=copied[1], grad_cy_copied=copied[2], hx_cx_same_storage=same,
        cell_state_bytes=cx.itemsize if isinstance(cx, TensorMeta) else None)
    # RNN.cpp returns diff_b and diff_b2_ = clone(diff_b_), two storages (the bias gradients of b_ih and b_hh);
    # the fake kernel returns one tensor twice (torch/_meta_registrations.py), so that storage stands for both
    outputs = call.outputs
    shared = (len(outputs) > 4 and isinstance(outputs[3], TensorMeta) and isinstance(outputs[4], TensorMeta)
              and outputs[3].storage_key == outputs[4].storage_key)
    sizes = ((3, 2 * 4 * hidden_size * outputs[3].itemsize),) if shared else ()
    return KernelEffect(tuple(before), tuple(after), output_nbytes=sizes, rule="oneDNN LSTM backward buffers")


def _channels_last(inp: TensorMeta, weight: object) -> bool:
    """aten's mkldnn_conv_use_channels_last: the input or the weight is channels-last."""
    return inp.channels_last or (isinstance(weight, TensorMeta) and weight.channels_last)


@kernel_rule("convolution")
def _conv_forward(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """ideep reorders plain tensors into blocked layouts around oneDNN convolutions (targets/onednn/conv.py)."""
    inp, weight, bias, stride, padding, dilation, transposed, _out_pad, groups = call.args[:9]
    if not isinstance(inp, TensorMeta) or not call.outputs or call.outputs[0] is None:
        return KernelEffect()
    before, after = onednn_conv.conv_forward_transients(
        inp.shape, weight.shape, call.outputs[0].shape, stride, padding, dilation, groups, transposed,
        inp.itemsize, cpu, has_bias=bias is not None, channels_last=_channels_last(inp, weight))
    return KernelEffect(tuple(before), tuple(after), rule="oneDNN convolution reorders")


@kernel_rule("convolution_backward")
def _conv_backward(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    grad_output, inp, weight, _bias_sizes, stride, padding, dilation, transposed, _out_pad, groups, mask = call.args[:11]
    if not isinstance(inp, TensorMeta):
        return KernelEffect()
    before, after = onednn_conv.conv_backward_transients(
        grad_output.shape, inp.shape, weight.shape, stride, padding, dilation, groups, transposed, mask,
        inp.itemsize, cpu, channels_last=_channels_last(inp, weight))
    return KernelEffect(tuple(before), tuple(after), rule="oneDNN convolution backward reorders")


# ---- losses whose reduced output keeps an input-sized storage (aten/src/ATen/native/Loss.cpp) --------
_MEAN = 1  # at::Reduction::Mean, the default of every loss below (aten/src/ATen/core/Reduction.h)


def _reduced(call: KernelCall, position: int) -> tuple[int, int] | None:
    """(broadcast element count, output itemsize) when the loss reduces (mean/sum), else None. A reduced
    loss is a 0-dim tensor; its element-wise stage is as large as the broadcast inputs."""
    reduction = call.args[position] if len(call.args) > position else _MEAN
    inp, target = call.args[0], call.args[1]
    if reduction == 0 or not isinstance(inp, TensorMeta) or not call.outputs or call.outputs[0] is None:
        return None
    shape = list(inp.shape)
    if isinstance(target, TensorMeta):  # right-aligned broadcast, as TensorIterator computes it
        other = list(target.shape)
        width = max(len(shape), len(other))
        shape, other = [1] * (width - len(shape)) + shape, [1] * (width - len(other)) + other
        shape = [max(mine, theirs) for mine, theirs in zip(shape, other)]
    return _numel(shape), call.outputs[0].itemsize


def _structured_loss(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """mse_loss and smooth_l1_loss are structured kernels: TORCH_META_FUNC builds a binary TensorIterator
    into the output (broadcast-sized) and then `resize_({})`s it, which shrinks the shape but keeps the
    storage; TORCH_IMPL_FUNC then computes into a second broadcast-sized `loss` and mean_out/sum_out's
    it into the output before freeing it. So the 0-dim loss holds an input-sized storage for as long as
    it lives, and the call peaks at two of them (checked against the profiler in
    tests/test_cpu_kernel_rules.py)."""
    reduced = _reduced(call, 2)
    if reduced is None:
        return KernelEffect()
    nbytes = reduced[0] * reduced[1]
    return KernelEffect(after=(nbytes, -nbytes), output_nbytes=((0, nbytes),), rule="reduced loss: input-sized storage")


kernel_rule("mse_loss")(_structured_loss)
kernel_rule("smooth_l1_loss")(_structured_loss)


_REDUCED = ("bfloat16", "float16")


def _matmul_seen(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """Nothing below the dispatcher per call: the calls are recorded so that the process can count the distinct
    problems oneDNN compiles for reduced-precision matmuls (targets/onednn/matmul_cache.py)."""
    return KernelEffect()


for _op in matmul_cache.MATMUL_OPS:
    kernel_rule(_op)(_matmul_seen)


@kernel_rule("native_batch_norm")
def _batch_norm_mixed(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """batch_norm_cpu (aten/src/ATen/native/Normalization.cpp) keeps save_mean and save_invstd in the parameters'
    dtype when a bf16/fp16 input meets fp32 weight, bias or running statistics (`is_mixed_type`: autocast leaves
    BatchNorm's parameters in fp32); the meta kernel makes them in the input's dtype. Measured: a bf16 input of 8
    channels with nn.BatchNorm2d's fp32 parameters saves 2 × 32 B where the fake kernel says 2 × 16 B."""
    inp, params = call.args[0], call.args[1:5]
    if not isinstance(inp, TensorMeta) or inp.dtype not in _REDUCED:
        return KernelEffect()
    wider = [p for p in params if isinstance(p, TensorMeta) and p.dtype not in _REDUCED]
    outputs = call.outputs
    if not wider or len(outputs) < 3:
        return KernelEffect()
    sizes = tuple((index, outputs[index].shape[0] * wider[0].itemsize) for index in (1, 2)
                  if isinstance(outputs[index], TensorMeta) and outputs[index].shape)
    return KernelEffect(output_nbytes=sizes, rule="batch norm statistics in fp32 for a reduced-precision input")


@kernel_rule("binary_cross_entropy")
def _bce(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """binary_cross_entropy_cpu computes into `at::empty_like(input)` and reduces with
    `loss.resize_as_(loss_reduced).copy_(loss_reduced)`: the 0-dim result keeps the input-sized storage."""
    reduced = _reduced(call, 3)
    if reduced is None:
        return KernelEffect()
    return KernelEffect(output_nbytes=((0, reduced[0] * reduced[1]),), rule="reduced loss: input-sized storage")


@kernel_rule("soft_margin_loss")
def _soft_margin(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """soft_margin_loss_out writes `neg_out(output, input)...` into the output (input-sized), then
    `output.resize_({})` and copies the reduction in: the storage stays input-sized."""
    reduced = _reduced(call, 2)
    if reduced is None:
        return KernelEffect()
    return KernelEffect(output_nbytes=((0, reduced[0] * reduced[1]),), rule="reduced loss: input-sized storage")


@kernel_rule("huber_loss")
def _huber(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """huber_loss computes into `at::empty_like(input)` and returns `apply_loss_reduction(loss)`, a new
    0-dim tensor: the output is small but an input-sized buffer lives across the call."""
    reduced = _reduced(call, 2)
    if reduced is None:
        return KernelEffect()
    nbytes = reduced[0] * reduced[1]
    return KernelEffect(before=(nbytes,), after=(-nbytes,), rule="huber_loss element-wise buffer")


@kernel_rule("soft_margin_loss_backward")
def _soft_margin_backward(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """soft_margin_loss_backward_out: `z = at::exp(-target * input)` makes three input-sized tensors
    (neg, mul, exp) before the gradient is written, and z lives until the kernel returns."""
    inp = call.args[1]
    if not isinstance(inp, TensorMeta):
        return KernelEffect()
    nbytes = _numel(inp.shape) * inp.itemsize
    return KernelEffect(before=(nbytes, nbytes, nbytes, -nbytes, -nbytes), after=(-nbytes,),
                        rule="soft_margin_loss backward buffers")


@kernel_rule("_embedding_bag_backward")
def _embedding_bag_backward(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """EmbeddingBag's dense backward (aten/src/ATen/native/EmbeddingBag.cpp: _embedding_bag_backward_symint
    → _embedding_bag_dense_backward_cpu → _embedding_bag_dense_backward_cpu_sum_mean) builds its index
    buffers below the dispatcher. Before the gradient `at::zeros({num_weights, dim})`: indices/offsets
    promoted to a common int64 (promoteIndicesAndOffsets), offset2bag rebuilt when the forward left it
    empty (mode sum: `new_zeros({n + 1})` kept, make_offset2bag's n + 1 temporary), `grad.contiguous()`.
    After it: `indices.sort()` (sorted values, int64 positions, and one int64 scratch the sort frees),
    `offset2bag.index_select(0, ind_sort)`, per_sample_weights reordered the same way; all freed at return.
    Mode max: _embedding_bag_dense_backward_cpu_max. Sparse gradients take another path: not modelled."""
    grad, indices, offsets, offset2bag = call.args[:4]
    mode, sparse = call.args[8], call.args[9]
    weights = call.args[10] if len(call.args) > 10 else None
    if sparse or not all(isinstance(tensor, TensorMeta) for tensor in (grad, indices, offsets, offset2bag)):
        return KernelEffect()
    if mode == 2:  # `grad_.contiguous()` comes first on every path
        copy = 0 if grad.contiguous else _numel(grad.shape) * grad.itemsize
        return _embedding_bag_max_backward(call, copy)
    count = _numel(indices.shape)
    # promoteIndicesAndOffsets: one int32 and one int64 → both int64 (a copy of the int32 one)
    promoted = [_numel(tensor.shape) * 8 for tensor in (indices, offsets)
                if tensor.itemsize == 4 and 8 in (indices.itemsize, offsets.itemsize)]
    index_bytes = 8 if promoted else indices.itemsize
    kept = list(promoted)
    before = list(promoted)
    if count and _numel(offset2bag.shape) == 0:  # rebuilt from offsets, storage kept count + 1 long
        before += [(count + 1) * index_bytes, (count + 1) * index_bytes, -(count + 1) * index_bytes]
        kept.append((count + 1) * index_bytes)
    if not grad.contiguous:
        before.append(_numel(grad.shape) * grad.itemsize)
        kept.append(before[-1])
    # sorted values, int64 positions, the sort's int64 scratch; offset2bag reordered
    sort = [count * index_bytes, count * 8, count * 8, -count * 8, count * index_bytes]
    reordered = [count * weights.itemsize] if isinstance(weights, TensorMeta) else []
    after = (sort + reordered + [-nbytes for nbytes in reordered]
             + [-count * index_bytes, -count * 8, -count * index_bytes] + [-nbytes for nbytes in reversed(kept)])
    return KernelEffect(tuple(before), tuple(after), rule="EmbeddingBag backward index buffers")


def _embedding_bag_max_backward(call: KernelCall, grad_copy: int) -> KernelEffect:
    """_embedding_bag_dense_backward_cpu_max: after the gradient, `bag_size.nonzero()` (twice, one int64
    per non-empty bag), `max_indices.index_select` and `grad.index_select` over those bags, and per
    feature an index_add_ whose strided index is copied contiguous. Every bag is taken as non-empty:
    the most rows these buffers can have."""
    grad, bag_size, max_indices = call.args[0], call.args[4], call.args[5]
    if not all(isinstance(tensor, TensorMeta) for tensor in (grad, bag_size, max_indices)):
        return KernelEffect()
    rows = _numel(bag_size.shape) * 8
    picked = _numel(max_indices.shape) * max_indices.itemsize
    grads = _numel(grad.shape) * grad.itemsize
    after = (rows, picked, -rows, rows, grads, -rows, rows, -rows, -grads, -picked) + ((-grad_copy,) if grad_copy else ())
    return KernelEffect((grad_copy,) if grad_copy else (), after, rule="EmbeddingBag max backward buffers")


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def device_stream(trace: Trace, cpu: CpuInfo) -> tuple[list[DeviceEvent], dict[str, int]]:
    """The trace's events with each kernel call's effect spliced in: `before` buffers just ahead of the
    call's first output, `after` buffers just behind its last. Returns the stream and rule counts."""
    calls: dict[int, list[tuple[KernelCall, KernelEffect]]] = {}
    sizes: dict[int, int] = {}
    fired: dict[str, int] = {}
    for call in trace.kernel_calls:
        effect = _RULES.rule_for(call.op)(call, cpu)
        if not (effect.before or effect.after or effect.output_nbytes):
            continue
        fired[effect.rule] = fired.get(effect.rule, 0) + 1
        for index, nbytes in effect.output_nbytes:
            if index < len(call.output_sids) and call.output_sids[index] is not None:
                sizes[call.output_sids[index]] = nbytes
        calls.setdefault(call.at_seq, []).append((call, effect))
    stream: list[DeviceEvent] = []
    pending_after: dict[int, list[DeviceEvent]] = {}
    keys = iter(range(-1, -(1 << 62), -1))
    for seq in range(len(trace.events) + 1):
        for call, effect in calls.get(seq, []):
            before, after = _transients(effect, call, trace, keys)
            stream.extend(before)
            if call.outputs_allocated == 0:
                stream.extend(after)
            else:
                pending_after.setdefault(seq + call.outputs_allocated - 1, []).extend(after)
        if seq == len(trace.events):
            break
        event = trace.events[seq]
        stream.append(DeviceEvent(event.action, sizes.get(event.sid, event.nbytes), event.sid,
                                  trace.storages[event.sid].category, event.phase, event.module, event.op,
                                  event.step, event.seq))
        stream.extend(pending_after.pop(seq, []))
    return stream, fired


def _transients(effect: KernelEffect, call: KernelCall, trace: Trace, keys) -> tuple[list[DeviceEvent], list[DeviceEvent]]:
    """Turn signed sizes into alloc/free events. A free releases the latest live buffer of that size;
    a size that matches none releases the latest buffers until the amount is covered (a remainder
    stays live as a buffer of its own), so the running total is always the rule's."""
    anchor = trace.events[min(call.at_seq, len(trace.events) - 1)]
    live: list[tuple[int, int]] = []
    lists: tuple[list[DeviceEvent], list[DeviceEvent]] = ([], [])

    def emit(out: list[DeviceEvent], action: str, nbytes: int, key: int) -> None:
        out.append(DeviceEvent(action, nbytes, key, Category.RUNTIME, anchor.phase, anchor.module, call.op,
                               anchor.step, call.at_seq))

    for out, deltas in zip(lists, (effect.before, effect.after)):
        for delta in deltas:
            if delta > 0:
                live.append((next(keys), delta))
                emit(out, "alloc", delta, live[-1][0])
                continue
            matches = [position for position, (_, size) in enumerate(live) if size == -delta]
            remaining = -delta
            while remaining > 0 and live:
                key, size = live.pop(matches[-1] if matches else -1)
                matches = []
                emit(out, "free", size, key)
                if size > remaining:
                    live.append((next(keys), size - remaining))
                    emit(out, "alloc", size - remaining, live[-1][0])
                remaining -= min(size, remaining)
    return lists[0], lists[1]


def _gloo_rule(call: KernelCall, cpu: CpuInfo) -> KernelEffect:
    """gloo's collectives on the CPU (targets/gloo.py: the flat all-gather buffer, the reduce-scatter input clone,
    measured in real multi-process runs); a call with several effects keeps them all live together (high)."""
    from trainmem.targets.gloo import gloo_effects

    effects = gloo_effects(call)
    if not effects:
        return KernelEffect()
    return KernelEffect(tuple(n for e in effects for n in e.before), tuple(n for e in effects for n in e.after),
                        rule=effects[0].rule)


def _register_gloo() -> None:
    from trainmem.targets.gloo import GLOO_OPS

    for op in sorted(GLOO_OPS):
        kernel_rule(op)(_gloo_rule)


_register_gloo()
