"""TensorFlow's GPU figures (targets/tf/gpu_memory.py) on hand-built traces: the default memory limit derived by hand
from gpu_device.cc MinSystemMemory, the three memory modes, cuDNN's autotuning scratch, and OOM. No
TensorFlow needed: the step is a Trace built here, as trace/tf/keras_graph.py would record it."""

from types import SimpleNamespace

import pytest

from trainmem.devices import get_device
from trainmem.errors import SetupError
from trainmem.targets.tf.gpu_memory import default_memory_limit, min_system_memory, parse_mode, tf_gpu_figures
from trainmem.trace.events import Category, Event, KernelCall, Phase, StorageRecord, TensorMeta, Trace

pytestmark = pytest.mark.tf  # Keras or TensorFlow: left out of `make check`, run by `make test`

MiB, GiB = 1 << 20, 1 << 30
CONTEXT = 256 * MiB  # targets/cuda_runtime.py CONTEXT_FACTS: CUDA 12, lazy loading (TF 2.21 is built on 12.5)


def test_min_system_memory_by_compute_capability():
    # gpu_device.cc MinSystemMemory: < 2 GiB available -> 225 MiB; else 500 / 1050 / 1536 / 1800 MiB for
    # cc major <= 6 / 7 / 8 / newer.
    assert min_system_memory(2 * GiB - 1, 9) == 225 * MiB
    assert [min_system_memory(8 * GiB, cc) for cc in (6, 7, 8, 9, 12)] == [
        500 * MiB, 1050 * MiB, 1536 * MiB, 1800 * MiB, 1800 * MiB]


@pytest.mark.parametrize("name, limit_mib", [
    ("a100-80gb", 81920 - 256 - 1536),  # nvidia-smi 81920 MiB, less the context: 81664 MiB available, cc 8.0
    ("h100-80gb", 81559 - 256 - 1800),  # 81559 MiB, 81303 available, cc 9.0: 1800 MiB kept
    ("custom:capacity=8GiB,cc=7.5", 8192 - 256 - 1050),  # an 8 GB Turing card: 7936 available, 1050 kept
    ("custom:capacity=2GiB,cc=6.1", 2048 - 256 - 225),  # 1792 MiB available < 2 GiB: 225 MiB kept
])
def test_default_memory_limit(name, limit_mib):
    limit = default_memory_limit(get_device(name), CONTEXT)
    assert limit.limit == limit_mib * MiB
    assert limit.available - limit.limit == limit.reserve


def test_memory_limit_overrides():
    a100 = get_device("a100-80gb")
    # TF_DEVICE_MIN_SYS_MEMORY_IN_MB=500: available 81664 MiB - 500 MiB
    assert default_memory_limit(a100, CONTEXT, min_sys_memory_mb=500).limit == (81664 - 500) * MiB
    # per_process_gpu_memory_fraction 0.5 of the total (81920 MiB): 40960 MiB, the context not subtracted
    assert default_memory_limit(a100, CONTEXT, fraction=0.5).limit == 40960 * MiB


def test_modes_parse_and_refuse():
    assert parse_mode("default") == ("default", None) and parse_mode(" Growth ") == ("growth", None)
    assert parse_mode("limit:4GiB") == ("limit", 4 * GiB) and parse_mode("fraction:0.5") == ("fraction", 0.5)
    for bad in ("grow", "limit:", "limit:lots", "fraction:1.5", "fraction:0"):
        with pytest.raises(SetupError, match="--tf-memory"):
            parse_mode(bad)


