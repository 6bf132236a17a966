"""TensorFlow CPU kernel temporaries (targets/tf/cpu_kernel_rules.py): sizes derived by hand from the kernels'
source, the stream they make, and one real run's allocation records."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainmem.targets.tf.cpu_kernel_rules import CpuFacts, cpu_facts, kernel_scratch, tf_cpu_device_stream
from trainmem.trace.events import Category, Event, KernelCall, Phase, StorageRecord, TensorMeta, Trace

pytestmark = pytest.mark.tf  # Keras or TensorFlow: left out of `make check`, run by `make test`

TWO = CpuFacts(num_threads=2, inter_op_threads=2)
ATTRS = {"strides": [1, 1, 1, 1], "padding": "SAME", "data_format": "NHWC", "dilations": [1, 1, 1, 1]}


def meta(*shape, key=0):
    return TensorMeta(tuple(shape), 4, "float32", storage_key=key)


def grad_calls(n, h, w, c, k, o, key=7):
    x, f, dy = meta(n, h, w, c), meta(k, k, c, o), meta(n, h, w, o, key=key)
    return (KernelCall("Conv2DBackpropInput", 0, 1, (meta(4), f, dy, ATTRS), (x,), (None,)),
            KernelCall("Conv2DBackpropFilter", 0, 1, (x, meta(4), dy, ATTRS), (f,), (None,)))


def test_filter_col_buffer_by_hand():
    # conv_grad_filter_ops.cc: 32x16x16x32 -> 64, 3x3 SAME. OIS = 256, FTS = 3*3*32 = 288;
    # work_unit = 256*288 + 256*64 + 288*64 = 73,728 + 16,384 + 18,432 = 108,544;
    # shard = ceil((30 << 20) / 4 / 108,544) = ceil(7,864,320 / 108,544) = ceil(72.45) = 73;
    # col_buffer = 73 * 256 * 288 * 4 B = 21,528,576 B (TF's record: 21,528,576, benchmarks/tf_kernel_scratch.py)
    effect = kernel_scratch(grad_calls(32, 16, 16, 32, 3, 64)[1], TWO)
    assert effect.after == (21_528_576, -21_528_576)


def test_input_col_buffer_parallel_or_sharded_by_hand():
    # conv_grad_input_ops.h: 8x64x64x16 -> 32, 3x3 SAME. OIS = 4096, FTS = 144;
    # work_unit = 4096*32 + 144*32 + 4096*144 = 131,072 + 4,608 + 589,824 = 725,504.
    # 2 threads: 725,504 // 2 = 362,752 >= (256 KiB)/4 = 65,536 -> parallel contraction, one image:
    #   4096 * 144 * 4 = 2,359,296 B.  16 threads: 45,344 < 65,536 -> shard = ceil(7,864,320 / 725,504) = 11:
    #   11 * 4096 * 144 * 4 = 25,952,256 B.
    call = grad_calls(8, 64, 64, 16, 3, 32)[0]
    assert kernel_scratch(call, TWO).after == (2_359_296, -2_359_296)
    assert kernel_scratch(call, CpuFacts(16, 16)).after == (25_952_256, -25_952_256)
    # batch 1 is always the parallel path: 32x32 image, 16 -> 16: 1024 * 144 * 4 = 589,824 B
    assert kernel_scratch(grad_calls(1, 32, 32, 16, 3, 16)[0], CpuFacts(64, 64)).after == (589_824, -589_824)


def test_max_pool_grad_copy_and_argmax():
    # maxpooling_op.cc MaxPoolingGradOp: pool output 32x16x16x32 = 262,144 elements: copy 4 B each, argmax 8 B each
    pooled = meta(32, 16, 16, 32)
    call = KernelCall("MaxPoolGrad", 0, 1, (meta(32, 32, 32, 32), pooled, pooled, {}), (meta(32, 32, 32, 32),), (None,))
    assert kernel_scratch(call, TWO).after == (1_048_576, 2_097_152, -2_097_152, -1_048_576)


def _trace_with(calls):
    trace = Trace()
    for seq, call in enumerate(calls):
        sid = seq + 1
        trace.storages[sid] = StorageRecord(sid, 100, Category.GRADIENTS, Phase.BACKWARD, "conv", call.op, 0)
        trace.events.append(Event(seq, "alloc", 100, sid, Phase.BACKWARD, "conv", call.op, 0))
        trace.kernel_calls.append(dataclasses_replace(call, seq))
    return trace


def dataclasses_replace(call, seq):
    import dataclasses
    return dataclasses.replace(call, at_seq=seq)


def _peak(events):
    live = peak = 0
    for event in events:
        live += event.nbytes if event.action == "alloc" else -event.nbytes
        peak = max(peak, live)
    return peak


def test_stream_overlaps_a_convolutions_two_gradients_and_reports_gaps():
    # both gradients read out_backprop storage 7: with 2 inter-op threads both col buffers are live at once
    unknown = KernelCall("FancyConv", 0, 1, ({},), (None,), (None,))
    trace = _trace_with([*grad_calls(32, 16, 16, 32, 3, 64), unknown])
    overlapped = tf_cpu_device_stream(trace, TWO)
    assert _peak(overlapped.events) == 200 + 2 * 21_528_576  # the third output comes after both frees
    serial = tf_cpu_device_stream(trace, CpuFacts(2, 1))
    assert _peak(serial.events) == 200 + 21_528_576
    assert overlapped.gaps == ("FancyConv ×1: temporaries not sized",)
    assert [e.key for e in overlapped.events if e.key > 0] == [1, 2, 3]  # the trace's events all kept, in order
    assert tf_cpu_device_stream(trace, TWO, onednn=True).gaps[0].startswith("Conv2DBackpropFilter")


REAL_RUN = """
import json, numpy as np, tensorflow as tf
tf1 = tf.compat.v1; tf1.disable_eager_execution()
x = tf1.placeholder(tf.float32, (8, 16, 16, 8)); f = tf1.Variable(tf1.random_normal((3, 3, 8, 16)))
y = tf.nn.conv2d(x, f, 1, "SAME"); grads = tf.gradients(tf.reduce_sum(y * y), [x, f])
s = tf1.Session(); s.run(tf1.global_variables_initializer()); md = tf1.RunMetadata()
s.run(grads, {x: np.ones((8, 16, 16, 8), "float32")}, options=tf1.RunOptions(trace_level=3), run_metadata=md)
out = {}
for d in md.step_stats.dev_stats:
    for n in d.node_stats:
        op = n.timeline_label.split("= ")[1].split("(")[0] if "= " in n.timeline_label else ""
        if op.startswith("Conv2DBackprop"):
            out[op] = [r.alloc_bytes for m in n.memory for r in m.allocation_records]
