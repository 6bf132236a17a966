"""The TensorFlow trace of a Keras model's fit step (trace/tf/keras_graph.py) and the executor lifetime
model it is replayed with (trace/tf/lifetimes.py)."""

from __future__ import annotations

import pytest

from trainmem.errors import SetupError
from trainmem.setup import InputSpec, TrainingSetup
from trainmem.trace.events import Category, Phase
from trainmem.trace.tf.lifetimes import live_at, replay
from trainmem.trace.tf.ops import GraphOp, StepGraph, TensorInfo, VariableInfo

pytestmark = pytest.mark.tf  # Keras or TensorFlow: left out of `make check`, run by `make test`

F32 = "float32"


# ---- the lifetime rules on hand-made graphs (no TensorFlow) ------------------------------------------
def _op(name, kind, inputs=(), shape=(256, 100), phase=Phase.FORWARD, outputs=1):
    return GraphOp(name, kind, tuple((i, 0) if isinstance(i, str) else i for i in inputs),
                   tuple(TensorInfo(shape, F32) for _ in range(outputs)), phase, "layer")


def _graph(ops, variables=(), inputs=None):
    return StepGraph(list(ops), {v.name: v for v in variables}, inputs or {"x": TensorInfo((256, 100), F32)}, {})


def _events(result):
    return [(e.action, e.op, e.nbytes) for e in result.trace.events]


def test_a_tensor_is_freed_right_after_its_last_consumer():
    ops = [_op("a", "MatMul", ["x"]), _op("b", "MatMul", ["a"]), _op("c", "MatMul", ["b", "a"])]
    result = replay(_graph(ops))
    # storages: x 0, a 1, b 2, c 3. x dies at a; a and b die at c, after c's output is allocated; c has
    # no consumer and is dropped at once
    assert [(e.action, e.sid) for e in result.trace.events] == [
        ("alloc", 0), ("alloc", 1), ("free", 0), ("alloc", 2), ("alloc", 3), ("free", 2), ("free", 1), ("free", 3)]


def test_cwise_ops_forward_a_dying_input_and_only_a_dying_one():
    # Relu takes MatMul's buffer (its last consumer); Tanh cannot: `a` is still read by `d`
    ops = [_op("a", "MatMul", ["x"]), _op("r", "Relu", ["a"]), _op("t", "Tanh", ["r"]), _op("d", "MatMul", ["t", "r"])]
    result = replay(_graph(ops))
    allocs = [e.op for e in result.trace.events if e.action == "alloc"]
    assert allocs == ["IteratorGetNext", "MatMul", "Tanh", "MatMul"]


def test_forwarding_needs_the_other_consumers_ordered_before():
    # `s` is built after `u`, but no edge orders them: the executor may run `s` first, when `a` still has
    # two references (executor.cc ScheduleReady; op_kernel.cc forward_input), so `s` allocates
    ops = [_op("a", "MatMul", ["x"]), _op("u", "Sum", ["a"], shape=(100,)), _op("s", "Square", ["a"]),
           _op("d", "MatMul", ["s", "u"])]
    allocs = [e.op for e in replay(_graph(ops)).trace.events if e.action == "alloc"]
    assert allocs == ["IteratorGetNext", "MatMul", "Sum", "Square", "MatMul"]
    # when `s` also reads `u`, `u` must have run: `s` takes `a`'s buffer
    ops[2] = _op("s", "Mul", ["a", "u"])
    allocs = [e.op for e in replay(_graph(ops)).trace.events if e.action == "alloc"]
    assert allocs == ["IteratorGetNext", "MatMul", "Sum", "MatMul"]


def test_the_step_is_replayed_in_the_order_that_holds_more():
    pytest.importorskip("tensorflow")
    from trainmem.trace.tf.keras_graph import READY_ORDER, _replay_higher

    # built a, s, c: `a` dies at `s` before `c` exists; run first ready first, `c` comes before `s` and
    # x, a and c are alive at once (executor.cc ScheduleReady: a and c are both ready when x is)
    ops = [_op("a", "MatMul", ["x"]), _op("s", "Sum", ["a"], shape=(100,)), _op("c", "MatMul", ["x"]),
           _op("d", "MatMul", ["s", "c"], shape=(100,))]
    result, order = _replay_higher(_graph(ops), 1)
    assert order == READY_ORDER
    live = peak = 0
    for event in result.trace.events:
        live += event.nbytes if event.action == "alloc" else -event.nbytes
        peak = max(peak, live)
    assert peak == 3 * 256 * 100 * 4


