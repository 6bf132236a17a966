"""TensorFlow's CPU kernel temporaries (targets/tf/cpu_kernel_rules.py) against TensorFlow's own records.

1. Per kernel: small graphs (one convolution, its loss and both gradients; a depthwise one; a max pool)
   run once in a tf.compat.v1 Session with RunOptions FULL_TRACE. Each node's allocation_records are the
   bytes it asked the CPU allocator for (default allocator: requested sizes, not chunks); its temporaries'
   peak = the running sum's peak minus the output's bytes. Beside it, the rule's peak for the same shapes.
2. Whole step: the allocator's peak growth over one Keras train_on_batch (TF_CPU_ALLOCATOR_USE_BFC=true,
   get_memory_info('CPU:0'), as benchmarks/tf_tensor_peak.py) against the traced step replayed through
   alloc/tf_bfc.py without and with the kernels' temporaries (tf_cpu_stream). Median of 3 fresh processes.

    .venv/bin/python benchmarks/tf_kernel_scratch.py      # writes benchmarks/results/tf_kernel_scratch.md
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import tf_tensor_peak  # noqa: E402

# (kind, batch, height, width, channels, kernel, out channels or depth multiplier, stride, padding)
KERNEL_CASES = [
    ("conv", 32, 16, 16, 32, 3, 64, 1, "SAME"),
    ("conv", 32, 32, 32, 3, 3, 32, 1, "SAME"),
    ("conv", 8, 64, 64, 16, 3, 32, 1, "SAME"),
    ("conv", 16, 28, 28, 8, 5, 16, 2, "VALID"),
    ("conv", 1, 32, 32, 16, 3, 16, 1, "SAME"),
    ("conv", 64, 8, 8, 64, 1, 128, 1, "SAME"),
    ("conv", 4, 7, 7, 512, 3, 512, 1, "SAME"),
    ("depthwise", 8, 16, 16, 13, 3, 1, 1, "SAME"),
    ("depthwise", 16, 32, 32, 12, 5, 2, 2, "VALID"),
    ("maxpool", 32, 32, 32, 32, 2, 0, 2, "VALID"),
    ("avgpool", 32, 32, 32, 32, 2, 0, 2, "VALID"),
    ("batchnorm", 32, 32, 32, 32, 0, 0, 1, ""),
    ("conv3d", 4, 16, 16, 8, 3, 16, 1, "SAME"),  # D = H = W
    ("conv3d", 2, 8, 8, 32, 3, 64, 1, "SAME"),
    ("conv3d", 1, 16, 16, 4, 3, 8, 1, "SAME"),
]


def run_case(case) -> dict:
    """In this process: one run of the case's graph; op type → (inputs' shapes, output shape, temp peak)."""
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    kind, n, h, w, c, k, o, s, pad = case
    shape = (n, h, h, w, c) if kind == "conv3d" else (n, h, w, c)
    with tf.Graph().as_default():
        x = tf1.placeholder(tf.float32, shape)
        if kind in ("maxpool", "avgpool"):
            y = (tf.nn.max_pool2d if kind == "maxpool" else tf.nn.avg_pool2d)(x, k, s, pad)
            grads = tf.gradients(tf.reduce_sum(y * y), [x])
        elif kind == "batchnorm":
            scale, offset = tf1.Variable(tf.ones(c)), tf1.Variable(tf.zeros(c))
            y = tf1.nn.fused_batch_norm(x, scale, offset, is_training=True)[0]
            grads = tf.gradients(tf.reduce_sum(y * y), [x, scale, offset])
        elif kind == "conv3d":
            f = tf1.Variable(tf1.random_normal((k, k, k, c, o)))
            y = tf.nn.conv3d(x, f, [1, s, s, s, 1], pad)
            grads = tf.gradients(tf.reduce_sum(y * y), [x, f])
        else:
            f = tf1.Variable(tf1.random_normal((k, k, c, o)))
            y = (tf.nn.conv2d(x, f, s, pad) if kind == "conv"
                 else tf.nn.depthwise_conv2d(x, f, [1, s, s, 1], pad))
            grads = tf.gradients(tf.reduce_sum(y * y), [x, f])
        session = tf1.Session()
        session.run(tf1.global_variables_initializer())
        meta = tf1.RunMetadata()
        session.run(grads, {x: np.random.rand(*shape).astype("float32")},
                    options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=meta)
        # every output's bytes where its shape is static (FusedBatchNormV3's reserve_space_3 is not: 4 B)
        outputs = {op.name: [t.dtype.size * int(np.prod(t.shape.as_list())) for t in op.outputs
                             if t.shape.is_fully_defined()] for op in tf1.get_default_graph().get_operations()}
    found = {}
    for device in meta.step_stats.dev_stats:
        for node in device.node_stats:
            op = node.timeline_label.split("= ")[1].split("(")[0] if "= " in node.timeline_label else ""
            records = [r.alloc_bytes for m in node.memory for r in m.allocation_records]
            if not op or not records:
                continue
            found[op] = {"records": records, "temp_total": node.memory_stats.temp_memory_size,
                         "temp_peak": _temp_peak(records, outputs.get(node.node_name, []))}
    return found


def _temp_peak(records: list[int], out_bytes: list[int]) -> int:
    """Peak of the node's records less its outputs' own records (outputs are not always first: MaxPoolGrad
    allocates its argmax before its output; an output forwarded from an input has no record)."""
    rest = [r for r in records if r > 0]
    output = 0
    for nbytes in out_bytes:
        if nbytes in rest:
            rest.remove(nbytes)
            output += nbytes
    live = peak = 0
    for delta in records:
        live += delta
        peak = max(peak, live)
    return peak - output


def rule_peaks(case, cpu) -> dict:
    """The rules' temporary peak per op for the case's shapes (KernelCalls built from the shapes)."""
    from trainmem.targets.tf.cpu_kernel_rules import kernel_scratch
    from trainmem.trace.events import KernelCall, TensorMeta

    kind, n, h, w, c, k, o, s, pad = case
    out = (lambda size: -(-size // s)) if pad == "SAME" else (lambda size: (size - k) // s + 1)
    meta = lambda shape: TensorMeta(tuple(shape), 4, "float32")  # noqa: E731
    x, attrs = meta((n, h, w, c)), {"data_format": "NHWC", "strides": [1, s, s, 1], "padding": pad}
    if kind in ("maxpool", "avgpool"):
        pooled = meta((n, out(h), out(w), c))
        calls = [KernelCall("MaxPool" if kind == "maxpool" else "AvgPool", 0, 1, (x, attrs), (pooled,), (None,)),
                 KernelCall("MaxPoolGrad" if kind == "maxpool" else "AvgPoolGrad", 0, 1, (x, pooled, pooled, attrs),
                            (x,), (None,))]
    elif kind == "batchnorm":
        vec = meta((c,))
        calls = [KernelCall("FusedBatchNormV3", 0, 1, (x, vec, vec, vec, vec, attrs), (x,), (None,)),
                 KernelCall("FusedBatchNormGradV3", 0, 1, (x, x, vec, vec, vec, vec, attrs), (x,), (None,))]
    elif kind == "conv3d":
        x, f, dy = meta((n, h, h, w, c)), meta((k, k, k, c, o)), meta((n, out(h), out(h), out(w), o))
        calls = [KernelCall("Conv3D", 0, 1, (x, f, attrs), (dy,), (None,)),
                 KernelCall("Conv3DBackpropInputV2", 0, 1, (meta((5,)), f, dy, attrs), (x,), (None,)),
                 KernelCall("Conv3DBackpropFilterV2", 0, 1, (x, meta((5,)), dy, attrs), (f,), (None,))]
    else:
        depth = o if kind == "conv" else c * o
        f, dy = meta((k, k, c, o)), meta((n, out(h), out(w), depth))
        prefix = "Conv2D" if kind == "conv" else "DepthwiseConv2dNative"
        calls = [KernelCall(prefix if kind != "conv" else "Conv2D", 0, 1, (x, f, attrs), (dy,), (None,)),
                 KernelCall(prefix + "BackpropInput", 0, 1, (meta((4,)), f, dy, attrs), (x,), (None,)),
                 KernelCall(prefix + "BackpropFilter", 0, 1, (x, meta((4,)), dy, attrs), (f,), (None,))]
    peaks = {}
    for call in calls:
        effect = kernel_scratch(call, cpu)
        live = peak = 0
        for delta in effect.after if effect else ():
            live += delta
            peak = max(peak, live)
        peaks[call.op] = peak
    return peaks


def conv_strided():
    import keras
    L = keras.layers
    return keras.Sequential([keras.Input((28, 28, 8)), L.Conv2D(16, 5, strides=2), L.ReLU(),
                             L.Conv2D(32, 3, padding="same"), L.ReLU(), L.Flatten(), L.Dense(10)])


def depthwise():
    import keras
    L = keras.layers
    return keras.Sequential([keras.Input((32, 32, 12)), L.DepthwiseConv2D(5, strides=2, depth_multiplier=2), L.ReLU(),
                             L.Conv2D(32, 1), L.GlobalAveragePooling2D(), L.Dense(10)])


STEP_MODELS = {  # name → (builder, batch)
    "cnn": (tf_tensor_peak.cnn_bn, 32),
    "cnn@64": (tf_tensor_peak.cnn_bn, 64),
    "conv_strided": (conv_strided, 16),
    "depthwise": (depthwise, 16),
    "mlp": (tf_tensor_peak.seed_mlp, 256),
}


def measure_step(name: str) -> dict:
    """In this process (TF_CPU_ALLOCATOR_USE_BFC=true): one train_on_batch's allocator growth."""
    import keras
    import numpy as np
    import tensorflow as tf

    builder, batch = STEP_MODELS[name]
    model = builder()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    x = tf.constant(np.random.rand(batch, *model.inputs[0].shape[1:]).astype("float32"))
    y = tf.constant(np.random.randint(0, 10, (batch,)).astype("int64"))
    model.train_on_batch(x, y)
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    model.train_on_batch(x, y)
    return {"growth": tf.config.experimental.get_memory_info("CPU:0")["peak"] - before}