print(json.dumps(out))
"""


def test_real_run_allocation_records_agree():
    pytest.importorskip("tensorflow")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CPU_ALLOCATOR_USE_BFC", None)  # the default allocator records requested bytes, not chunks
    # The kernels checked are TensorFlow's own (Eigen) ones. On a CPU where util.cc turns oneDNN on by
    # default (avx512_vnni, avx512_bf16, amx, ...) the graph rewrite swaps them for _MklConv2DBackprop*,
    # which the model reports as gaps (test above), so the real run turns oneDNN off to run them here too.
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    run = subprocess.run([sys.executable, "-c", REAL_RUN], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    records = json.loads(run.stdout.strip().splitlines()[-1])
    cpu = cpu_facts()
    for call in grad_calls(8, 16, 16, 8, 3, 16):
        # records: the output, then the col buffer, then its free
        expected = kernel_scratch(call, cpu).after[0]
        assert records[call.op][1:] == [expected, -expected], (call.op, records[call.op], expected)


def conv3d_calls(n, d, c, k, o):
    x, f, dy = meta(n, d, d, d, c), meta(k, k, k, c, o), meta(n, d, d, d, o)
    return (KernelCall("Conv3DBackpropInputV2", 0, 1, (meta(5), f, dy, ATTRS), (x,), (None,)),
            KernelCall("Conv3DBackpropFilterV2", 0, 1, (x, meta(5), dy, ATTRS), (f,), (None,)))


def test_conv3d_col_buffer_or_eigen_fallback_by_hand():
    # conv_grad_ops_3d.cc, 4x16^3x8 -> 16, 3x3x3 SAME: OIS = 4096, FTS = 27*8 = 216;
    # work_unit = 4096*16 + 216*16 + 4096*216 = 65,536 + 3,456 + 884,736 = 953,728;
    # all tensors: 4*4096*8 + 3456 + 4*4096*16 = 131,072 + 3,456 + 262,144 = 396,672 elements.
    # L3 32 MiB: shard = ceil(8,388,608 / 953,728) = 9; col = 9*4096*216 = 7,962,624 elements;
    #   7,962,624 // 396,672 = 20 <= 25 -> col buffer 31,850,496 B (both kernels: the input one is not batch 1).
    # L3 256 MiB: shard = ceil(67,108,864 / 953,728) = 71 -> overhead 158 > 25 -> Eigen fallback, nothing
    #   (what TensorFlow did here: its records show no temporary; glibc's sysconf says 256 MiB).
    small, large = CpuFacts(2, 2, l3_bytes=32 << 20), CpuFacts(2, 2, l3_bytes=256 << 20)
    for call in conv3d_calls(4, 16, 8, 3, 16):
        assert kernel_scratch(call, small).after == (31_850_496, -31_850_496)
        assert kernel_scratch(call, large).after == ()
    # batch 1: the input kernel's col buffer is one image: 4096 * (27*4) * 4 B = 1,769,472 B (TF's record)
    assert kernel_scratch(conv3d_calls(1, 16, 4, 3, 8)[0], large).after == (1_769_472, -1_769_472)
    assert kernel_scratch(conv3d_calls(1, 16, 4, 3, 8)[0], CpuFacts(2, 2)).after == ()  # L3 unknown: unsized


def test_batch_norm_grad_scratch():
    # fused_batch_norm_op.cc FusedBatchNormGrad<CPUDevice>: {depth} float scratch; {rest, depth} more for bf16
    x32, vec = meta(32, 8, 8, 16), meta(16)
    call = KernelCall("FusedBatchNormGradV3", 0, 1, (x32, x32, vec, vec, vec, vec, {}), (x32,), (None,))
    assert kernel_scratch(call, TWO).after == (64, -64)
    x16 = TensorMeta((32, 8, 8, 16), 2, "bfloat16")
    call16 = KernelCall("FusedBatchNormGradV3", 0, 1, (x16, x16, vec, vec, vec, vec, {}), (x16,), (None,))
    assert kernel_scratch(call16, TWO).after == (64, 32 * 8 * 8 * 16 * 4, -32 * 8 * 8 * 16 * 4, -64)


def test_call_without_shapes_is_a_gap_not_a_crash():
    call = KernelCall("DepthwiseConv2dNativeBackpropFilter", 0, 1, (meta(8, 16, 16, 4), meta(4), meta(8, 16, 16, 4), {}),
                      (None,), (None,))
    assert kernel_scratch(call, TWO) is None
    assert tf_cpu_device_stream(_trace_with([call]), TWO).gaps == (
        "DepthwiseConv2dNativeBackpropFilter ×1: temporaries not sized",)