def test_the_ready_order_keeps_program_order_on_a_variable():
    from trainmem.trace.tf.lifetimes import ready_order

    # fit's tf.function orders ops on one variable as written (auto_control_deps.py); the step's graph
    # has no such edge, so without it the second read would run first
    ops = [_op("r1", "ReadVariableOp", [("w", 0)]), _op("g", "Mul", ["r1", "x"]),
           GraphOp("upd", "AssignSubVariableOp", (("w", 0), ("g", 0)), (), Phase.OPTIMIZER, ""),
           _op("r2", "ReadVariableOp", [("w", 0)])]
    assert [op.name for op in ready_order(ops, {"w"})] == ["r1", "g", "upd", "r2"]
    assert [op.name for op in ready_order(ops)] == ["r1", "r2", "g", "upd"]


def test_a_read_variable_aliases_and_a_write_under_a_live_read_copies():
    var = VariableInfo("w", (256, 100), F32, Category.PARAMETERS, "layer")
    ops = [_op("read", "ReadVariableOp", [("w", 0)]), _op("m", "MatMul", ["x", "read"]),
           GraphOp("upd", "AssignSubVariableOp", (("w", 0), ("m", 0)), (), Phase.OPTIMIZER, ""),
           _op("late", "Neg", ["read"])]
    result = replay(_graph(ops, [var]))
    assert result.copy_on_write == 1  # `read` still holds the old buffer when the update runs
    copies = [r for r in result.trace.storages.values() if r.category == Category.PARAMETERS]
    assert len(copies) == 2 and all(r.nbytes == 102400 for r in copies)
    # without the late read, the update writes in place
    result = replay(_graph(ops[:3], [var]))
    assert result.copy_on_write == 0


def test_an_op_without_a_rule_is_traced_by_size_and_counted():
    ops = [_op("a", "MatMul", ["x"]), _op("f", "SomeCustomOp", ["a"], shape=(256, 7))]
    result = replay(_graph(ops))
    assert result.unsupported["SomeCustomOp"] == 1
    assert ("alloc", "SomeCustomOp", 256 * 7 * 4) in _events(result)


def test_forward_outputs_alive_when_backward_starts_are_activations():
    ops = [_op("a", "MatMul", ["x"]), _op("t", "MatMul", ["a"]), _op("u", "Neg", ["t"]),
           _op("l", "Sum", ["u"], shape=(), phase=Phase.LOSS), _op("g", "ReluGrad", ["l", "a"], phase=Phase.BACKWARD)]
    result = replay(_graph(ops))
    storages = result.trace.storages  # x 0, a 1, t 2 (Neg takes its buffer), l 3
    assert storages[1].category == Category.ACTIVATIONS  # `a` is read by the gradient
    assert storages[2].category == Category.TEMPORARIES  # t/u died in the loss
    seq = result.backward_start[0]
    assert all(r.category == Category.ACTIVATIONS for r in result.trace.storages.values()
               if r.sid in live_at(result.trace, seq) and r.phase == Phase.FORWARD)


# ---- real Keras models ----------------------------------------------------------------------------
def seed_mlp():
    import keras

    # named, so that the rows' names do not depend on how many Dense layers this process made before (Keras's
    # default names count per process: "dense", "dense_1", … in a fresh one only)
    layers = [keras.layers.Dense(100, activation="relu", name=f"dense_{i}") for i in range(4)]
    return keras.Sequential([keras.Input((1000,)), *layers, keras.layers.Dense(10, name="dense_4")])


@pytest.fixture(scope="module")
def seed():
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras")
    from trainmem.trace.tf.keras_graph import trace_keras

    return trace_keras(seed_mlp, TrainingSetup(batch_size=256), name="seed")