def traced_step(name: str) -> dict:
    """The traced step's growth through the BFC model, without and with the kernels' temporaries."""
    from trainmem.alloc.tf_bfc import BfcConfig, replay_bfc
    from trainmem.setup import TrainingSetup
    from trainmem.targets.tf.cpu_kernel_rules import tf_cpu_device_stream
    from trainmem.trace.events import Phase
    from trainmem.trace.tf.keras_graph import trace_keras

    builder, batch = STEP_MODELS[name]
    trace = trace_keras(builder, TrainingSetup(steps=2, batch_size=batch), name=name).trace
    with_scratch = tf_cpu_device_stream(trace)
    plain = [e for e in with_scratch.events if e.key >= 0]
    out = {"rules": with_scratch.rules, "gaps": list(with_scratch.gaps)}
    for label, events in (("before", plain), ("after", with_scratch.events)):
        start = next(i for i, e in enumerate(events) if e.step == 1 and e.phase == Phase.INPUTS)
        base = sum(e.nbytes if e.action == "alloc" else -e.nbytes for e in events[:start + 1])
        out[label] = replay_bfc(events, BfcConfig(memory_limit=64 << 30, allow_growth=True)).peak_in_use - base
    return out


def _child(args: list[str]) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if args[0] == "--step":
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def kernel_table(cpu) -> list[str]:
    lines = ["| case (N,H,W,C k→O/mult stride pad) | op | TF allocate_temp total | TF temp peak (records) | rule "
             "| rule / TF peak |", "|---|---|---|---|---|---|"]
    for case in KERNEL_CASES:
        found = _child(["--case", json.dumps(case)])
        for op, mine in rule_peaks(case, cpu).items():
            real, total = found.get(op, {}).get("temp_peak"), found.get(op, {}).get("temp_total", "")
            ratio = "—" if not real else f"{mine / real:.3f}"
            ratio = "exact" if real == mine else ratio
            lines.append(f"| {case[0]} {case[1:5]} k{case[5]}→{case[6]} s{case[7]} {case[8]} | {op} | "
                         f"{_n(total)} | {_n(real)} | {mine:,} | {ratio} |")
    return lines


