"""The CPU target: PyTorch's CPU kernels and what they allocate below the dispatcher.

Each rule is registered once (a duplicate is an error), keyed by the op the dispatcher sees, and names
its source. The rule's effect is spliced into the event stream around the op's own outputs.
"""

from __future__ import annotations

from collections.abc import Callable

from trainmem.targets import DeviceEvent, KernelEffect, onednn_conv, onednn_rnn
from trainmem.trace.events import Category, KernelCall, TensorMeta, Trace

KernelRule = Callable[[KernelCall, str], KernelEffect]
_RULES: dict[str, KernelRule] = {}


def kernel_rule(op: str):
    def register(rule: KernelRule) -> KernelRule:
        if op in _RULES:
            raise RuntimeError(f"a CPU kernel rule for aten.{op} is already registered")
        _RULES[op] = rule
        return rule
    return register


def kernel_ops() -> frozenset[str]:
    return frozenset(_RULES)


@kernel_rule("mkldnn_rnn_layer")
def _lstm_workspace(call: KernelCall, capability: str) -> KernelEffect:
    """oneDNN's LSTM returns a training workspace (gates and states of every time step) whose size the
    fake kernel reports as 0 (torch/_meta_registrations.py); the real size is the primitive's
    workspace_desc (aten/src/ATen/native/mkldnn/RNN.cpp), computed in targets/onednn_rnn.py."""
    args = call.args
    # mkldnn_rnn has already made the input time-major, whatever batch_first says
    (seq_len, batch, input_size), hidden_size, bidirectional = args[0].shape, args[10], args[13]
    cell_bytes = args[6].itemsize if isinstance(args[6], TensorMeta) else args[0].itemsize
    nbytes = onednn_rnn.lstm_workspace_bytes(seq_len, batch, input_size, hidden_size, bool(bidirectional),
                                             args[0].itemsize, cell_bytes)
    before, after = onednn_rnn.lstm_forward_transients(seq_len, batch, input_size, hidden_size, args[0].itemsize)
    return KernelEffect(tuple(before), tuple(after), output_nbytes=((3, nbytes),), rule="oneDNN LSTM workspace and buffers")


@kernel_rule("mkldnn_rnn_layer_backward")
def _lstm_backward(call: KernelCall, capability: str) -> KernelEffect:
    """oneDNN's LSTM backward reorders weights and keeps diff states in buffers of its own."""
    inp = call.args[0]
    if not isinstance(inp, TensorMeta):
        return KernelEffect()
    seq_len, batch, input_size = inp.shape
    hidden_size = call.args[1].shape[0] // 4
    hx, cx, grads = call.args[5], call.args[6], call.args[10:13]
    # the kernel copies a grad that is missing (zeros_like) or not contiguous (.contiguous())
    copied = [not isinstance(g, TensorMeta) or not g.contiguous for g in grads]
    same = isinstance(hx, TensorMeta) and isinstance(cx, TensorMeta) and hx.storage_key == cx.storage_key
    before, after = onednn_rnn.lstm_backward_transients(seq_len, batch, input_size, hidden_size, inp.itemsize,
                               grad_output_copied=copied[0], grad_hy_copied=copied[1], grad_cy_copied=copied[2],
                               hx_cx_same_storage=same,
                               cell_state_bytes=cx.itemsize if isinstance(cx, TensorMeta) else None)
    return KernelEffect(tuple(before), tuple(after), rule="oneDNN LSTM backward buffers")


@kernel_rule("convolution")
def _conv_forward(call: KernelCall, capability: str) -> KernelEffect:
    """ideep reorders plain tensors into blocked layouts around oneDNN convolutions (targets/onednn_conv.py)."""
    inp, weight, bias, stride, padding, dilation, transposed, _out_pad, groups = call.args[:9]
    if not isinstance(inp, TensorMeta) or not call.outputs or call.outputs[0] is None:
        return KernelEffect()
    before, after = onednn_conv.conv_forward_transients(
        inp.shape, weight.shape, call.outputs[0].shape, stride, padding, dilation, groups, transposed,
        inp.itemsize, capability, has_bias=bias is not None)
    return KernelEffect(tuple(before), tuple(after), rule="oneDNN convolution reorders")


@kernel_rule("convolution_backward")
def _conv_backward(call: KernelCall, capability: str) -> KernelEffect:
    grad_output, inp, weight, _bias_sizes, stride, padding, dilation, transposed, _out_pad, groups, mask = call.args[:11]
    if not isinstance(inp, TensorMeta):
        return KernelEffect()
    before, after = onednn_conv.conv_backward_transients(
        grad_output.shape, inp.shape, weight.shape, stride, padding, dilation, groups, transposed, mask,
        inp.itemsize, capability)
    return KernelEffect(tuple(before), tuple(after), rule="oneDNN convolution backward reorders")


def device_stream(trace: Trace, capability: str) -> tuple[list[DeviceEvent], dict[str, int]]:
    """The trace's events with each kernel call's effect spliced in: `before` buffers just ahead of the
    call's first output, `after` buffers just behind its last. Returns the stream and rule counts."""
    calls: dict[int, list[tuple[KernelCall, KernelEffect]]] = {}
    sizes: dict[int, int] = {}
    fired: dict[str, int] = {}
    for call in trace.kernel_calls:
        effect = _RULES[call.op](call, capability)
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
            matches = [i for i, (_, size) in enumerate(live) if size == -delta]
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