def test_seed_mlp_counts_parameters_and_adam_slots_exactly(seed):
    assert seed.parameters == seed.trainable_parameters == 131_410
    # adam.py build(): momentums and velocities per parameter (fp32); base_optimizer.py: `iterations`
    # (int64) and `learning_rate` (float32) scalars
    assert seed.framework.optimizer_slot_bytes == 2 * 4 * 131_410 + 8 + 4
    state = sum(r.nbytes for r in seed.trace.storages.values() if r.category == Category.OPTIMIZER_STATE)
    assert state == 2 * 4 * 131_410


def test_seed_mlp_keeps_each_hidden_relu_output_and_the_loss_gradient(seed):
    # MatMul's output is forwarded through BiasAdd into Relu (one buffer per layer); ReluGrad and the
    # next layer's weight gradient read it: 256×100 fp32 kept per hidden layer. The logits die in the
    # loss; SparseSoftmaxCrossEntropyWithLogits' backprop output (256×10) is kept for the gradient.
    rows = {row.name: row for row in seed.framework.layers}
    for name in ("dense_0", "dense_1", "dense_2", "dense_3"):
        assert rows[name].activation_bytes == 256 * 100 * 4
        assert rows[name].output_shape == (256, 100)
    assert rows["dense_4"].activation_bytes == 0
    loss = sum(r.nbytes for r in seed.trace.storages.values()
               if r.step == 0 and r.category == Category.ACTIVATIONS and r.module == "")
    assert 256 * 10 * 4 <= loss < 256 * 10 * 4 + 64  # and the loss's scalars the gradient reads
    assert seed.input_bytes == 256 * 1000 * 4 + 256 * 8  # x fp32, y int64 labels


def test_seed_mlp_lifetimes_end_at_the_last_use(seed):
    trace = seed.trace
    alloc = {e.sid: e.seq for e in trace.events if e.action == "alloc"}
    for event in trace.events:
        if event.action == "free":
            assert alloc[event.sid] <= event.seq
    # every step frees what it made: only variables (some in buffers an AssignVariableOp adopted) and
    # the Const kernels' tensors stay
    live = live_at(trace, len(trace.events))
    assert {trace.storages[sid].category for sid in live} <= {
        Category.PARAMETERS, Category.OPTIMIZER_STATE, Category.OPTIMIZER_SCALARS, Category.BUFFERS, Category.RUNTIME}
    assert not seed.framework.unsupported_ops
    assert any(call.op == "MatMul" for call in trace.kernel_calls)


def _trace(build, **setup):
    pytest.importorskip("tensorflow")
    from trainmem.trace.tf.keras_graph import trace_keras

    return trace_keras(build, TrainingSetup(**setup), name="test")


def test_conv_batchnorm_model():
    def build():
        import keras
        L = keras.layers
        return keras.Sequential([keras.Input((16, 16, 3)), L.Conv2D(8, 3, padding="same"), L.BatchNormalization(),
                                 L.ReLU(), L.Flatten(), L.Dense(10)])

    traced = _trace(build, batch_size=8)
    assert traced.parameters == (3 * 3 * 3 * 8 + 8) + 4 * 8 + (16 * 16 * 8 * 10 + 10)
    assert traced.trainable_parameters == traced.parameters - 2 * 8  # moving mean and variance
    buffers = sum(r.nbytes for r in traced.trace.storages.values() if r.category == Category.BUFFERS and r.phase == Phase.INIT)
    assert buffers >= 2 * 8 * 4
    # Grappler's remapper fuses Conv2D + BiasAdd on the CPU; the first layer needs no input gradient
    assert traced.framework.runtime_graph == "grappler"
    conv = [c for c in traced.trace.kernel_calls if "Conv2D" in c.op]
    assert {c.op for c in conv} == {"_FusedConv2D", "Conv2DBackpropFilter"}
    assert conv[0].outputs[0].shape == (8, 16, 16, 8) and conv[0].args[-1]["padding"] == "SAME"