def _trace(conv: bool = False) -> SimpleNamespace:
    """w (parameters) 1,000 B, x (inputs) 4,096 B, a (activations) 3 MiB, g (gradients) 1,000 B; a and x are
    freed at the end. With `conv`, y = Conv2D(x, w) replaces a: x [8,32,32,3], w [3,3,3,16], y [8,32,32,16]."""
    sizes = {1: (1000, Category.PARAMETERS, Phase.INIT), 2: (4096, Category.INPUTS, Phase.INPUTS),
             3: (3 * MiB, Category.ACTIVATIONS, Phase.FORWARD), 4: (1000, Category.GRADIENTS, Phase.BACKWARD)}
    order = [("alloc", 1), ("alloc", 2), ("alloc", 3), ("alloc", 4), ("free", 3), ("free", 2)]
    calls = []
    if conv:
        x, w, y = (TensorMeta(s, 4, "float32") for s in ((8, 32, 32, 3), (3, 3, 3, 16), (8, 32, 32, 16)))
        sizes = {1: (1728, Category.PARAMETERS, Phase.INIT), 2: (98304, Category.INPUTS, Phase.INPUTS),
                 3: (524288, Category.ACTIVATIONS, Phase.FORWARD)}
        order = [("alloc", 1), ("alloc", 2), ("alloc", 3), ("free", 2)]
        calls = [KernelCall("Conv2D", 2, 1, (x, w, {}), (y,), (3,))]
    trace = Trace(kernel_calls=calls)
    for sid, (nbytes, category, phase) in sizes.items():
        trace.storages[sid] = StorageRecord(sid, nbytes, category, phase, "dense", "Op", 0)
    for seq, (action, sid) in enumerate(order):
        nbytes, _category, phase = sizes[sid]
        trace.events.append(Event(seq, action, nbytes, sid, phase, "dense", "Conv2D" if sid == 3 else "Op", 0))
    return SimpleNamespace(trace=trace, framework=SimpleNamespace(jit_compile_on_gpu=False))


CARD = "custom:capacity=8GiB,cc=7.5"  # limit 6886 MiB by default (test_default_memory_limit)


def test_growth_mode():
    # Stream: Eigen's scratch 1,028 B -> 1,280 B chunk in the first 2 MiB region (split, next region 4 MiB);
    # w 1,000 -> 1,024 and x 4,096 split the free rest; a 3 MiB fits no free chunk: a 4 MiB region, kept
    # whole (4 < 6 MiB, 1 MiB < 128 MiB); g 1,024 from region 1. Peak in use after g:
    # 1,280 + 1,024 + 4,096 + 4 MiB + 1,024 = 4,201,728 B; regions 2 + 4 MiB.
    f = tf_gpu_figures(_trace(), get_device(CARD), "growth")
    assert f.peak_in_use == 4_201_728 and f.region_bytes == 6 * MiB
    assert f.replay.region_history == (2 * MiB, 4 * MiB)
    assert f.live_at_peak == {Category.RUNTIME: 1280, Category.PARAMETERS: 1024, Category.INPUTS: 4096,
                              Category.ACTIVATIONS: 4 * MiB, Category.GRADIENTS: 1024}
    assert f.process_bytes == CONTEXT + 6 * MiB and f.parts == {"CUDA context": CONTEXT, "BFC regions": 6 * MiB}
    assert f.fits and f.memory_limit == 6886 * MiB
    assert len(f.explanation) == 3


def test_default_mode_maps_the_whole_limit():
    # one region of the 6886 MiB limit at the first allocation (Eigen's scratch): every request splits it,
    # so a costs exactly 3 MiB: 1,280 + 1,024 + 4,096 + 3 MiB + 1,024 = 3,153,152 B in use at the peak.
    f = tf_gpu_figures(_trace(), get_device(CARD), "default")
    assert f.peak_in_use == 3_153_152
    assert f.region_bytes == 6886 * MiB and f.process_bytes == CONTEXT + 6886 * MiB
    assert f.process_bytes_high == 426 * MiB + 6886 * MiB  # the context's high figure (cuda_runtime.py)


def test_limit_mode_takes_whole_mib():
    f = tf_gpu_figures(_trace(), get_device(CARD), "limit:1GiB")
    assert (f.memory_limit, f.region_bytes, f.peak_in_use) == (GiB, GiB, 3_153_152)
    assert f.process_bytes == CONTEXT + GiB
    # memory_limit is in whole MB: 1000 MB = 1e9 B -> 953 MiB (static_cast<int64>(mb) * (1 << 20))
    assert tf_gpu_figures(_trace(), get_device(CARD), "limit:1GB").memory_limit == 953 * MiB