def _n(value) -> str:
    return f"{value:,}" if isinstance(value, int) else "no record"


def step_table() -> list[str]:
    lines = ["| model | batch | TF BFC growth (median of 3, range) | trace → BFC model, before | after (with "
             "temporaries) | before / TF | after / TF |", "|---|---|---|---|---|---|---|"]
    for name, (_, batch) in STEP_MODELS.items():
        runs = sorted(_child(["--step", name])["growth"] for _ in range(3))
        mine = traced_step(name)
        lines.append(f"| {name} | {batch} | {runs[1]:,} ({runs[0]:,}–{runs[2]:,}) | {mine['before']:,} | "
                     f"{mine['after']:,} | {mine['before'] / runs[1]:.3f} | {mine['after'] / runs[1]:.3f} |")
        if mine["gaps"]:
            lines.append(f"|  | gaps: {'; '.join(mine['gaps'])} | | | | | |")
    return lines


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        print(json.dumps(run_case(tuple(json.loads(sys.argv[2])))))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--step":
        print(json.dumps(measure_step(sys.argv[2])))
        return
    from trainmem.targets.tf.cpu_kernel_rules import cpu_facts

    cpu = cpu_facts()
    parts = sys.argv[1:] or ["kernels", "steps"]
    text = [f"machine: {cpu}"]
    if "kernels" in parts:
        text += ["", "## Per kernel (default allocator, RunMetadata allocation_records)", ""] + kernel_table(cpu)
    if "steps" in parts:
        text += ["", "## Whole step (TF_CPU_ALLOCATOR_USE_BFC=true, peak − current before the step)", ""]
        text += step_table()
    print("\n".join(text))
    if parts == ["kernels", "steps"]:
        RESULTS.write_text(render("\n".join(text)))