def test_embedding_model_densifies_its_gradient():
    def build():
        import keras
        L = keras.layers
        return keras.Sequential([keras.Input((50,), dtype="int32"), L.Embedding(1000, 16),
                                 L.GlobalAveragePooling1D(), L.Dense(10)])

    traced = _trace(build, batch_size=4, inputs=(InputSpec((50,), "int32", 1000),))
    assert traced.parameters == 1000 * 16 + 16 * 10 + 10
    # keras optimizers turn the IndexedSlices gradient into a dense table (UnsortedSegmentSum)
    dense = [r for r in traced.trace.storages.values() if r.op == "UnsortedSegmentSum" and r.step == 0]
    assert dense and all(r.nbytes == 1000 * 16 * 4 for r in dense)
    # Adam squares the IndexedSlices values (keras/src/optimizers/adam.py update_step: ops.square of the
    # gradient) while the densifying UnsortedSegmentSum of the same values may not have run yet: a new
    # batch × 50 × 16 buffer, as TensorFlow's allocation records show (benchmarks/results/tf_tensor_peak.md)
    squares = [r for r in traced.trace.storages.values() if r.op == "Square" and r.step == 0]
    assert any(r.nbytes == 4 * 50 * 16 * 4 for r in squares)


def test_lstm_loop_accumulators_are_sized_from_the_loop_body():
    def build():
        import keras
        return keras.Sequential([keras.Input((20, 8)), keras.layers.LSTM(32, name="lstm"), keras.layers.Dense(10)])

    traced = _trace(build, batch_size=4)
    assert traced.parameters == 4 * (8 * 32 + 32 * 32 + 32) + 32 * 10 + 10
    assert traced.op_counts.get("While", 0) + traced.op_counts.get("StatelessWhile", 0) == 2
    assert "While" not in traced.framework.unsupported_ops and not any("unknown size" in w and "While" in w for w in traced.warnings)
    # the forward loop keeps, for the gradient loop, one 4×32 fp32 gate tensor per step per accumulator
    lists = [r.nbytes for r in traced.trace.storages.values() if r.op == "While" and r.dtype == "variant" and r.step == 0]
    assert lists.count(20 * 4 * 32 * 4) >= 6
    rows = {row.name: row for row in traced.framework.layers}
    assert rows["lstm"].activation_bytes >= 6 * 20 * 4 * 32 * 4
    # the loops' bodies and conditions are ops of their own executors, counted apart from the step's:
    # the forward body alone holds the cell's MatMuls, the gradient body theirs, each with an _Arg per loop var
    assert traced.framework.function_ops > 2 * 10


def test_a_step_without_functions_counts_no_function_ops(seed):
    assert seed.framework.function_ops == 0


def test_unsupported_setups_are_refused():
    with pytest.raises(SetupError, match="grad-accum"):
        _trace(seed_mlp, batch_size=4, grad_accum=2)
    with pytest.raises(SetupError, match="optimizer"):
        _trace(seed_mlp, batch_size=4, optimizer="adamw-8bit")
    with pytest.raises(SetupError, match="fp16-mixed"):
        _trace(seed_mlp, batch_size=4, precision="fp16-mixed")


def test_bf16_keeps_bf16_weights_and_slots():
    traced = _trace(seed_mlp, batch_size=8, precision="bf16")
    assert traced.parameters == 131_410
    assert traced.framework.optimizer_slot_bytes == 2 * 2 * 131_410 + 8 + 4  # Keras's "bfloat16" policy: bf16 variables


def _rss() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_a_large_model_is_traced_without_allocating_its_weights():
    def build():
        import keras
        return keras.Sequential([keras.Input((10_000,)), keras.layers.Dense(10_000), keras.layers.Dense(10)])

    _trace(seed_mlp, batch_size=2)  # TensorFlow and Keras loaded, their first-use allocations made
    before = _rss()
    traced = _trace(build, batch_size=2)
    grown = _rss() - before
    assert traced.parameters == 10_000 * 10_001 + 10 * 10_001
    weights = 4 * traced.parameters  # 400 MB; Adam's slots would add 800 MB
    assert grown < weights // 4, f"RSS grew by {grown:,} bytes while tracing a {weights:,}-byte model"