def test_out_of_memory_when_the_step_exceeds_the_limit():
    # limit 2 MiB: Eigen's scratch maps one 2 MiB region; w and x fit; a (3 MiB) exceeds the limit.
    f = tf_gpu_figures(_trace(), get_device(CARD), "limit:2MiB")
    assert not f.fits and "3,145,728 B for op Conv2D in dense (forward, activations)" in f.out_of_memory
    # on a card large enough the step needs 3,153,152 B (the default-mode figure above)
    assert f.needed_in_use == 3_153_152


def test_conv_autotune_scratch():
    # limit 1 GiB, every request split. First Conv2D call autotunes: an output copy y + 2 x 8 MiB redzones
    # = 524,288 + 16,777,216 = 17,301,504 B held while the explicit-GEMM candidate's workspace plus
    # redzones is allocated: im2col 27 rows (3*3*3) x 8,192 columns (8*32*32 positions) x 4 B = 884,736 B,
    # + 16 MiB = 17,661,952 B. Peak: 1,280 + 1,792 (w) + 98,304 (x) + 524,288 (y) + both = 35,589,120 B.
    f = tf_gpu_figures(_trace(conv=True), get_device(CARD), "limit:1GiB")
    assert f.peak_in_use == 35_589_120
    assert f.live_at_peak[Category.RUNTIME] == 1280 + 17_301_504 + 17_661_952
    # high: each candidate may ask for the 4 GiB TF_CUDNN_WORKSPACE_LIMIT_IN_MB cap, more than the 1 GiB
    # limit holds: such a request fails harmlessly, and the workspace may take all that is left -> the limit
    assert f.peak_in_use_high == GiB and f.fits


def test_backprop_filter_autotune_shadows_the_filter_gradient():
    # Conv2DBackpropFilter(x, filter_sizes, dy) -> dw [3,3,3,16] (1,728 B): autotuning shadows dw, not dy:
    # 1,728 + 16 MiB = 16,778,944 -> 16,779,008 B (256-B rounding); the explicit-GEMM workspace is the same
    # im2col matrix, 884,736 + 16 MiB = 17,661,952 B.
    traced = _trace(conv=True)
    x, w, y = traced.trace.kernel_calls[0].args[0], traced.trace.kernel_calls[0].args[1], TensorMeta(
        (8, 32, 32, 16), 4, "float32")
    sizes = TensorMeta((4,), 4, "int32")
    traced.trace.kernel_calls[0] = KernelCall("Conv2DBackpropFilter", 2, 1, (x, sizes, y, {}), (w,), (3,))
    f = tf_gpu_figures(traced, get_device(CARD), "limit:1GiB")
    assert f.live_at_peak[Category.RUNTIME] == 1280 + 16_779_008 + 17_661_952


def test_seed_mlp_traced_by_tensorflow():
    # The seed MLP 1000-100x4-10, batch 256, Adam, traced on TensorFlow's graph (needs the extra): its
    # 131,410 fp32 weights (525,640 B) and Adam's two slots (1,051,280 B) are in use at the peak, each
    # tensor in a chunk of at least its 256-B rounding; the chunks at the peak sum to get_memory_info's peak.
    pytest.importorskip("tensorflow")
    keras_graph = pytest.importorskip("trainmem.trace.tf.keras_graph")
    from trainmem.frontends.keras.imports import import_keras
    from trainmem.setup import TrainingSetup

    keras = import_keras()

    def build():
        dense = [keras.layers.Dense(100, activation="relu") for _ in range(4)]
        return keras.Sequential([keras.Input((1000,)), *dense, keras.layers.Dense(10)])

    traced = keras_graph.trace_keras(build, TrainingSetup(batch_size=256), name="seed")
    f = tf_gpu_figures(traced, get_device("a100-80gb"), "growth")
    assert sum(f.live_at_peak.values()) == f.peak_in_use and f.fits
    assert f.live_at_peak[Category.PARAMETERS] >= 525_640
    assert f.live_at_peak[Category.OPTIMIZER_STATE] >= 2 * 525_640
    assert f.region_bytes >= f.peak_in_use and f.process_bytes == CONTEXT + f.region_bytes
    default = tf_gpu_figures(traced, get_device("a100-80gb"), "default")
    assert default.region_bytes == default.memory_limit == (81920 - 256 - 1536) * MiB