RESULTS = Path(__file__).parent / "results" / "tf_kernel_scratch.md"


def render(body: str) -> str:
    """The results file: what was run, the tables, and what they say (NOTES)."""
    return ("# TensorFlow CPU kernel temporaries: rules vs TensorFlow's records\n\n"
            "`.venv/bin/python benchmarks/tf_kernel_scratch.py` (tensorflow-cpu 2.21, Keras 3.15.1, oneDNN off: "
            "AVX2-only AMD EPYC, 2 cores). Rules: src/trainmem/targets/tf/cpu_kernel_rules.py.\n\n" + body + "\n\n"
            + NOTES)


NOTES = """## Reading the tables

- Per kernel: the default CPU allocator's records are the requested bytes; "TF temp peak" is the running
  sum's peak minus the outputs' own records. Every convolution gradient (2-D and 3-D) is exact. The depthwise
  kernels' per-shard buffers are counted for num_threads + 1 shards at once (work_sharder.cc Shard: the
  workers and the caller); TensorFlow ran at most 2 here, so the rule is high by one small buffer (KBs).
  MaxPoolGrad counts a copy of the pool's output (forward_input_or_allocate_temp): in this small graph the
  pool output had no other holder and was forwarded (no record), in the Keras CNN it was copied.
- Whole step: "before" is the trace alone, "after" adds the kernels' temporaries, both replayed through
  alloc/tf_bfc.py like the CPU BFC allocator TF_CPU_ALLOCATOR_USE_BFC turns on. A convolution's input- and
  filter-gradient kernels wait on the same output gradient and run at once on the 2 inter-op threads
  (executor.cc ScheduleReady), so both col buffers are live together (cnn: two 32 MiB chunks; TF median 67.9 MB).
  Whether they overlap in a real run is a race: for the depthwise model's small 1x1 convolution they did
  in 1 of 6 processes over two runs of this script (34,514,432 B; the other five 17.7–18.0 MB), and the
  cnn's low runs (53.8–55.7 MB) are steps where they did not; the stream always overlaps them (never low),
  so the depthwise row is 1.96x TensorFlow's median and 1.01x the overlapped run.
- FusedBatchNormV3's 4 B is its reserve_space_3 output, whose static shape is unknown (not a temporary).
- The MLP has no kernel temporaries through the allocator (its MatMuls' Eigen packing buffers are Eigen's
  own aligned_malloc; RunMetadata of a 5-layer MLP step shows only SparseSoftmaxCrossEntropyWithLogits'
  1,024-B scratch, an op the trace does not record as a kernel call). Its remaining gap is not temporaries.
"""


if __name__ == "__main__":
    main()
